"""The retrieval score (Wu et al. 2024, "retrieval heads"; RazorAttention's training-free head test), one forward:
how often a head's strongest attention lands on the token the model copies from beyond a streaming head's reach.

A **copy event** is a scored position t of a window x whose next token y = x[t+1] the model predicts top-1, and
which y can only be copied from far back: y occurs at some s with sink ≤ s ≤ t − recent, and nowhere in the recent
window t − recent < s ≤ t (nor among the sinks: a streaming head sees those). Query head i **retrieves** at t when
argmax_s A_i(t, s) (its attention, causal and within the layer's sliding window) is a position holding y:

    ctx_retrieval_i = Σ_w hits_i,w / Σ_w events_w          (share of copy events, bootstrap over windows)

Only the event positions' attention rows are formed (h × events × T per layer), never the (T, T) pattern.
"""

from __future__ import annotations

import torch
from torch import Tensor

from headprune.models.attention_ops import sliding_causal_mask
from headprune.models.base import HeadModel
from headprune.models.hooks import Capture
from headprune.perplexity import Batch


def copy_events(tokens: Tensor, predicted: Tensor, mask: Tensor, sink: int, recent: int) -> Tensor:
    """(T−1,) bool for one window: tokens (T,), predicted (T−1,) the model's top-1 next token at each position,
    mask (T−1,) the scored positions."""
    T = tokens.shape[0]
    target = tokens[1:]  # y_t = x[t+1]
    same = tokens[None, :] == target[:, None]  # (T−1, T): x[s] == y_t
    t, s = torch.arange(T - 1)[:, None], torch.arange(T)[None, :]
    far = same & (s >= sink) & (s <= t - recent)
    near = same & ((s > t - recent) | (s < sink)) & (s <= t)
    return mask & (predicted == target) & far.any(1) & ~near.any(1)


@torch.no_grad()
def predictions(model: HeadModel, resid: Tensor, rows: int = 256) -> Tensor:
    """(B, T) top-1 next token at every position from the final residual (B,T,d), a few rows at a time."""
    out = [model.unembed(resid[:, a:a + rows]).argmax(-1) for a in range(0, resid.shape[1], rows)]
    return torch.cat(out, dim=1)


@torch.no_grad()
def batch_retrieval(model: HeadModel, batch: Batch, sink: int, recent: int) -> dict:
    """Per window of the batch: its copy events and each head's hits, layer-major: {"events": [b], "hits":
    [b][H]}."""
    batch = batch.to(model.device)
    capture = Capture()
    final = model.run_blocks(model.embed(batch.tokens), capture=capture)
    predicted = predictions(model, final)[:, :-1]  # (b, T−1)
    b, T = batch.tokens.shape
    events = [copy_events(batch.tokens[w].cpu(), predicted[w].cpu(), batch.mask[w].cpu(), sink, recent)
              for w in range(b)]
    hits = torch.zeros(b, len(model.head_ids), dtype=torch.float64)
    column = 0
    for layer in model.active_layers:
        attn = model.h[layer].attn
        q, k, _ = model.qkv(layer, capture.resid_pre[layer])  # (b,h,T,d_k), (b,h_kv,T,d_k)
        k = k.index_select(1, attn.kv_group)
        allowed = sliding_causal_mask(T, attn.window, q.device)  # (T,T)
        for w in range(b):
            at = events[w].nonzero().flatten().to(q.device)  # event positions t
            if not len(at):
                continue
            scores = (q[w][:, at] @ k[w].transpose(-1, -2)).float()  # (h, E, T)
            top = scores.masked_fill(~allowed[at], float("-inf")).argmax(-1)  # (h, E)
            target = batch.tokens[w, at + 1]  # (E,)
            hits[w, column:column + attn.n_heads] = (batch.tokens[w][top] == target).sum(1).double().cpu()
        column += attn.n_heads
    return {"events": [int(e.sum()) for e in events], "hits": hits.tolist()}
