"""Models and what acts on their heads: the families of :mod:`.families` (GPT-2, Llama, Mistral, Qwen2, Qwen3, Gemma 3,
GPT-NeoX), one module each behind one per-head interface (:class:`.base.HeadModel`); head ids, gates and fills,
value-bias folding, physical pruning and the parameter ledger."""
