"""The parameter and FLOP ledger of a family model (:mod:`headprune.models.ledger` is GPT-2's), with K/V
sharing spelled out.

Per layer with h query heads and h_kv KV heads of width d_k (multiply-add = 2 FLOPs, per token, context T):
  W_Q: d·h·d_k weights, W_K and W_V: d·h_kv·d_k each (a KV head is shared by its h/h_kv query heads),
  W_O: h·d_k·d weights (+ d bias where the checkpoint stores one);
  FLOPs: Q/K/V 2·d·(h + 2·h_kv)·d_k, W_O 2·h·d_k·d, scores QKᵀ and A·V 2·2·h·d_k·T (every query head attends,
  whatever it shares; the dense T×T square, as a dense kernel computes it).
"""

from __future__ import annotations

import pandas as pd

from headprune.models.base import HeadModel


def _stored(model: HeadModel, name: str, numel: int) -> int:
    """Parameters a checkpoint stores: b_O counts only where the family has one (it is zero otherwise)."""
    return numel if model.cfg.o_bias or not name.endswith(("o_proj.bias", "dense.bias")) else 0


def param_table(model: HeadModel) -> pd.DataFrame:
    """Tidy parameter counts: one row per (layer, component); layer -1 outside the blocks."""
    rows: dict[tuple[int, str], int] = {}
    for name, p in model.named_parameters():
        parts = name.split(".")
        if parts[0] == "h":  # h.{l}.attn.q_proj.weight -> (l, attn.q_proj); h.{l}.mlp.* -> (l, mlp)
            layer, component = int(parts[1]), ".".join(parts[2:4]) if parts[2] == "attn" else parts[2]
        else:
            layer, component = -1, parts[0]
        rows[(layer, component)] = rows.get((layer, component), 0) + _stored(model, name, p.numel())
    return pd.DataFrame([{"layer": l, "component": c, "params": n} for (l, c), n in rows.items()])


def attention_table(model: HeadModel, seq_len: int) -> pd.DataFrame:
    """Per layer: query and KV heads, query heads per KV head, W_O weights and bias, FLOPs per token."""
    d, out = model.cfg.d_model, []
    for layer, blk in enumerate(model.h):
        a = blk.attn
        h, h_kv, dk = a.n_heads, a.n_kv_heads, a.d_head
        out.append({"layer": layer, "heads": h, "kv_heads": h_kv, "shared_by": [a.kv_positions.count(g)
                                                                             for g in range(h_kv)],
                    "W_O_weights": h * dk * d, "b_O": d if model.cfg.o_bias else 0,
                    "W_O_flops_per_token": 2 * h * dk * d, "qkv_flops_per_token": 2 * d * (h + 2 * h_kv) * dk,
                    "score_flops_per_token": 4 * h * dk * seq_len})
    return pd.DataFrame(out)


def attention_flops_per_token(model: HeadModel, seq_len: int) -> int:
    t = attention_table(model, seq_len)
    return int((t.W_O_flops_per_token + t.qkv_flops_per_token + t.score_flops_per_token).sum())


def format_info(model: HeadModel, seq_len: int) -> str:
    cfg = model.cfg
    params, attn = param_table(model), attention_table(model, seq_len)
    from headprune.models.families import model_type

    family = model_type(model)
    lines = [
        f"model: {model.origin.source} ({family})",
        (f"config: n_layers={cfg.n_layers} n_heads={cfg.n_heads} n_kv_heads={cfg.n_kv_heads} d_model={cfg.d_model} "
         f"d_head={cfg.d_head} d_mlp={cfg.d_mlp} n_positions={cfg.n_positions} vocab_size={cfg.vocab_size} "
         f"heads_kept={len(model.head_ids)}/{cfg.n_layers * cfg.n_heads}"),
        (f"attention: {'multi-head' if cfg.n_kv_heads == cfg.n_heads else 'grouped-query'}, each KV head shared "
         f"by {cfg.n_heads // cfg.n_kv_heads} query head(s) before pruning"),
        f"parameters: {int(params.params.sum()):,}",
    ]
    by_component = params.assign(component=params.component.where(params.layer < 0, "block." + params.component))
    for comp, n in by_component.groupby("component", sort=False).params.sum().items():
        lines.append(f"  {comp:<30} {int(n):>14,}")
    lines.append("per layer (query heads / KV heads [query heads per KV head], W_O weights + bias, FLOPs/token):")
    for r in attn.itertuples():
        lines.append(f"  layer {r.layer:>2}: {r.heads:>2} / {r.kv_heads:>2} {r.shared_by}  {r.W_O_weights:,} + "
                     f"{r.b_O:,}  W_O {r.W_O_flops_per_token:,}  Q/K/V {r.qkv_flops_per_token:,}")
    lines.append(f"attention FLOPs/token at T={seq_len}: {attention_flops_per_token(model, seq_len):,}")
    return "\n".join(lines)
