"""The parameter and FLOP ledger of every family, with K/V sharing spelled out, and the shapes of one attention call.

Per layer with h query heads and h_kv KV heads of width d_k (h·d_k = d and h_kv = h for an unpruned GPT-2), per
token (multiply-add = 2 FLOPs) at context T:
  W_Q: d·h·d_k weights, W_K and W_V: d·h_kv·d_k each (a KV head is shared by its h/h_kv query heads);
  W_O: h·d_k·d weights + d bias where the checkpoint stores one; GPT-2 small: 768·768 + 768 = 590,592;
  FLOPs: W_O 2·h·d_k·d (= 2·d² = 1,179,648 for GPT-2 small), Q/K/V 2·d·(h + 2·h_kv)·d_k, scores QKᵀ and A·V
  2·2·h·d_k·T (every query head attends, whatever it shares; the dense T×T square, as a dense kernel computes it).
"""

from __future__ import annotations

import pandas as pd
import torch

from headprune.models.base import HeadModel
from headprune.models.families import layout_text, model_type
from headprune.models.hooks import Capture


def _stored(model: HeadModel, name: str, numel: int) -> int:
    """Parameters a checkpoint stores: b_O counts only where the family has one (it is zero otherwise)."""
    return numel if model.cfg.o_bias or not name.endswith(("o_proj.bias", "dense.bias")) else 0


def _component(model: HeadModel, name: str) -> tuple[int, str]:
    """(layer, component) of a parameter: attention weights by their role (``attn.W_O``, ``attn.W_QKV``, ...),
    other block parts by module (``ln_1``, ``mlp``); layer -1 outside the blocks."""
    parts = name.split(".")
    if parts[0] == "h":
        layer = int(parts[1])
        if parts[2] == "attn":
            return layer, "attn." + model.h[layer].attn.PARAM_ROLES.get(parts[3], parts[3])
        return layer, parts[2]
    tied = parts[0] == model.embedding_name and model.cfg.tie_word_embeddings
    return -1, parts[0] + (" (tied LM head)" if tied else "")


def param_table(model: HeadModel) -> pd.DataFrame:
    """Tidy parameter counts: one row per (layer, component); layer -1 outside the blocks."""
    rows: dict[tuple[int, str], int] = {}
    for name, p in model.named_parameters():
        key = _component(model, name)
        rows[key] = rows.get(key, 0) + _stored(model, name, p.numel())
    return pd.DataFrame([{"layer": l, "component": c, "params": n} for (l, c), n in rows.items()])


def attention_table(model: HeadModel, seq_len: int) -> pd.DataFrame:
    """Per layer: query and KV heads, query heads per KV head, W_O weights and bias, FLOPs per token."""
    d, out = model.cfg.d_model, []
    for layer, blk in enumerate(model.h):
        a = blk.attn
        h, h_kv, dk = a.n_heads, a.n_kv_heads, a.d_head
        out.append({"layer": layer, "heads": h, "kv_heads": h_kv,
                    "shared_by": [a.kv_positions.count(g) for g in range(h_kv)],
                    "W_O_weights": h * dk * d, "b_O": d if model.cfg.o_bias else 0,
                    "W_O_flops_per_token": 2 * h * dk * d, "qkv_flops_per_token": 2 * d * (h + 2 * h_kv) * dk,
                    "score_flops_per_token": 4 * h * dk * seq_len})
    return pd.DataFrame(out)


def wo_table(model: HeadModel) -> pd.DataFrame:
    """W_O per layer: heads kept, weights, bias, total, FLOPs per token (2·h·d_k·d)."""
    t = attention_table(model, 1)
    return t.assign(W_O_total=t.W_O_weights + t.b_O)[["layer", "heads", "W_O_weights", "b_O", "W_O_total",
                                                      "W_O_flops_per_token"]]


def attention_flops_per_token(model: HeadModel, seq_len: int) -> int:
    """Attention FLOPs per token at context ``seq_len``: Q/K/V and W_O projections plus QKᵀ and A·V."""
    t = attention_table(model, seq_len)
    return int((t.W_O_flops_per_token + t.qkv_flops_per_token + t.score_flops_per_token).sum())


TRACE_ELEMENTS = 1 << 22  # attention probabilities a shape trace computes for real, at most


