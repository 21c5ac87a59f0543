"""Direct logit attribution (DLA) of every head to the correct next token, through the final LayerNorm with its
scale frozen (Elhage et al., 2021, "A Mathematical Framework for Transformer Circuits"; nostalgebraist's logit lens).

The final residual stream at a position is a sum of components c: the embeddings (token + position), each
head's z_i W_O^(i), each layer's b_O and each MLP's output. The final LayerNorm is
ln_f(x) = γ ⊙ (x − mean(x)) / σ(x) + β; freezing σ at the full stream's value makes it linear, so the logit of the
correct next token t (unembedding column u_t) splits exactly:

    logit_t = Σ_c (c − mean(c)) · (γ ⊙ u_t) / σ  +  β · u_t.

A head's DLA is the mean of its term over the scored positions (every position but the last of each row);
the terms of all components plus the LN bias term average to the mean correct-token logit.

Every family: Llama, Mistral and Qwen end in RMSNorm(x) = w ⊙ x / ρ(x), ρ = √(mean(x²) + ε): freezing ρ, the split
is logit_t = Σ_c c · (w ⊙ u_t) / ρ (no centring, no bias term: ``ln_bias`` is 0); GPT-NeoX ends in a LayerNorm as
GPT-2 does. u_t is the family's unembedding row (``lm_head`` / ``embed_out``, or the tied embedding); embed is the
token embedding (rotary adds no residual component). A block's MLP term is what the block adds beyond its attention
output (resid_post − resid_pre − attn_out), exact up to rounding for sequential and parallel residuals alike.
Gemma 3 normalises the attention output before adding it (x ← x + N(attn_out), N(a) = a ⊙ s(a)): with s frozen
at the forward's value, each head's and b_O's term is read along direction ⊙ s, and its final norm multiplies by
1 + w (the norm's ``gain``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from headprune.errors import HeadpruneError
from headprune.models.base import HeadModel
from headprune.models.families import ModelFamily, family_of
from headprune.models.heads import head_id
from headprune.models.hooks import Capture
from headprune.models.memory import capture_windows


@dataclass
class Attribution:
    """heads: layer, head, head_id, dla (nats... logits, mean over positions); components: every residual
    component's mean term (component, value); logit: the mean correct-token logit; positions: how many."""

    heads: pd.DataFrame
    components: pd.DataFrame
    logit: float
    positions: int


