"""Copying score of each head's full OV circuit (Elhage et al., 2021, "A Mathematical Framework for Transformer
Circuits"): the vocab×vocab matrix M_i = W_E W_V^(i) W_O^(i) W_U maps a token attended to onto the logits it
raises; a head that copies has mostly positive eigenvalues. Score = Σλ / Σ|λ| over the eigenvalues of M_i
(real: complex ones come in conjugate pairs), in [−1, 1].

M_i = (W_E W_V^(i)) (W_O^(i) W_U) has rank ≤ d_k, and for any A (n×k), B (k×n) the nonzero eigenvalues of AB are
those of BA (with multiplicity). So the eigenvalues come from the d_k×d_k core

    C_i = W_O^(i) (W_U W_E) W_V^(i),   W_U W_E ∈ R^{d×d} formed once,

and the zero eigenvalues of M_i add nothing to either sum. W_E is the token embedding, W_U the unembedding
(tied: W_Eᵀ); checkpoint weights, LayerNorm not folded, biases left out. Every family: under GQA W_V^(i) is
the weights of query head i's KV head; rotary does not act on the OV circuit.
"""

from __future__ import annotations

import pandas as pd
import torch
from torch import Tensor

from headprune.anatomy.geometry import one_thread
from headprune.models.base import HeadModel
from headprune.models.heads import head_id


def copying_score(eigenvalues: Tensor) -> Tensor:
    """[..., n] complex eigenvalues -> [...] Σλ / Σ|λ| (real part of the numerator)."""
    return eigenvalues.sum(-1).real / eigenvalues.abs().sum(-1)


GRAM_ROWS = 16384  # vocabulary rows of W_U W_E formed at once in float64 (84 MB at d = 640)


@torch.no_grad()
def ov_circuit_cores(model: HeadModel) -> dict[int, Tensor]:
    """{layer: [h, d_k, d_k]} cores W_O^(i) (W_U W_E) W_V^(i), float64."""
    W_U = model.W_U  # [V, d], in the model's dtype
    gram = torch.zeros(W_U.shape[1], W_U.shape[1], dtype=torch.float64, device=W_U.device)  # [d, d] = W_U W_E
    for rows in range(0, W_U.shape[0], GRAM_ROWS):  # a block of vocabulary rows at a time, never [V, d] copies
        W_E = model.embedding_rows(rows, rows + GRAM_ROWS)  # [≤GRAM_ROWS, d]
        gram += W_U[rows:rows + GRAM_ROWS].double().T @ W_E.double()
    return {layer: model.h[layer].attn.W_O.double() @ gram @ model.h[layer].attn.W_V.double()
            for layer in model.active_layers}


@torch.no_grad()
def copying_scores(model: HeadModel) -> pd.DataFrame:
    """layer, head, head_id, copying: Σλ/Σ|λ| of every head's full OV circuit W_E W_V^(i) W_O^(i) W_U."""
    rows = []
    for layer, cores in ov_circuit_cores(model).items():
        with one_thread():
            scores = copying_score(torch.linalg.eigvals(cores))  # [h]
        rows += [{"layer": layer, "head": head, "head_id": head_id(layer, head), "copying": float(s)}
                 for head, s in zip(model.cfg.kept_heads[layer], scores)]
    return pd.DataFrame(rows)
