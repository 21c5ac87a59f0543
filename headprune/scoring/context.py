"""Scores of a head's need for the whole context (:mod:`headprune.models.streaming`: a streaming head sees only the
first ``sink`` tokens and the last ``recent``). The unit is the KV head, what a KV cache stores: every query head
of a KV group gets its group's ctx_stream and ctx_gate; ctx_retrieval is the query head's own.

    ctx_stream     exact: NLL(KV head g streaming) − NLL(full), nats/token; a prefix-cached sweep as abl_zero's
                   (:mod:`.ablation`): one forward caches resid_pre, then from layer l up, several copies of the
                   batch at once, copy j with KV head j of layer l streaming (α = 0 on its query heads)
    ctx_gate       DuoAttention's gate at α = 1 (z_i = α_i z_i^full + (1 − α_i) z_i^stream): the first-order
                   estimate of ctx_stream, −Σ_{i∈g} ∂L/∂α_i, from one forward and backward for every head
                   (window w's own α row, so each window's gradient is its own, as for taylor)
    ctx_retrieval  the share of long-range copy events whose copied token the head's top attention lands on
                   (:mod:`.retrieval`), one forward

All are per-window sums over the scored tokens (or copy events), with bootstrap replicates over windows.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import Tensor

from headprune.bootstrap import ratio
from headprune.errors import HeadpruneError
from headprune.models.base import HeadModel
from headprune.models.memory import backward_windows
from headprune.models.nll import model_nll, unembed_nll
from headprune.models.streaming import Streaming, check_streaming, streaming
from headprune.perplexity import Batch, window_sums
from headprune.schema import CONTEXT_METHODS
from headprune.scoring.ablation import batch_caches
from headprune.scoring.base import Family, FamilyScores, ScoringContext, Unit
from headprune.scoring.retrieval import batch_retrieval


def group_matrix(model: HeadModel) -> Tensor:
    """[H, H] float64: M[i, j] = 1 where query heads i and j (layer-major) read the same KV head."""
    keys = [(layer, model.cfg.kv_head(head)) for layer, head in model.head_ids]
    return torch.tensor([[float(a == b) for b in keys] for a in keys], dtype=torch.float64)


@torch.no_grad()
def stream_layer(model: HeadModel, batch: Batch, resid_pre: Tensor, layer: int,
                 ctx: ScoringContext) -> list[list[float]]:
    """NLL sum of each window of the batch with one KV head of ``layer`` streaming, per KV head: [h_kv][b]."""
    batch = batch.to(model.device)
    b = batch.tokens.shape[0]
    attn = model.h[layer].attn
    group = torch.tensor(attn.kv_positions, device=model.device)  # [h]
    copies = max(1, min(attn.n_kv_heads, ctx.ablation_rows // b))
    sums: list[list[float]] = []
    for first in range(0, attn.n_kv_heads, copies):
        kv = torch.arange(first, min(first + copies, attn.n_kv_heads), device=model.device)  # [c]
        alpha = (group[None, :] != kv[:, None]).float().repeat_interleave(b, dim=0)  # (c·b, h)
        with streaming(model, {layer: Streaming(alpha, ctx.stream_sink, ctx.stream_recent)}):
            resid = model.run_blocks(resid_pre.repeat(len(kv), 1, 1), start=layer)
        for copy in resid.split(b):
            sums.append(window_sums(unembed_nll(model, copy, batch.tokens), batch.mask))
    return sums


def batch_alpha_grad(model: HeadModel, batch: Batch, sink: int, recent: int) -> dict:
    """Per window of the batch: n_w and ∂L_w/∂α_i at α = 1 for every query head (layer-major), as lists."""
    batch = batch.to(model.device)
    windows, checkpoint_layers = backward_windows(model.cfg, batch.tokens.shape[1])
    rows = []
    for tokens, mask in zip(batch.tokens.split(windows), batch.mask.split(windows)):
        alphas = {l: torch.ones(mask.shape[0], model.h[l].attn.n_heads, device=model.device, requires_grad=True)
                  for l in model.active_layers}
        with torch.enable_grad(), streaming(model, {l: Streaming(a, sink, recent) for l, a in alphas.items()}):
            nll = model_nll(model, tokens, checkpoint_layers=checkpoint_layers)  # (b, T−1)
            loss = ((nll * mask).sum(1) / mask.sum(1).clamp_min(1)).sum()  # Σ_w L_w
            grads = torch.autograd.grad(loss, list(alphas.values()))
        rows.append(torch.cat(grads, dim=1).double())
    return {"n": batch.mask.sum(1).tolist(), "dL_dalpha": torch.cat(rows).tolist()}


class ContextScores(Family):
    """ctx_stream, ctx_gate, ctx_retrieval (opt-in: they need long windows to mean anything)."""

    name = "context"
    methods = CONTEXT_METHODS

    def units(self, ctx: ScoringContext) -> list[Unit]:
        model, batches = ctx.model, ctx.batches
        seq_len = min(int(b.tokens.shape[1]) for b in batches) if batches else None
        check_streaming(ctx.stream_sink, ctx.stream_recent, seq_len)
        units: list[Unit] = []
        if "ctx_gate" in ctx.methods:
            units += [(f"ctx_gate/s{ctx.stream_sink}r{ctx.stream_recent}/b{k}",
                       partial(batch_alpha_grad, model, b, ctx.stream_sink, ctx.stream_recent))
                      for k, b in enumerate(batches)]
        if "ctx_retrieval" in ctx.methods:
            units += [(f"ctx_retrieval/s{ctx.stream_sink}r{ctx.stream_recent}/b{k}",
                       partial(batch_retrieval, model, b, ctx.stream_sink, ctx.stream_recent))
                      for k, b in enumerate(batches)]
        if "ctx_stream" in ctx.methods:
            cache = batch_caches(model, batches)

            def base(k: int) -> list[float]:
                return cache(k)[1]

            def stream(k: int, l: int) -> list[list[float]]:
                return stream_layer(model, batches[k], cache(k)[0][l], l, ctx)

            tag = f"s{ctx.stream_sink}r{ctx.stream_recent}"
            for k in range(len(batches)):
                units.append((f"ctx_base/w/b{k}", partial(base, k)))
                units += [(f"ctx_stream/{tag}/b{k}/L{l}", partial(stream, k, l)) for l in model.active_layers]
        return units

    def combine(self, ctx: ScoringContext, results: dict[str, Any]) -> FamilyScores:
        out = FamilyScores()
        model, n_batches = ctx.model, len(ctx.batches)
        n = torch.cat([b.mask.sum(1) for b in ctx.batches]).double()  # [W] scored tokens
        tag = f"s{ctx.stream_sink}r{ctx.stream_recent}"
        if "ctx_stream" in ctx.methods:
            base = torch.tensor([s for k in range(n_batches) for s in results[f"ctx_base/w/b{k}"]], dtype=torch.float64)
            per_window = []
            for k in range(n_batches):
                cols = []  # [H] columns of window sums: each query head takes its KV head's row
                for l in model.active_layers:
                    rows = results[f"ctx_stream/{tag}/b{k}/L{l}"]  # [h_kv][b]
                    cols += [rows[g] for g in model.h[l].attn.kv_positions]
                per_window.append(torch.tensor(cols, dtype=torch.float64).T)  # [b, H]
            delta = torch.cat(per_window) - base.unsqueeze(1)  # [W, H]
            out.scores["ctx_stream"], out.replicates["ctx_stream"] = delta.sum(0) / n.sum(), ratio(delta, n)
        if "ctx_gate" in ctx.methods:
            units = [results[f"ctx_gate/{tag}/b{k}"] for k in range(n_batches)]
            d = torch.tensor([row for u in units for row in u["dL_dalpha"]], dtype=torch.float64)  # [W, H]
            weighted = -n.unsqueeze(1) * d @ group_matrix(model)  # per-window −Σ_{i∈g} n_w ∂L_w/∂α_i
            out.scores["ctx_gate"], out.replicates["ctx_gate"] = weighted.sum(0) / n.sum(), ratio(weighted, n)
        if "ctx_retrieval" in ctx.methods:
            units = [results[f"ctx_retrieval/{tag}/b{k}"] for k in range(n_batches)]
            events = torch.tensor([e for u in units for e in u["events"]], dtype=torch.float64)  # [W]
            if events.sum() == 0:
                raise HeadpruneError("ctx_retrieval: the scoring windows hold no long-range copy event (a token the "
                                     "model predicts that occurs only beyond the streaming window); use longer "
                                     "windows or text that repeats itself (--data longdocs)", "methods")
            hits = torch.tensor([row for u in units for row in u["hits"]], dtype=torch.float64)  # [W, H]
            out.scores["ctx_retrieval"], out.replicates["ctx_retrieval"] = hits.sum(0) / events.sum(), \
                ratio(hits, events)
        return out
