"""Remove attention heads: as gates (masking), physically (a smaller model), and as exported checkpoints.

Attention output of a layer with heads i (W_O^(i) = rows i·d_k..(i+1)·d_k of W_O):

    out = Σ_i z_i W_O^(i) + b_O

Pruning a set P of heads drops their terms. Mean compensation replaces z_i (i ∈ P) by its mean z̄_i over
the data instead of 0; a constant term, it folds into the bias:

    out = Σ_{i∉P} z_i W_O^(i) + (b_O + Σ_{i∈P} z̄_i W_O^(i))

so the physically pruned model equals the mean-ablated one (gates 0, fills z̄) up to rounding. Optimal
compensation folds constants fitted to be optimal for ablating the set P together (Li & Janson, 2024;
:func:`headprune.scoring.joint_constants`) the same way: any constant fill does.

Physical pruning keeps, per layer, only the remaining heads' Q/K/V columns of c_attn ([d, 3·h·d_k]:
Q block, K block, V block, head-major inside each) and W_O rows of c_proj ([h·d_k, d]); ``cfg.kept_heads``
records the ORIGINAL indices of the heads left. A layer may keep no head (its attention adds b_O only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import cast

import torch
from torch import Tensor

from headprune.models.gpt2 import GPT2, Attention
from headprune.models.gpt2_config import ModelConfig
from headprune.models.heads import check_heads
from headprune.models.interventions import Head, check_fills
from headprune.models.meta import on_meta


def removed_heads(model: GPT2) -> list[Head]:
    """(layer, head) of every original head the model no longer holds."""
    cfg = model.cfg
    return [(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads) if h not in cfg.kept_heads[l]]


def _compensation(attn, positions: list[int], fills: list[Tensor]) -> Tensor:
    """Σ_i z̄_i W_O^(i) over the pruned heads, in float64: [d_model]."""
    W_O = attn.W_O.detach().double()  # [n_heads, d_head, d_model]
    total = torch.zeros(W_O.shape[-1], dtype=torch.float64, device=W_O.device)
    for p, f in zip(positions, fills):
        total += f.to(W_O) @ W_O[p]
    return total


def _pruned_layer_state(model: GPT2, layer: int, drop: set[int], fills: dict[Head, Tensor]) -> dict[str, Tensor]:
    """The attention weights of ``layer`` without the original heads ``drop``, compensation folded into b_O."""
    attn, kept = model.h[layer].attn, model.cfg.kept_heads[layer]
    dev = attn.c_attn.weight.device
    keep = torch.tensor([p for p, h in enumerate(kept) if h not in drop], dtype=torch.long, device=dev)
    cols, rows = Attention.qkv_columns(keep, attn.n_heads, attn.d_head), Attention.wo_rows(keep, attn.d_head)
    gone = [(p, h) for p, h in enumerate(kept) if h in drop and (layer, h) in fills]
    b_O = attn.c_proj.bias.detach()
    if gone:
        comp = _compensation(attn, [p for p, _ in gone], [fills[(layer, h)] for _, h in gone])
        b_O = (b_O.double() + comp).to(b_O.dtype)
    pre = f"h.{layer}.attn."
    return {
        pre + "c_attn.weight": attn.c_attn.weight.detach().index_select(1, cols),  # [d, 3·h'·d_k]
        pre + "c_attn.bias": attn.c_attn.bias.detach().index_select(0, cols),  # [3·h'·d_k]
        pre + "c_proj.weight": attn.c_proj.weight.detach().index_select(0, rows),  # [h'·d_k, d]
        pre + "c_proj.bias": b_O.clone(),  # [d]
    }


def prune_model(model: GPT2, heads: Iterable[Head], fills: Mapping[Head, Tensor] | None = None) -> GPT2:
    """A new, physically smaller GPT2 without ``heads`` (the input is not changed).

    ``fills``: {(layer, head): z̄ [d_head]}, the mean output of each pruned head; when given, Σ z̄_i W_O^(i)
    is folded into each layer's b_O, so the result equals ``model(tokens, mask_gates(...), fill_tensors(...))``.
    Another family's model is pruned by :func:`headprune.models.prune.prune_heads` (its KV heads go with their
    last query head).
    """
    if not isinstance(model, GPT2):
        from headprune.models.prune import prune_heads

        return cast(GPT2, prune_heads(model, heads, fills))  # the same per-head interface
    heads = check_heads(model, heads)
    fills = check_fills(model, heads, fills)
    drop: dict[int, set[int]] = {}
    for layer, head in heads:
        drop.setdefault(layer, set()).add(head)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for layer, gone in drop.items():
        state.update(_pruned_layer_state(model, layer, gone, fills))
    kept = [[h for h in k if h not in drop.get(layer, ())] for layer, k in enumerate(model.cfg.kept_heads)]
    return _build(model, dataclasses.replace(model.cfg, kept_heads=kept), state)


def _build(like: GPT2, cfg: ModelConfig, state: dict[str, Tensor]) -> GPT2:
    """GPT2(cfg) holding ``state`` (tensors adopted, not copied), with ``like``'s mode, grads and origin."""
    with on_meta():
        new = GPT2(cfg)
    new.load_state_dict(state, assign=True)
    grads = {name: p.requires_grad for name, p in like.named_parameters()}
    for name, p in new.named_parameters():
        p.requires_grad_(grads.get(name, False))
    new.train(like.training)
    new.origin = like.origin
    return new
