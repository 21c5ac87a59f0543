"""What a forward records (:class:`Capture`) and what may replace a layer's attention activations inside it
(:class:`AttentionHook`, set by :func:`hooked`), for every family, GPT-2 included; what it reads while decoding
(:class:`StepCache`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from torch import Tensor, nn


@dataclass
class Capture:
    """Activations a forward records, by absolute layer (pass one as ``capture=`` to a model's ``forward``).

    resid_pre[l]: (B,T,d) entering block l;  z[l]: (B,h,T,d_k) head outputs before gates and W_O;
    attn[l]: (B,h,T,T) attention probabilities (only with ``need_weights=True``), or ``reduce_attn(l, probs)``
    where that is set: what a caller needs of them (say the entropy per position), computed inside the forward so
    that every layer's (B,h,T,T) is never held at once.
    """

    resid_pre: dict[int, Tensor] = field(default_factory=dict)
    z: dict[int, Tensor] = field(default_factory=dict)
    attn: dict[int, Tensor] = field(default_factory=dict)
    reduce_attn: Callable[[int, Tensor], Tensor] | None = None

    def record_attn(self, layer: int, probs: Tensor) -> None:
        """Keep layer ``layer``'s probabilities (B,h,T,T), or what ``reduce_attn`` makes of them."""
        self.attn[layer] = probs if self.reduce_attn is None else self.reduce_attn(layer, probs)


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


class StepCache(Protocol):
    """What attention reads while decoding (:class:`headprune.models.decoding.LayerCache`): z (B,h,T,d_k) of a step's
    q (B,h,T,d_k) against the cached keys and the step's k, v (B,h_kv,T,d_k), which it then holds."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor: ...
