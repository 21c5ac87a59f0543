"""Physical pruning of query heads for every family of :mod:`headprune.models`.

Removing query heads P of a layer drops their W_Q rows and W_O columns; a KV head whose query heads all go loses its
k/v rows too. With fills z̄_i (mean or optimal compensation) the constant Σ_{i∈P} z̄_i W_O^(i) moves into b_O, so the
pruned model equals the original with those heads gated off and filled with z̄ (up to rounding).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

from headprune.models.base import HeadModel
from headprune.models.head_config import Head
from headprune.models.meta import on_meta


def prune_heads(model: HeadModel, heads: Iterable[Head], fills: Mapping[Head, Tensor] | None = None,
                share: bool = False) -> HeadModel:
    """A new, physically smaller model without query ``heads`` (the input is not changed).

    A KV head whose query heads all go is removed with them. ``fills``: {(layer, head): z̄ [d_head]}; when given,
    Σ z̄_i W_O^(i) is folded into each layer's b_O, so the result equals the model with those heads gated off and
    filled with z̄ (mean or optimal compensation). ``share``: the new model holds the input's tensors that pruning
    leaves as they are (the embedding, every MLP, every layer without pruned heads) instead of copies, for a model
    that is only evaluated: neither model may then be changed in place."""
    from headprune.models.heads import check_heads
    from headprune.models.interventions import check_fills

    heads = check_heads(model, heads)
    checked = check_fills(model, heads, fills)
    drop: dict[int, set[int]] = {}
    for layer, head in heads:
        drop.setdefault(layer, set()).add(head)
    pruned: dict[str, Tensor] = {}  # the pruned layers' attention tensors
    for layer, gone in drop.items():
        attn, kept = model.h[layer].attn, model.cfg.kept_heads[layer]
        filled = [(p, checked[(layer, head)]) for p, head in enumerate(kept)
                  if head in gone and (layer, head) in checked]
        b_O = attn.b_O.detach()
        if filled:
            W_O = attn.W_O.detach().double()  # [h, d_k, d]
            compensation = torch.zeros(W_O.shape[-1], dtype=torch.float64, device=W_O.device)
            for p, fill in filled:
                compensation += fill.to(W_O) @ W_O[p]  # z̄_i W_O^(i)
            b_O = (b_O.double() + compensation).to(b_O.dtype)
        keep = [p for p, head in enumerate(kept) if head not in gone]
        pruned.update(attn.pruned_state(f"h.{layer}.attn.", keep, b_O))
    state = {k: v.detach() if share else v.detach().clone() for k, v in model.state_dict().items() if k not in pruned}
    state |= pruned
    kept_heads = [[h for h in k if h not in drop.get(layer, ())] for layer, k in enumerate(model.cfg.kept_heads)]
    cfg = dataclasses.replace(model.cfg, kept_heads=kept_heads)
    if checked:
        cfg = dataclasses.replace(cfg, o_bias=True)  # the compensation is in b_O now
    with on_meta():
        new = type(model)(cfg)
    new.load_state_dict(state, assign=True)
    grads = {name: p.requires_grad for name, p in model.named_parameters()}
    for name, param in new.named_parameters():
        param.requires_grad_(grads.get(name, False))
    new.train(model.training)
    new.origin = model.origin
    return new

def removed_heads(model: HeadModel) -> list[Head]:
    """(layer, head) of every original head the model no longer holds."""
    cfg = model.cfg
    return [(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads) if h not in cfg.kept_heads[l]]
