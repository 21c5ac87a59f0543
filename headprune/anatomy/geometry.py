"""Geometry of the W_O row blocks: how much of the residual stream each head can write to, and how much the heads
of a layer write into the same directions.

- Singular values σ_1 ≥ … ≥ σ_{d_k} of W_O^(i) ∈ R^{d_k×d}.
- Effective rank (Roy & Vetterli, 2007, "The effective rank: a measure of effective dimensionality"):
  erank = exp(H(p)), p_j = σ_j / Σσ, H(p) = −Σ p_j ln p_j; between 1 (one direction) and d_k (flat spectrum).
- Principal angles θ_1 ≤ … ≤ θ_{d_k} between the row spaces of two heads of a layer (Björck & Golub, 1973):
  cos θ_j are the singular values of Q_iᵀ Q_j, Q orthonormal bases of the row spaces. ``overlap`` = mean cos²θ
  = ‖Q_iᵀ Q_j‖_F² / d_k: 1 for the same subspace, 0 for orthogonal ones, d_k/d in expectation for random ones.
- ``overlap_rest``: the same between head i and the span of all the other heads of its layer: the share of what
  head i writes that the other heads could also write (random expectation min(1, (h−1)·d_k/d)).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pandas as pd
import torch
from torch import Tensor

from headprune.models.base import HeadModel
from headprune.models.heads import head_id


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run small LAPACK calls (SVD, QR, eig of matrices of a few hundred rows) on one thread: at these sizes
    threading only adds overhead, badly so on a busy machine (measured: a batched 8×224×256 SVD 0.08 s of CPU on
    one thread, 3 s on two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def effective_rank(singular_values: Tensor) -> Tensor:
    """[..., n] nonnegative -> [...] exp of the entropy of σ/Σσ (0·ln 0 = 0)."""
    p = singular_values / singular_values.sum(-1, keepdim=True)
    return torch.exp(-torch.special.xlogy(p, p).sum(-1))


def row_bases(W_O: Tensor) -> Tensor:
    """[h, d_k, d] -> [h, d, r]: orthonormal bases of each head's row space (r = d_k; rank-deficient heads get
    the basis of their numerical rank padded with zero columns)."""
    _, S, Vh = torch.linalg.svd(W_O.double(), full_matrices=False)  # Vh [h, d_k, d]
    keep = S > S.amax(-1, keepdim=True) * max(W_O.shape[-2:]) * torch.finfo(torch.float64).eps
    return (Vh * keep[..., None]).transpose(1, 2)


def principal_cosines(Q_a: Tensor, Q_b: Tensor) -> Tensor:
    """Orthonormal bases [..., d, r_a], [..., d, r_b] -> [..., min(r)] cosines of the principal angles, descending."""
    return torch.linalg.svdvals(Q_a.transpose(-1, -2) @ Q_b).clamp(max=1.0)


@torch.no_grad()
def wo_geometry(model: HeadModel) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(heads, singular_values, pairs):

    heads: layer, head, head_id, wo_sv_max, wo_eff_rank, wo_overlap (mean pairwise overlap with the layer's other
    heads), wo_overlap_rest (overlap with the span of all of them); singular_values: layer, head, head_id, index,
    sigma; pairs: layer, head_a, head_b, overlap, min_angle_deg, max_angle_deg, for every pair of heads of a layer.
    """
    with one_thread():
        return _geometry(model)


def _geometry(model: HeadModel) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    heads: list[dict] = []
    svs: list[dict] = []
    pairs: list[dict] = []
    for layer in model.active_layers:
        W_O = model.h[layer].attn.W_O.double()  # [h, d_k, d]
        kept = model.cfg.kept_heads[layer]
        h, k = W_O.shape[0], W_O.shape[1]
        sigma = torch.linalg.svdvals(W_O)  # [h, d_k]
        erank = effective_rank(sigma)
        Q = row_bases(W_O)  # [h, d, d_k]
        cos = principal_cosines(Q[:, None], Q[None, :])  # [h, h, d_k]
        overlap = cos.square().sum(-1) / k  # [h, h]
        rest = torch.full((h,), torch.nan, dtype=torch.float64)
        if h > 1:  # the span of the other heads' rows: one batched SVD of their stacked W_O, [h, (h−1)·d_k, d]
            others = torch.stack([W_O[[j for j in range(h) if j != i]].reshape(-1, W_O.shape[-1]) for i in range(h)])
            rest = (Q.transpose(1, 2) @ row_bases(others)).square().sum((1, 2)) / k  # ‖Q_iᵀ Q_rest‖_F² / d_k
        for i, head in enumerate(kept):
            others_i = [j for j in range(h) if j != i]
            heads.append({"layer": layer, "head": head, "head_id": head_id(layer, head),
                          "wo_sv_max": float(sigma[i, 0]), "wo_eff_rank": float(erank[i]),
                          "wo_overlap": float(overlap[i, others_i].mean()) if others_i else float("nan"),
                          "wo_overlap_rest": float(rest[i])})
            svs += [{"layer": layer, "head": head, "head_id": head_id(layer, head), "index": j, "sigma": float(s)}
                    for j, s in enumerate(sigma[i])]
            for j in range(i + 1, h):
                angles = torch.rad2deg(torch.arccos(cos[i, j]))
                pairs.append({"layer": layer, "head_a": head, "head_b": kept[j], "overlap": float(overlap[i, j]),
                              "min_angle_deg": float(angles.min()), "max_angle_deg": float(angles.max())})
    return pd.DataFrame(heads), pd.DataFrame(svs), pd.DataFrame(pairs)
