"""Rotary position embeddings (RoPE, Su et al. 2021) as Llama and GPT-NeoX apply them.

For a head of width d_k rotating its first r dims (r = d_k, or ⌊rotary_pct·d_k⌋ for GPT-NeoX):

    θ_j   = base^(−2j/r),  j = 0..r/2−1                 (inv_freq, then rescaled by rope_scaling)
    φ_t   = [t θ_0 … t θ_{r/2−1}, t θ_0 … t θ_{r/2−1}]    (T, r) angles at positions t = 0..T−1
    x_rot = x ⊙ cos φ + rotate_half(x) ⊙ sin φ,   rotate_half([x₁, x₂]) = [−x₂, x₁]

on the first r dims of q and k (the rest pass through). Angles are computed in float32 and the tables cast to
the activations' dtype, as transformers does.

rope_scaling types: ``linear`` (θ_j / factor) and ``llama3`` (Llama 3.1: wavelengths 2π/θ_j beyond
L/low_freq_factor are divided by ``factor``, those below L/high_freq_factor kept, and the band between
interpolated smoothly; L = original_max_position_embeddings).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from headprune.errors import HeadpruneError

SCALINGS = ("default", "linear", "llama3")


def inv_frequencies(dim: int, base: float, scaling: dict | None = None) -> Tensor:
    """θ [dim/2] (float32, CPU) for ``dim`` rotated dims, after ``scaling`` (a rope_parameters dict or None)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "default":
        return inv_freq
    assert scaling is not None
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)  # long waves: ÷ factor
        smooth = (old_len / wavelen - low) / (high - low)  # 0 at the long end of the band, 1 at the short end
        between = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
        return torch.where(between, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    raise HeadpruneError(f"rope_scaling type {kind!r} is not supported; headprune implements {', '.join(SCALINGS)}")


def rotary_tables(inv_freq: Tensor, T: int, device: torch.device, dtype: torch.dtype,
                  start: int = 0) -> tuple[Tensor, Tensor]:
    """cos φ and sin φ for positions start..start+T−1: each (T, r), in ``dtype``."""
    t = torch.arange(start, start + T, device=device, dtype=torch.float32)
    freqs = t[:, None] * inv_freq.to(device)[None, :]  # (T, r/2)
    angles = torch.cat((freqs, freqs), dim=-1)  # (T, r)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B,h,T,d_k) with its first r = cos.shape[-1] dims rotated by position."""
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    x_rot, x_pass = x[..., :r], x[..., r:]
    return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x_pass), dim=-1)
