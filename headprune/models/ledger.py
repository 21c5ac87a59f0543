"""The parameter and FLOP ledger of a GPT-2, and the shape trace of one attention call.

Per layer with h heads of width d_k (h·d_k = d for an unpruned GPT-2):
  W_O: h·d_k·d weights + d bias; GPT-2 small: 768·768 + 768 = 590,592.
  FLOPs per token (multiply-add = 2): W_O 2·h·d_k·d (= 2·d² = 1,179,648 for GPT-2 small),
  Q/K/V 3·2·d·h·d_k, scores QKᵀ and A·V 2·2·h·d_k·T at context T (counted over the full T×T square,
  as a dense kernel computes it).
"""

from __future__ import annotations

import copy

import pandas as pd
import torch

from headprune.models.gpt2 import GPT2
from headprune.models.hooks import Capture


def param_table(model: GPT2) -> pd.DataFrame:
    """Tidy parameter counts: one row per (layer, component); layer -1 for embeddings and the final norm."""
    if not isinstance(model, GPT2):  # another family: its own ledger
        from headprune.models.family_ledger import param_table as family_params

        return family_params(model)
    rows = [
        {"layer": -1, "component": "wte (tied LM head)" if model.lm_head is None else "wte",
         "params": model.wte.weight.numel()},
        {"layer": -1, "component": "wpe", "params": model.wpe.weight.numel()},
    ]
    for layer, blk in enumerate(model.h):
        attn = blk.attn
        rows += [
            {"layer": layer, "component": "ln_1", "params": sum(p.numel() for p in blk.ln_1.parameters())},
            {"layer": layer, "component": "attn.W_QKV",
             "params": attn.c_attn.weight.numel() + attn.c_attn.bias.numel()},
            {"layer": layer, "component": "attn.W_O", "params": attn.c_proj.weight.numel() + attn.c_proj.bias.numel()},
            {"layer": layer, "component": "ln_2", "params": sum(p.numel() for p in blk.ln_2.parameters())},
            {"layer": layer, "component": "mlp", "params": sum(p.numel() for p in blk.mlp.parameters())},
        ]
    rows.append({"layer": -1, "component": "ln_f", "params": sum(p.numel() for p in model.ln_f.parameters())})
    if model.lm_head is not None:
        rows.append({"layer": -1, "component": "lm_head", "params": model.lm_head.weight.numel()})
    return pd.DataFrame(rows)


def wo_table(model: GPT2) -> pd.DataFrame:
    """W_O per layer: heads kept, weights, bias, total, FLOPs per token (2·h·d_k·d)."""
    if not isinstance(model, GPT2):  # another family: b_O counts where its checkpoint stores one
        from headprune.models.family_ledger import attention_table

        t = attention_table(model, 1)
        return t.assign(W_O_total=t.W_O_weights + t.b_O)[["layer", "heads", "W_O_weights", "b_O", "W_O_total",
                                                          "W_O_flops_per_token"]]
    d = model.cfg.d_model
    rows = []
    for layer, blk in enumerate(model.h):
        a = blk.attn
        w = a.c_proj.weight.numel()
        rows.append({"layer": layer, "heads": a.n_heads, "W_O_weights": w, "b_O": d, "W_O_total": w + d,
                     "W_O_flops_per_token": 2 * a.n_heads * a.d_head * d})
    return pd.DataFrame(rows)


def attention_flops_per_token(model: GPT2, seq_len: int) -> int:
    """Attention FLOPs per token at context ``seq_len``: Q/K/V and W_O projections plus QKᵀ and A·V."""
    if not isinstance(model, GPT2):  # K/V projections of h_kv heads only
        from headprune.models.family_ledger import attention_flops_per_token as family_flops

        return family_flops(model, seq_len)
    d, total = model.cfg.d_model, 0
    for blk in model.h:
        hd = blk.attn.n_heads * blk.attn.d_head
        total += 2 * d * 3 * hd + 2 * hd * d + 2 * 2 * hd * seq_len
    return total


TRACE_ELEMENTS = 1 << 22  # attention probabilities a shape trace computes for real, at most


