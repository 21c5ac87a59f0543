"""Weight-only head scores from the W_O row blocks and the OV circuit.

For head i of a layer: W_O^(i) ∈ R^{d_k×d} (rows i·d_k..(i+1)·d_k of c_proj), W_V^(i) ∈ R^{d×d_k}.

    wo_fro  = ‖W_O^(i)‖_F                 wo_spec = σ_max(W_O^(i))
    ov_fro  = ‖W_V^(i) W_O^(i)‖_F         ov_spec = σ_max(W_V^(i) W_O^(i))

The d×d OV matrix is never formed: with thin QR factorizations W_V = Q_V R_V and W_Oᵀ = Q_O R_O
(Q orthonormal columns), W_V W_O = Q_V (R_V R_Oᵀ) Q_Oᵀ has the singular values of the d_k×d_k core
R_V R_Oᵀ, so both norms come from the core.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from headprune.models.base import HeadModel
from headprune.schema import WEIGHT_METHODS
from headprune.scoring.base import Family, FamilyScores, ScoringContext, Unit


def ov_core(W_V: Tensor, W_O: Tensor) -> Tensor:
    """[h, d_k, d_k] cores whose singular values are those of W_V^(i) W_O^(i) (W_V [h,d,d_k], W_O [h,d_k,d])."""
    R_V = torch.linalg.qr(W_V.double(), mode="r").R  # [h, d_k, d_k]
    R_O = torch.linalg.qr(W_O.double().transpose(1, 2), mode="r").R  # [h, d_k, d_k]
    return R_V @ R_O.transpose(1, 2)


@torch.no_grad()
def weight_scores(model: HeadModel) -> dict[str, list[float]]:
    """Each weight method's score for every head, in ``model.head_ids`` order."""
    out: dict[str, list[float]] = {m: [] for m in WEIGHT_METHODS}
    for layer in model.active_layers:
        attn = model.h[layer].attn
        W_O = attn.W_O.double()  # [h, d_k, d]
        core = ov_core(attn.W_V, attn.W_O)
        out["wo_fro"] += torch.linalg.matrix_norm(W_O, "fro").tolist()
        out["wo_spec"] += torch.linalg.matrix_norm(W_O, 2).tolist()
        out["ov_fro"] += torch.linalg.matrix_norm(core, "fro").tolist()
        out["ov_spec"] += torch.linalg.matrix_norm(core, 2).tolist()
    return out


class WeightScores(Family):
    """Norms of W_O^(i) and of the OV circuit: one unit, no data."""

    name = "weights"
    methods = WEIGHT_METHODS
    needs_data = False

    def units(self, ctx: ScoringContext) -> list[Unit]:
        return [("weights", lambda: weight_scores(ctx.model))]

    def combine(self, ctx: ScoringContext, results: dict[str, Any]) -> FamilyScores:
        return FamilyScores({m: torch.tensor(v, dtype=torch.float64) for m, v in results["weights"].items()})
