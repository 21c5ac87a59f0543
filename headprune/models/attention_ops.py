"""The attention arithmetic every family shares: gates and fills on head outputs, causal (and sliding-window)
probabilities, and the row blocks of heads in the attention weights."""

from __future__ import annotations

import torch
import torch.nn.functional as F
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


def full_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, window: int | None = None,
                   heads: Tensor | None = None) -> Tensor:
    """z = softmax(q kᵀ · scale + mask) v (B,h,T,d_k) by SDPA, the mask causal (and t − s < window): q (B,h,T,d_k),
    k and v (B,h_k,T,d_k) with h_k = h, or h_kv in the repeat_kv layout (query head i reads KV head ⌊i·h_kv / h⌋).
    Where ``heads`` [n] is given, only those query heads are computed and the others are 0 (heads that stream
    wholly need no full attention)."""
    h, T = q.shape[1], q.shape[2]
    if heads is not None and len(heads) < h:
        z = torch.zeros_like(q)
        if not len(heads):
            return z
        kv = heads // (h // k.shape[1])  # each selected query head's own K/V rows
        part = full_attention(q.index_select(1, heads), k.index_select(1, kv), v.index_select(1, kv), scale, window)
        return z.index_copy(1, heads, part)
    mask = None if window is None or window >= T else sliding_causal_mask(T, window, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale,
                                          enable_gqa=k.shape[1] != h)


def sliding_causal_mask(T: int, window: int | None, device: torch.device) -> Tensor:
    """(T,T) bool, True where position t may attend to s: s ≤ t, and t − s < window when a window is set."""
    t = torch.arange(T, device=device)
    allowed = t[None, :] <= t[:, None]
    return allowed if window is None else allowed & (t[None, :] > t[:, None] - window)


def streaming_allowed(t: Tensor, s: Tensor, sink: int, recent: int, window: int | None) -> Tensor:
    """Bool, True where query position t (column vector) may attend to key position s (row) as a streaming head:
    s ≤ t, (s < sink or t − s < recent), and t − s < window where the layer has a sliding window of its own."""
    allowed = (s <= t) & ((s < sink) | (t - s < recent))
    return allowed if window is None else allowed & (t - s < window)


def streaming_probs(q: Tensor, k: Tensor, scale: float, sink: int, recent: int, window: int | None = None) -> Tensor:
    """softmax(q kᵀ · scale + streaming mask) (B,h,T,T) of q, k (B,h,T,d_k): :func:`causal_probs` where each query
    sees only the first ``sink`` keys and the last ``recent`` (itself included), in float32 and cast back."""
    t = torch.arange(q.shape[2], device=q.device)
    allowed = streaming_allowed(t[:, None], t[None, :], sink, recent, window)
    scores = (q @ k.transpose(-1, -2)).float() * scale
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1).to(q.dtype)


def streaming_z(q: Tensor, k: Tensor, v: Tensor, scale: float, sink: int, recent: int, window: int | None = None,
                block: int = 256) -> Tensor:
    """z (B,h,T,d_k) of streaming heads, q, k, v (B,h,T,d_k): ``streaming_probs(q, k) @ v`` computed a block of
    ``block`` queries at a time against only the keys they may see (the sinks and the ``recent + block − 1``
    before and within the block), so memory is O(B·h·block·(sink + recent + block)), never (T,T)."""
    T = q.shape[2]
    out = []
    for a in range(0, T, block):
        b = min(a + block, T)
        lo = max(0, a - recent + 1)  # the earliest recent key of query a
        n_sink = min(sink, lo)  # sinks not already inside [lo, b)
        keys = torch.cat([torch.arange(n_sink, device=q.device), torch.arange(lo, b, device=q.device)])
        kk = torch.cat([k[:, :, :n_sink], k[:, :, lo:b]], dim=2)  # (B,h,n,d_k)
        vv = torch.cat([v[:, :, :n_sink], v[:, :, lo:b]], dim=2)
        allowed = streaming_allowed(torch.arange(a, b, device=q.device)[:, None], keys[None, :], sink, recent, window)
        scores = (q[:, :, a:b] @ kk.transpose(-1, -2)).float() * scale  # (B,h,b−a,n)
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1).to(q.dtype)
        out.append(probs @ vv)
    return torch.cat(out, dim=2)


def head_rows(heads: list[int], width: int, device: torch.device) -> Tensor:
    """Indices of ``width`` consecutive rows per head: head·width + 0..width−1, in the order of ``heads``."""
    return (torch.tensor(heads, dtype=torch.long, device=device).view(-1, 1) * width
            + torch.arange(width, device=device)).reshape(-1)


def widened(t: Tensor, dim: int, index: Tensor, size: int) -> Tensor:
    """``t`` placed at ``index`` along ``dim`` of a zero tensor ``size`` long there."""
    shape = list(t.shape)
    shape[dim] = size
    return t.detach().new_zeros(shape).index_copy_(dim, index, t.detach())
