"""Writing models: the pruned model as a native or transformers folder, atomically."""
