"""How many windows one pass takes at once, from a memory budget and the model's shapes, so that a pass's peak
grows with the model and not with the batch size a small model was tuned for.

Two kinds of pass hold more than the weights: a forward and backward (gradient scores) keeps every block's
activations for the backward, and a forward that materialises attention probabilities (entropy, head roles) makes
h·T² floats per layer. Both are split into sub-batches of windows; each window's result is computed as it would be
in the whole batch (to the rounding of matmuls whose blocking varies with the batch)."""

from __future__ import annotations

from headprune.models.head_config import HeadConfig

ACTIVATION_BYTES = 256 << 20  # activations one pass may hold besides the weights


def block_bytes_per_token(cfg: HeadConfig) -> int:
    """fp32 bytes one block keeps for the backward per token: about 4·(12·d + 4·d_mlp + 4·h·d_k) (the norms'
    inputs and outputs, q/k/v before and after rotary, the attention output, the MLP's hidden activations).
    Measured on Gemma 3 270M: 76 KiB per token and block; this gives 78."""
    return 4 * (12 * cfg.d_model + 4 * cfg.d_mlp + 4 * cfg.n_heads * cfg.d_head)


def backward_windows(cfg: HeadConfig, seq_len: int, budget: int = ACTIVATION_BYTES) -> tuple[int, bool]:
    """(windows per forward and backward, whether to checkpoint each block): all blocks' activations of the
    windows fit the budget, or, where one window's do not, each block is checkpointed
    (:meth:`~headprune.models.base.HeadModel.run_blocks`) and one block's activations of the windows fit it."""
    per_block = seq_len * block_bytes_per_token(cfg)  # one window through one block
    if per_block * cfg.n_layers <= budget:
        return budget // (per_block * cfg.n_layers), False
    return max(1, budget // per_block), True


def pattern_windows(cfg: HeadConfig, seq_len: int, budget: int = ACTIVATION_BYTES) -> int:
    """Windows per forward that materialises a layer's attention probabilities (B,h,T,T) (fp32 scores and
    probabilities, and a float64 copy and its product where a caller reduces them: 6 fp32-sized copies)."""
    return max(1, budget // (6 * 4 * cfg.n_heads * seq_len * seq_len))


def capture_windows(cfg: HeadConfig, seq_len: int, budget: int = ACTIVATION_BYTES) -> int:
    """Windows per forward that keeps every layer's residual stream (T,d) and head outputs (h,T,d_k) of each
    window (:class:`~headprune.models.hooks.Capture`), with one more fp32 copy of each for the work on them."""
    return max(1, budget // (2 * 4 * seq_len * cfg.n_layers * (cfg.d_model + cfg.n_heads * cfg.d_head)))
