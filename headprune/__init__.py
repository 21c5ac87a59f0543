"""headprune: which attention heads of a GPT-2 model matter, and what pruning the rest costs."""

__version__ = "0.1.0"
