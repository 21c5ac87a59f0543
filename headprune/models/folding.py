"""Exact weight rewrites that leave every logit unchanged.

Value-bias folding. Attention rows sum to 1, so head i's output is

    z_i = A (X W_V^(i) + 1 b_V^(i)) = A X W_V^(i) + b_V^(i)

and the layer adds the constant b_V^(i) W_O^(i) at every position, whatever the head attends to. The rewrite

    b_O ← b_O + Σ_i b_V^(i) W_O^(i),        b_V ← 0

moves that constant into the output bias: the logits are unchanged, and afterwards zeroing z_i (zero ablation,
pruning) removes only what the head computes, not the constant (transformers 4.x's head_mask and plain
``abl_zero`` remove both). ``abl_zero_folded`` is zero ablation of the folded model.
"""

from __future__ import annotations

import copy

import torch

from headprune.models.base import HeadModel


@torch.no_grad()
def fold_value_biases(model: HeadModel) -> HeadModel:
    """A copy of ``model`` with every head's value bias folded into its layer's b_O (the input is not changed)."""
    return fold_value_biases_(copy.deepcopy(model))


@torch.no_grad()
def fold_value_biases_(model: HeadModel) -> HeadModel:
    """:func:`fold_value_biases` in place (no second copy of the model): returns ``model`` itself."""
    folded, moved = model, False
    for layer in folded.active_layers:
        attn = folded.h[layer].attn
        shift = torch.einsum("hk,hkd->d", attn.b_V.double(), attn.W_O.double())  # Σ_i b_V^(i) W_O^(i)  [d]
        attn.b_O.copy_((attn.b_O.double() + shift).to(attn.b_O.dtype))
        moved |= bool(shift.any())
        # the stored value biases, per KV head (b_V gives each query head its KV head's b_V^(g(i)), a copy under
        # grouped-query attention; b_V_kv is a view of the stored bias)
        attn.b_V_kv.zero_()
    if moved:
        folded.cfg.o_bias = True  # the model stores an o_proj bias now
    return folded


def has_value_biases(model: HeadModel) -> bool:
    """Whether any head still has a non-zero value bias (False after :func:`fold_value_biases`)."""
    return any(bool(model.h[layer].attn.b_V.any()) for layer in model.active_layers)
