"""The attention arithmetic every family shares: gates and fills on head outputs, causal (and sliding-window)
probabilities."""

from __future__ import annotations

import torch
from torch import Tensor


def gated(z: Tensor, gate: Tensor | None, fill: Tensor | None) -> Tensor:
    """z (B,h,T,d_k) with z_i ← g_i z_i + (1 − g_i) f_i: gate [h], [B,h] or per position [B,h,T]; fill [h,d_k] or
    per example and position [B,h,T,d_k] (None: 0)."""
    if gate is None:
        return z
    h, dk = z.shape[1], z.shape[3]
    g = (gate.unsqueeze(-1) if gate.dim() == 3 else gate.view(-1, h, 1, 1)).to(z.dtype)
    f = None if fill is None else (fill if fill.dim() == 4 else fill.view(1, h, 1, dk)).to(z.dtype)
    return g * z if f is None else g * z + (1 - g) * f


def causal_probs(q: Tensor, k: Tensor, scale: float, window: int | None = None) -> Tensor:
    """softmax(q kᵀ · scale + mask) (B,h,T,T) of q, k (B,h,T,d_k), in float32 and cast back: the causal mask, and
    t − s < window where a sliding window is set."""
    T = q.shape[2]
    scores = (q @ k.transpose(-1, -2)).float() * scale
    return scores.masked_fill(~sliding_causal_mask(T, window, q.device), float("-inf")).softmax(-1).to(q.dtype)


def sliding_causal_mask(T: int, window: int | None, device: torch.device) -> Tensor:
    """(T,T) bool, True where position t may attend to s: s ≤ t, and t − s < window when a window is set."""
    t = torch.arange(T, device=device)
    allowed = t[None, :] <= t[:, None]
    return allowed if window is None else allowed & (t[None, :] > t[:, None] - window)
