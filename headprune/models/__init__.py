"""Models and what acts on their heads: GPT-2 (:mod:`.gpt2`) and the decoders of :mod:`.families` (Llama, Mistral,
Qwen2, Qwen3, GPT-NeoX) with the same per-head interface (:class:`.base.HeadModel`); head ids, gates and fills,
value-bias folding and the parameter ledger."""
