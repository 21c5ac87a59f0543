"""Interventions on a model's heads that change no weight: gates and fills for ``HeadModel.forward``.

Head i of layer l outputs z_i; with gate g_i and fill f_i the layer uses

    z_i ← g_i z_i + (1 − g_i) f_i

so g_i = 1 keeps the head, g_i = 0 with f_i = 0 zero-ablates it (its value-bias share goes too), and
g_i = 0 with f_i = z̄_i (its mean output) mean-ablates it. Gates may be fractional and differentiable
(gradient scores) or per example ([B, n_heads_l]: several ablated copies in one batch).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

from headprune.errors import HeadpruneError
from headprune.models.base import HeadModel
from headprune.models.heads import check_heads, head_id

Head = tuple[int, int]


def position(model: HeadModel, layer: int, head: int) -> int:
    """Index of original head ``head`` in layer ``layer``'s weights (its gate / W_O row block)."""
    return model.cfg.kept_heads[layer].index(head)


def mask_gates(model: HeadModel, heads: Iterable[Head]) -> list[Tensor]:
    """Gates per layer ([n_heads_l], float32): 1, and 0 at the positions of ``heads``."""
    gates = model.ones_gates()
    for layer, head in check_heads(model, heads):
        gates[layer][position(model, layer, head)] = 0.0
    return gates


def check_fills(model: HeadModel, heads: list[Head], fills: Mapping[Head, Tensor] | None) -> dict[Head, Tensor]:
    """The fills of ``heads`` (each [d_head]); extra keys are ignored, a missing one is an error."""
    if fills is None:
        return {}
    missing = [h for h in heads if tuple(h) not in fills]
    if missing:
        raise HeadpruneError(f"no mean output (fill) for pruned head {head_id(*missing[0])}; compute fills for every "
                             "pruned head or prune without compensation")
    out = {}
    for h in heads:
        f = torch.as_tensor(fills[h])
        if f.shape != (model.cfg.d_head,):
            raise HeadpruneError(
                f"fill of head {head_id(*h)} has shape {tuple(f.shape)}, expected ({model.cfg.d_head},)"
            )
        if not f.is_floating_point() or not bool(torch.isfinite(f).all()):
            raise HeadpruneError(f"fill of head {head_id(*h)} must hold finite floating-point numbers (NaN, inf or "
                                 "integers would corrupt b_O)")
        out[h] = f
    return out


def fill_tensors(model: HeadModel, fills: Mapping[Head, Tensor]) -> list[Tensor]:
    """The ``fills`` argument of ``model.forward``: per layer [n_heads_l, d_head], z̄_i at head i's position,
    0 elsewhere. Heads of ``fills`` the model lacks are an error."""
    out = [torch.zeros(blk.attn.n_heads, model.cfg.d_head, device=model.device, dtype=model.dtype) for blk in model.h]
    for (layer, head), f in check_fills(model, check_heads(model, fills.keys()), fills).items():
        out[layer][position(model, layer, head)] = f.to(out[layer])
    return out