def shape_trace(model: HeadModel, batch: int, seq_len: int, layer: int = 0) -> list[tuple[str, tuple[int, ...]]]:
    """Shapes met in one attention call of ``layer`` on a (batch, seq_len) input: read off a real call where its
    attention probabilities are small (≤ ``TRACE_ELEMENTS``), else from the config (nothing allocated)."""
    attn, d = model.h[layer].attn, model.cfg.d_model
    B, T, h, h_kv, dk = batch, seq_len, attn.n_heads, attn.n_kv_heads, attn.d_head
    shapes = [(B, T, d), (B, h, T, dk), (B, h_kv, T, dk), (B, h, T, T), (B, h, T, dk), (B, T, h * dk), (B, T, d)]
    if B * h * T * T <= TRACE_ELEMENTS and h:
        x = torch.zeros(B, T, d, device=model.device, dtype=model.dtype)
        capture = Capture()
        with torch.no_grad():
            q, k, _ = model.qkv(layer, x)
            model.run_blocks(x, start=layer, stop=layer + 1, capture=capture, need_weights=True)
            z = capture.z[layer]
            concat = z.transpose(1, 2).reshape(B, T, -1)
            out = concat @ attn.W_O.reshape(-1, d) + attn.b_O
        shapes = [tuple(t.shape) for t in (x, q, k, capture.attn[layer], z, concat, out)]
    names = ["x (B,T,d)", "q = x W_Q (B,h,T,d_k)", "k, v = x W_K, x W_V (B,h_kv,T,d_k)",
             "softmax(q kᵀ·scale) (B,h,T,T)", "z = A v (B,h,T,d_k)", "concat_i z_i (B,T,h·d_k)",
             "concat W_O + b_O (B,T,d)"]
    return list(zip(names, shapes))


def format_info(model: HeadModel, batch: int, seq_len: int) -> str:
    """The ``info`` text: config, parameter ledger, attention ledger (W_O and the K/V sharing per layer) and the
    shapes of one attention call (B = ``batch``, T = ``seq_len``)."""
    cfg = model.cfg
    params, attn = param_table(model), attention_table(model, seq_len)
    lines = [
        f"model: {model.origin.source} ({model_type(model)})",
        (f"config: n_layers={cfg.n_layers} n_heads={cfg.n_heads} n_kv_heads={cfg.n_kv_heads} d_model={cfg.d_model} "
         f"d_head={cfg.d_head} d_mlp={cfg.d_mlp} n_positions={cfg.n_positions} vocab_size={cfg.vocab_size} "
         f"heads_kept={len(model.head_ids)}/{cfg.n_layers * cfg.n_heads}"),
        f"attention: {layout_text(model)} before pruning",
        f"parameters: {int(params.params.sum()):,}",
    ]
    by_component = params.assign(component=params.component.where(params.layer < 0, "block." + params.component))
    for comp, n in by_component.groupby("component", sort=False).params.sum().items():
        lines.append(f"  {comp:<30} {int(n):>14,}")
    lines.append("per layer: query / KV heads [query heads per KV head]; W_O weights + bias = total, FLOPs/token "
                 "(W_O = 2·h·d_k·d; Q/K/V):")
    for row in attn.to_dict("records"):
        w, b = int(row["W_O_weights"]), int(row["b_O"])
        lines.append(f"  layer {row['layer']:>2}: {row['heads']:>2} / {row['kv_heads']:>2} {row['shared_by']}  "
                     f"{w:,} + {b:,} = {w + b:,}  W_O {row['W_O_flops_per_token']:,}  "
                     f"Q/K/V {row['qkv_flops_per_token']:,}")
    lines.append(f"W_O all layers: {int((attn.W_O_weights + attn.b_O).sum()):,} params, "
                 f"{int(attn.W_O_flops_per_token.sum()):,} FLOPs/token")
    lines.append(f"attention FLOPs/token at T={seq_len}: {attention_flops_per_token(model, seq_len):,}")
    lines.append(f"shape trace of one attention call (layer 0, B={batch}, T={seq_len}):")
    for name, shape in shape_trace(model, batch, seq_len):
        lines.append(f"  {name:<36} {shape}")
    return "\n".join(lines)


def pruning_stats(model_before: HeadModel, model_after: HeadModel, seq_len: int) -> dict[str, int]:
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
