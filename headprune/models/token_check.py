"""The token ids a model's forward takes, checked before the embedding sees them."""

from __future__ import annotations

import torch
from torch import Tensor

from headprune.errors import HeadpruneError


def check_token_tensor(tokens: Tensor, vocab_size: int) -> None:
    """HeadpruneError unless ``tokens`` is an integer tensor of ids in [0, vocab_size) (an id outside would be an
    index error deep in the embedding, or on a GPU a device-side assert)."""
    if not isinstance(tokens, Tensor) or tokens.dtype not in (
        torch.long, torch.int32, torch.int16, torch.uint8
    ):
        raise HeadpruneError("token ids must be an integer tensor, "
                             f"got {getattr(tokens, 'dtype', type(tokens).__name__)}")
    if tokens.dim() != 2:
        raise HeadpruneError(f"token ids must be a (batch, T) tensor, got shape {tuple(tokens.shape)}; use "
                             "ids[None] for one sequence")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise HeadpruneError(f"token ids lie outside the model's vocabulary [0, {vocab_size}) "
                             f"(min {int(tokens.min())}, max {int(tokens.max())}); use the model's own tokenizer")
