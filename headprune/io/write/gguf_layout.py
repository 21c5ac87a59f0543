"""A pruned layer's attention in llama.cpp's layout: n_head query heads over n_head_kv KV heads, query head i reading
KV head ⌊i / (n_head / n_head_kv)⌋, so every KV head serves the same number r of consecutive query heads.

headprune keeps any subset of a layer's query heads; kept KV head g then serves c_g ≥ 1 of them. Where the c_g
differ (an uneven prune across KV groups), each group is completed to r = max_g c_g with **zero-weight query heads**
(zero q rows, zero W_O columns): such a head attends somewhere and its output is multiplied by zero, so the layer
computes exactly what it did. This is the fewest added query heads that make every group the same size without
touching the KV heads; the alternative, repeating a KV head, would grow the KV cache (what serving pays for per
token), so it is not used. Cost: Σ_g (r − c_g) query heads of attention compute and of q/o weights (zeros) per layer;
no KV-cache bytes.

A layer with no head left has no attention tensors (llama.cpp's ``deci`` skips attention where n_head = 0), unless
it must hold something: a non-zero b_O (a compensation constant), or layer 0 (llama.cpp reads the head size from
layer 0's count), which keep **one zero head over one zero KV head** (b_O added as it is; cost: one KV head of
cache in that layer).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from headprune.models.llama import Attention


@dataclass
class GgufAttention:
    """One layer's attention tensors in transformers' layout (out × in), before llama.cpp's rotary permutation."""

    n_head: int  # query heads, padded
    n_head_kv: int
    padded: int  # zero-weight query heads added (or the one zero head of an emptied layer that must hold b_O)
    W_q: Tensor | None  # [n_head·d_k, d]
    W_k: Tensor | None  # [n_head_kv·d_k, d]
    W_v: Tensor | None  # [n_head_kv·d_k, d]
    W_o: Tensor | None  # [d, n_head·d_k]
    b_o: Tensor | None  # [d]: None where b_O is zero


def _group_sizes(attn: Attention) -> list[int]:
    """c_g: how many kept query heads each kept KV head serves (kept heads come grouped, in KV order)."""
    return [attn.kv_positions.count(g) for g in range(attn.n_kv_heads)]


def padded_layer(attn: Attention, *, keep_empty: bool) -> GgufAttention:
    """``attn`` (a Llama-like attention without q/k/v biases) as llama.cpp holds it (module docstring);
    ``keep_empty``: an emptied layer keeps one zero head (layer 0)."""
    d_k = attn.d_head
    q, k = attn.q_proj.weight.detach(), attn.k_proj.weight.detach()
    v, o = attn.v_proj.weight.detach(), attn.o_proj.weight.detach()
    d = o.shape[0]
    b_o = attn.b_O.detach() if bool(attn.b_O.detach().ne(0).any()) else None
    if attn.n_heads == 0:
        if b_o is None and not keep_empty:
            return GgufAttention(0, 0, 0, None, None, None, None, None)
        zeros = o.new_zeros(d_k, d)
        return GgufAttention(1, 1, 1, zeros, zeros.clone(), zeros.clone(), o.new_zeros(d, d_k), b_o)
    sizes = _group_sizes(attn)
    r = max(sizes)
    q_heads, o_heads = q.view(attn.n_heads, d_k, d), o.view(d, attn.n_heads, d_k)
    q_rows, o_cols, start = [], [], 0
    for c in sizes:  # group g: its c kept heads, then r − c zero heads
        q_rows += [q_heads[start:start + c], q.new_zeros(r - c, d_k, d)]
        o_cols += [o_heads[:, start:start + c], o.new_zeros(d, r - c, d_k)]
        start += c
    n_head = r * len(sizes)
    return GgufAttention(n_head, len(sizes), n_head - attn.n_heads, torch.cat(q_rows).reshape(n_head * d_k, d),
                         k, v, torch.cat(o_cols, dim=1).reshape(d, n_head * d_k), b_o)


def uniform_layer(attn: Attention) -> GgufAttention:
    """``attn`` as it is (a uniform prune: repeat_kv's layout already), q/k norms and biases left to the caller."""
    b_o = attn.b_O.detach() if bool(attn.b_O.detach().ne(0).any()) else None
    return GgufAttention(attn.n_heads, attn.n_kv_heads, 0, attn.q_proj.weight.detach(),
                         attn.k_proj.weight.detach(), attn.v_proj.weight.detach(),
                         attn.o_proj.weight.detach(), b_o)


def permute_rotary(w: Tensor, n_heads: int) -> Tensor:
    """llama.cpp's rotary row order for q or k [h·d_k, d]: each head's rows (2, d_k/2) -> (d_k/2, 2), the inverse
    of :func:`headprune.io.read.gguf._unpermute`."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