def shape_trace(model: GPT2, batch: int, seq_len: int, layer: int = 0) -> list[tuple[str, tuple[int, ...]]]:
    """Shapes met in one real attention call of ``layer`` on a (batch, seq_len) input: on the model's device where
    its attention probabilities are small (≤ ``TRACE_ELEMENTS``), else on the meta device (a copy of the layer),
    shapes without allocating whatever the sizes asked (meta's matmul imports torch._dynamo: 2 s once)."""
    small = batch * model.h[layer].attn.n_heads * seq_len**2 <= TRACE_ELEMENTS
    attn = model.h[layer].attn if small else copy.deepcopy(model.h[layer].attn).to("meta")
    device = model.device if small else torch.device("meta")
    x = torch.zeros(batch, seq_len, model.cfg.d_model, device=device, dtype=model.dtype)
    capture = Capture()
    with torch.no_grad():
        out = attn(x, capture=capture, need_weights=True)
        q = attn.c_attn(x)
    h, dk = attn.n_heads, attn.d_head
    z = capture.z.get(layer, torch.empty(batch, h, seq_len, dk, device="meta"))
    probs = capture.attn.get(layer, torch.empty(batch, h, seq_len, seq_len, device="meta"))
    return [
        ("x (B,T,d)", tuple(x.shape)),
        ("x W_QKV + b_QKV (B,T,3·h·d_k)", tuple(q.shape)),
        ("Q, K, V each (B,h,T,d_k)", (batch, h, seq_len, dk)),
        ("softmax(QKᵀ/√d_k) (B,h,T,T)", tuple(probs.shape)),
        ("z = A V (B,h,T,d_k)", tuple(z.shape)),
        ("concat_i z_i (B,T,h·d_k)", (batch, seq_len, h * dk)),
        ("concat W_O + b_O (B,T,d)", tuple(out.shape)),
    ]


def format_info(model: GPT2, batch: int, seq_len: int) -> str:
    """The ``info`` text: config, parameter ledger, W_O ledger and the attention shape trace (B = ``batch``,
    T = ``seq_len``); another family's ledger spells out its K/V sharing (:mod:`.family_ledger`)."""
    if not isinstance(model, GPT2):
        from headprune.models.family_ledger import format_info as format_family_info

        return format_family_info(model, seq_len)
    cfg = model.cfg
    params = param_table(model)
    wo = wo_table(model)
    lines = [
        f"model: {model.origin.source}",
        (f"config: n_layers={cfg.n_layers} n_heads={cfg.n_heads} d_model={cfg.d_model} d_head={cfg.d_head} "
         f"d_mlp={cfg.d_mlp} n_positions={cfg.n_positions} vocab_size={cfg.vocab_size} "
         f"heads_kept={sum(len(k) for k in cfg.kept_heads)}/{cfg.n_layers * cfg.n_heads}"),
        f"parameters: {int(params.params.sum()):,}",
    ]
    by_component = params.assign(component=params.component.where(params.layer < 0, "block." + params.component))
    for comp, n in by_component.groupby("component", sort=False).params.sum().items():
        lines.append(f"  {comp:<22} {int(n):>14,}")
    lines.append("W_O per layer (weights + bias = total, FLOPs/token = 2·h·d_k·d):")
    for r in wo.itertuples():
        lines.append(f"  layer {r.layer:>2}: heads {r.heads:>2}  {r.W_O_weights:,} + {r.b_O:,} = {r.W_O_total:,}  "
                     f"FLOPs/token {r.W_O_flops_per_token:,}")
    lines.append(f"W_O all layers: {int(wo.W_O_total.sum()):,} params, "
                 f"{int(wo.W_O_flops_per_token.sum()):,} FLOPs/token")
    lines.append(f"attention FLOPs/token at T={seq_len}: {attention_flops_per_token(model, seq_len):,}")
    lines.append(f"shape trace of one attention call (layer 0, B={batch}, T={seq_len}):")
    for name, shape in shape_trace(model, batch, seq_len):
        lines.append(f"  {name:<32} {shape}")
    return "\n".join(lines)


def pruning_stats(model_before: GPT2, model_after: GPT2, seq_len: int) -> dict[str, int]:
    """What pruning saved: heads, parameters (ledger.param_table), W_O parameters (ledger.wo_table) and
    attention FLOPs per token at context ``seq_len`` (ledger.attention_flops_per_token); before, after, removed."""
    measures = {
        "heads": lambda m: len(m.head_ids),
        "params": lambda m: int(param_table(m).params.sum()),
        "wo_params": lambda m: int(wo_table(m).W_O_total.sum()),
        "attention_flops_per_token": lambda m: int(attention_flops_per_token(m, seq_len)),
    }
    stats: dict[str, int] = {"seq_len": int(seq_len)}
    for name, fn in measures.items():
        before, after = fn(model_before), fn(model_after)
        stats.update({f"{name}_before": before, f"{name}_after": after, f"{name}_removed": before - after})
    return stats
