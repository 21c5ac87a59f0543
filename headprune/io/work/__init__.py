"""Running work: atomic files and tables, resumable progress, worker processes and torchrun."""