@torch.no_grad()
def logit_attribution(model: HeadModel, tokens: Tensor, batch_size: int = 8) -> Attribution:
    """DLA of every head (and of every other residual component) on ``tokens`` (B,T), rows scored independently,
    at most :func:`~headprune.models.memory.capture_windows` rows at a time."""
    if tokens.dim() != 2 or tokens.shape[1] < 2:
        raise HeadpruneError(f"logit attribution needs (batch, T) tokens with T >= 2, got shape {tuple(tokens.shape)}")
    model.require_heads("logit attribution")
    L = model.cfg.n_layers
    sums: dict[str, Tensor] = {}

    def add(name: str, term: Tensor) -> None:  # term (b, T-1) or (b, h, T-1): summed over rows and positions
        total = term.double().sum(dim=(0, -1)).cpu()
        sums[name] = sums[name] + total if name in sums else total

    logit_sum = 0.0
    step = min(batch_size, capture_windows(model.cfg, tokens.shape[1]))
    family = family_of(model)  # its final norm: LayerNorm (centred, with a bias) or RMSNorm (w, or Gemma's 1 + w)
    for start in range(0, len(tokens), step):
        chunk = tokens[start:start + step].to(model.device)
        capture = Capture()
        embed = model.embed(chunk)  # (b,T,d)
        final = model.run_blocks(embed, capture=capture)  # (b,T,d)
        norm: Any = model.final_norm
        u = model.W_U[chunk[:, 1:]].float()  # (b,T-1,d): u_t of the correct next tokens
        direction = _read_direction(family, norm, final[:, :-1].float(), u)

        def term(c: Tensor, direction: Tensor = direction) -> Tensor:  # c (b,T,d) -> (b,T-1)
            return (c[:, :-1].float() * direction).sum(-1)

        add("embed", term(embed))
        bias = norm.bias if family.norm == "layer" else None
        add("ln_bias", (bias.float() * u).sum(-1) if bias is not None else u.new_zeros(u.shape[:2]))
        for layer in range(L):
            blk = model.h[layer]
            attn_out = blk.attn.b_O.expand_as(embed)
            if blk.attn.n_heads:
                z = capture.z[layer]  # (b,h,T,d_k)
                W_O = blk.attn.W_O.float()  # [h,d_k,d]
                attn_out = (z.transpose(1, 2).reshape(*embed.shape[:2], -1).float() @ W_O.reshape(-1, W_O.shape[-1])
                            + blk.attn.b_O)
            # a post-attention norm (Gemma) scales what attention writes by s, frozen like σ: c ⊙ s · direction
            s = blk.attn_write_scale(attn_out)  # (b,T,d) or None
            read_dir = direction * s[:, :-1] if s is not None else direction
            if blk.attn.n_heads:
                read = torch.einsum("bpd,hkd->bhpk", read_dir, W_O)  # (b,h,T-1,d_k): W_O^(i) · direction
                add(f"heads.{layer}", (capture.z[layer][:, :, :-1].float() * read).sum(-1))  # (b,h,T-1)
            add(f"b_O.{layer}", term(blk.attn.b_O.expand_as(embed), read_dir))
            # what the block adds beyond attention (parallel or sequential residual alike)
            post = capture.resid_pre[layer + 1] if layer + 1 < L else final
            written = attn_out.float() * s if s is not None else attn_out.float()
            mlp_out = post.float() - capture.resid_pre[layer].float() - written
            add(f"mlp.{layer}", term(mlp_out))
        # the logit the terms split: the final norm and W_U (before any soft-capping, which is not linear)
        # (only the correct tokens' rows of W_U: u (b,T-1,d), never the (b,T-1,V) logits)
        logits = (model.final_norm(final)[:, :-1].float() * u).sum(-1)  # (b,T-1)
        logit_sum += float(logits.double().sum())
    n = tokens.shape[0] * (tokens.shape[1] - 1)
    heads, components = _tables(model, sums, n)
    return Attribution(heads, components, logit_sum / n, n)


def _read_direction(family: ModelFamily, norm: Any, x: Tensor, u: Tensor) -> Tensor:
    """The direction a residual component c is read along by the correct token's logit through the final norm,
    its scale σ frozen: c · (g ⊙ u − mean) / σ for a LayerNorm, c · (g ⊙ u) / ρ for an RMSNorm (g: w, or Gemma's
    1 + w). ``x`` (b,T-1,d) the final residual, ``u`` (b,T-1,d) the correct tokens' rows of W_U."""
    centred = family.norm == "layer"
    spread = x.var(-1, unbiased=False, keepdim=True) if centred else x.pow(2).mean(-1, keepdim=True)
    sigma = (spread + norm.eps).sqrt()  # (b,T-1,1), frozen
    direction = family.norm_gain(norm).float() * u
    if centred:
        direction = direction - direction.mean(-1, keepdim=True)
    return direction / sigma


def _tables(model: HeadModel, sums: dict[str, Tensor], n: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each head's DLA and each residual component's mean term, from the sums over ``n`` positions."""
    L = model.cfg.n_layers
    rows = []
    for layer, head in model.head_ids:
        i = model.cfg.kept_heads[layer].index(head)
        rows.append({"layer": layer, "head": head, "head_id": head_id(layer, head),
                     "dla": float(sums[f"heads.{layer}"][i]) / n})
    components = [("embed", float(sums["embed"]) / n)]
    for layer in range(L):
        components += [(f"L{layer}.heads", float(sums[f"heads.{layer}"].sum()) / n)] if f"heads.{layer}" in sums else []
        components += [(f"L{layer}.b_O", float(sums[f"b_O.{layer}"]) / n),
                       (f"L{layer}.mlp", float(sums[f"mlp.{layer}"]) / n)]
    components.append(("ln_bias", float(sums["ln_bias"]) / n))
    return pd.DataFrame(rows), pd.DataFrame(components, columns=["component", "value"])
