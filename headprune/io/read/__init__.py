"""Reading models: every family from folders, safetensors, GGUF files, the package index and memory."""
