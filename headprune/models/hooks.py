"""What a forward records (:class:`Capture`) and what may replace a layer's attention activations inside it
(:class:`AttentionHook`, set by :func:`hooked`), for every family, GPT-2 included."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

from torch import Tensor, nn


@dataclass
class Capture:
    """Activations a forward records, by absolute layer (pass one as ``capture=`` to a model's ``forward``).

    resid_pre[l]: (B,T,d) entering block l;  z[l]: (B,h,T,d_k) head outputs before gates and W_O;
    attn[l]: (B,h,T,T) attention probabilities (only with ``need_weights=True``).
    """

    resid_pre: dict[int, Tensor] = field(default_factory=dict)
    z: dict[int, Tensor] = field(default_factory=dict)
    attn: dict[int, Tensor] = field(default_factory=dict)


class AttentionHook:
    """Sees, and may replace, one layer's attention activations during a forward (:func:`hooked`): q (B,h,T,d_k)
    and k, v (B,h_kv,T,d_k) after rotary, and, where ``needs_pattern``, the probabilities (B,h,T,T). The base
    class changes nothing; patching subclasses it (:mod:`headprune.patching.exact`)."""

    needs_pattern = False

    def qkv(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return q, k, v

    def pattern(self, probs: Tensor) -> Tensor:
        return probs


@contextmanager
def hooked(model: nn.Module, hooks: Mapping[int, AttentionHook]) -> Iterator[None]:
    """Layer l's attention runs with ``hooks[l]`` inside the block (any family, GPT-2 included)."""
    attns = [cast(Any, model).h[layer].attn for layer in hooks]
    try:
        for attn, hook in zip(attns, hooks.values()):
            attn.hook = hook
        yield
    finally:
        for attn in attns:
            attn.hook = None
