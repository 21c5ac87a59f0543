"""Model families: GPT-2 (headprune.model) and the decoders of :mod:`.families` (Llama, Mistral, Qwen2, Qwen3,
GPT-NeoX), all with the per-head interface of :class:`.base.HeadModel`."""
