"""The GGUF export's tensor types, without torch (the command line lists them in ``--help``).

The default, ``q8_0``: llama.cpp's common 8-bit type, a quarter of f32's size and half of f16's, at a small measured
cost: SmolLM2 in llama.cpp, 4 windows of 256 tokens, NLL against headprune's float32 +0.0018 nats/token (f16
−0.00001, f32 +3e-7, q4_1 +0.053: re-quantizing the dequantized Q4_1 source is not lossless); ``f32`` reproduces
headprune's logits to float rounding (tests/oracles/test_gguf_export.py).
"""

GGUF_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_1")
DEFAULT_GGUF_TYPE = "q8_0"
