"""Q-, K- and V-composition scores between heads of different layers (Elhage et al., 2021, "A Mathematical
Framework for Transformer Circuits"; TransformerLens ``all_composition_scores``).

For head a of an earlier layer than head b, with W_OV = W_V W_O and W_QK = W_Q W_Kᵀ (d×d, rank ≤ d_k) on the
checkpoint's weights (LayerNorm not folded, biases left out):

    comp(a, b) = ‖W_OV^a W^b‖_F / (‖W_OV^a‖_F ‖W^b‖_F),   W^b = W_QK^b (q_comp), (W_QK^b)ᵀ (k_comp), W_OV^b (v_comp).

No d×d matrix is formed. Write W_OV^a = L_a R_a and W^b = L_b R_b with d×d_k / d_k×d factors and take thin QR
factorizations L_a = Q_a T_a, R_bᵀ = Q_b S_b (Q orthonormal). Then W_OV^a W^b = Q_a (T_a R_a L_b S_bᵀ) Q_bᵀ and

    ‖W_OV^a W^b‖_F = ‖(T_a R_a) (L_b S_bᵀ)‖_F,

the norm of a d_k×d_k core. With left factors X_a = T_a R_a (d_k×d) and right factors Y_b = L_b S_bᵀ (d×d_k)
stacked over heads, one layer's cores against every later layer's are one matmul [h·d_k, d] @ [d, H·d_k]: the
cost is d·d_k² per pair, against d³ for the dense product. The norms ‖L R‖_F come from the cores T Sᵀ alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from headprune.anatomy.geometry import one_thread
from headprune.models.base import HeadModel
from headprune.models.heads import head_id

MODES = ("q_comp", "k_comp", "v_comp")
CHUNK_HEADS = 256  # reading heads per core matmul


def _r(x: Tensor) -> Tensor:
    """[h, n, k] -> [h, k, k]: R of the thin QR of each matrix."""
    return torch.linalg.qr(x, mode="r").R


@dataclass
class HeadWeights:
    """One layer's attention weights in TransformerLens layout (W_Q/W_K/W_V [h, d, d_k], W_O [h, d_k, d]) and the
    original indices of its heads."""

    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_O: Tensor
    heads: list[int]


def model_head_weights(model: HeadModel) -> dict[int, HeadWeights]:
    """{layer: HeadWeights} of the layers of ``model`` that hold heads (views, no copies)."""
    out = {}
    for layer in model.active_layers:
        a = model.h[layer].attn
        out[layer] = HeadWeights(a.W_Q.detach(), a.W_K.detach(), a.W_V.detach(), a.W_O.detach(),
                                 model.cfg.kept_heads[layer])
    return out


def _factors(w: HeadWeights, dtype: torch.dtype, device: torch.device) -> dict[str, Tensor]:
    """Left factor of W_OV (as writer), right factors of W_QK, W_QKᵀ, W_OV (as reader), and the two norms."""
    W_Q, W_K, W_V = (x.to(device, torch.float64) for x in (w.W_Q, w.W_K, w.W_V))  # [h, d, d_k]
    W_O = w.W_O.to(device, torch.float64)  # [h, d_k, d]
    T_V, S_O, T_Q, T_K = _r(W_V), _r(W_O.transpose(1, 2)), _r(W_Q), _r(W_K)  # W_V = Q T_V, W_Oᵀ = Q S_O, ...
    f = {
        "left": T_V @ W_O,  # [h, d_k, d]: T_a R_a of W_OV^a = W_V^a W_O^a
        "q_comp": (W_Q @ T_K.transpose(1, 2)).transpose(1, 2),  # [h, d_k, d]: (L_b S_bᵀ)ᵀ, W_QK = W_Q W_Kᵀ
        "k_comp": (W_K @ T_Q.transpose(1, 2)).transpose(1, 2),  # W_QKᵀ = W_K W_Qᵀ
        "v_comp": (W_V @ S_O.transpose(1, 2)).transpose(1, 2),  # W_OV = W_V W_O
    }
    f = {name: t.to(dtype).reshape(-1, t.shape[-1]) for name, t in f.items()}  # [h·d_k, d]
    f["ov_norm"] = torch.linalg.matrix_norm(T_V @ S_O.transpose(1, 2))  # ‖W_OV‖_F [h]
    f["qk_norm"] = torch.linalg.matrix_norm(T_Q @ T_K.transpose(1, 2))  # ‖W_QK‖_F = ‖W_QKᵀ‖_F [h]
    return f


@torch.no_grad()
def composition_from_weights(weights: dict[int, HeadWeights], dtype: torch.dtype = torch.float32,
                             device: str | torch.device = "cpu") -> pd.DataFrame:
    """:func:`composition_scores` from per-layer weights (no model needed: the benchmark builds gpt2-xl's this way)."""
    device = torch.device(device)
    layers = sorted(weights)
    k = weights[layers[0]].W_O.shape[1] if layers else 1
    sizes = [len(weights[layer].heads) for layer in layers]
    H, d = sum(sizes), (weights[layers[0]].W_O.shape[2] if layers else 1)
    stacked = {name: torch.empty(H * k, d, dtype=dtype, device=device) for name in ("left", *MODES)}  # rows [H·d_k, d]
    stacked |= {name: torch.empty(H, dtype=torch.float64, device=device) for name in ("ov_norm", "qk_norm")}
    row = 0
    for layer, n in zip(layers, sizes):  # one layer's float64 intermediates at a time, written in place
        with one_thread():
            factors = _factors(weights[layer], dtype, device)
        for name, t in factors.items():
            rows = slice(row, row + n) if t.dim() == 1 else slice(row * k, (row + n) * k)
            stacked[name][rows] = t
        row += n
    heads = [(layer, h) for layer in layers for h in weights[layer].heads]
    starts = [0]
    for layer in layers:
        starts.append(starts[-1] + len(weights[layer].heads))
    columns = ["layer_a", "head_a", "layer_b", "head_b", *MODES]
    frames = []
    for i in range(len(layers) - 1):
        a0, a1 = starts[i], starts[i + 1]
        ha, hb = a1 - a0, len(heads) - a1
        left = stacked["left"][a0 * k:a1 * k]  # [h_a·d_k, d]
        cols = {}
        for mode in MODES:
            num = torch.empty(ha, hb, dtype=torch.float64, device=device)
            for b0 in range(0, hb, CHUNK_HEADS):  # at most CHUNK_HEADS reading heads at once: bounded memory
                b1 = min(hb, b0 + CHUNK_HEADS)
                right = stacked[mode][(a1 + b0) * k:(a1 + b1) * k]  # [n·d_k, d]: heads of later layers
                cores = (left @ right.T).view(ha, k, b1 - b0, k)  # [h_a, d_k, n, d_k]
                num[:, b0:b1] = torch.linalg.vector_norm(cores, dim=(1, 3), dtype=torch.float64)
            reader = stacked["ov_norm" if mode == "v_comp" else "qk_norm"][a1:]
            cols[mode] = (num / (stacked["ov_norm"][a0:a1, None] * reader[None, :])).cpu().reshape(-1).numpy()
        a_heads, b_heads = heads[a0:a1], heads[a1:]
        frames.append(pd.DataFrame({
            "layer_a": [a[0] for a in a_heads for _ in b_heads], "head_a": [a[1] for a in a_heads for _ in b_heads],
            "layer_b": [b[0] for _ in a_heads for b in b_heads], "head_b": [b[1] for _ in a_heads for b in b_heads],
            **cols}))
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
    out.insert(4, "head_a_id", [head_id(a, b) for a, b in zip(out.layer_a, out.head_a)])
    out.insert(5, "head_b_id", [head_id(a, b) for a, b in zip(out.layer_b, out.head_b)])
    return out


def composition_scores(model: HeadModel, dtype: torch.dtype = torch.float32, device: str | torch.device | None = None
                       ) -> pd.DataFrame:
    """Every pair (a, b) with layer_a < layer_b: columns layer_a, head_a, layer_b, head_b, head_a_id, head_b_id,
    q_comp, k_comp, v_comp (original head indices). The cores are multiplied in ``dtype`` (float64 for the
    tightest comparison) on ``device`` (default: the model's); the QR factors always in float64."""
    return composition_from_weights(model_head_weights(model), dtype, device if device is not None else model.device)
