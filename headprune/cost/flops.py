"""FLOPs counted from the model itself, and each piece of work in forward-equivalents (fe) of the tokens it runs on.

One forward of N tokens in windows of T costs N·F FLOPs, F per token from the model's own shapes (multiply-add = 2):

    F = Σ_l [ 2·d·(h_l + 2·h_kv,l)·d_k + 2·h_l·d_k·d      Q/K/V and W_O (the ledger's attention table)
            + 4·h_l·d_k·T                                 QKᵀ and A·V over the window
            + 2·m·d·d_mlp ]                               the MLP: m = 3 matrices (gated: SwiGLU, GeGLU) or 2
        + 2·d·V                                           the LM head

Each scoring family in fe: weights ≈ 0, data (activations) 1, gradients 2, each ablation method
A = 1 + Σ_l h_l·((c_l + … + c_{L−1}) + u) / F: a head of layer l reruns layers l..L−1 and the LM head from the cached
residual stream (u = 2·d·V, c_l the FLOPs of block l).
"""

from __future__ import annotations

from headprune.models.base import HeadModel
from headprune.models.families import family_of
from headprune.models.ledger import attention_table
from headprune.schema import METHOD_SPECS, VERIFY_ROUNDS


def block_flops(model: HeadModel, seq_len: int) -> list[float]:
    """FLOPs per token of each block (attention projections, scores over ``seq_len``, MLP)."""
    t = attention_table(model, seq_len)
    d, d_mlp = model.cfg.d_model, model.cfg.d_mlp
    mlp_mats = 3 if family_of(model).mlp == "gated" else 2  # gated (SwiGLU / GeGLU): gate, up, down
    attn = t.qkv_flops_per_token + t.W_O_flops_per_token + t.score_flops_per_token
    return [float(a) + 2 * mlp_mats * d * d_mlp for a in attn]


def head_flops(model: HeadModel) -> float:
    """FLOPs per token of the LM head, 2·d·V."""
    return 2.0 * model.cfg.d_model * model.cfg.vocab_size


def forward_flops(model: HeadModel, seq_len: int) -> float:
    """FLOPs per token of one forward: F = Σ_l c_l + u."""
    return sum(block_flops(model, seq_len)) + head_flops(model)


def ablation_fe(model: HeadModel, seq_len: int, kv: bool = False) -> float:
    """Forward-equivalents of one ablation method's sweep: the shared baseline forward, then every head of layer l
    (every KV head where ``kv``) rerunning layers l..L−1 and the LM head."""
    blocks, u = block_flops(model, seq_len), head_flops(model)
    per_head = sum((blk.attn.n_kv_heads if kv else blk.attn.n_heads) * (sum(blocks[layer:]) + u)
                   for layer, blk in enumerate(model.h))
    return 1.0 + per_head / forward_flops(model, seq_len)


def layers_fe(model: HeadModel, seq_len: int) -> float:
    """Forward-equivalents of :func:`headprune.scoring.layers.layer_ablation`: the shared baseline forward, then
    each layer with heads rerunning layers l..L−1 and the LM head once (all its heads zeroed together)."""
    blocks, u = block_flops(model, seq_len), head_flops(model)
    rerun = sum(sum(blocks[layer:]) + u for layer, blk in enumerate(model.h) if blk.attn.n_heads)
    return 1.0 + rerun / forward_flops(model, seq_len)


def verify_fe(model: HeadModel, seq_len: int, verified: int, subsets: int, estimate: str | None = "taylor",
              rounds: int = VERIFY_ROUNDS, method: str = "abl_zero") -> dict[str, float]:
    """Forward-equivalents of :func:`headprune.scoring.verified.verify_ranking` (``total``), beside the exact
    sweep's (``sweep``) and the estimate's own pass (``estimate``, counted in ``total``, 0 where not computed): the
    ``estimate`` computed here (taylor: a forward and a backward; None: read from a table), the baseline forward
    (again for each later round's cached residual stream), the ``verified`` units of each round at the sweep's mean
    cost per unit (a query head, or for ``ctx_stream`` a KV head), and a forward per subset (its lowest layer is
    nearly always early)."""
    kv = METHOD_SPECS[method].kv_sweep
    sweep = ablation_fe(model, seq_len, kv)
    units = sum(model.h[layer].attn.n_kv_heads for layer in range(model.cfg.n_layers)) if kv else len(model.head_ids)
    per_unit = (sweep - 1.0) / units
    estimate_fe = (METHOD_SPECS[estimate].shared_fe or 0.0) if estimate is not None else 0.0
    total = estimate_fe + rounds * (1.0 + verified * per_unit) + subsets
    return {"total": total, "sweep": sweep, "estimate": estimate_fe}


def methods_fe(model: HeadModel, methods: list[str], seq_len: int) -> dict[str, float]:
    """Forward-equivalents of ``methods`` from their records (:class:`~headprune.schema.MethodSpec`): one shared
    pass per family (keyed by family), each ablation method's own sweeps (keyed by method)."""
    out: dict[str, float] = {}
    for method in methods:
        spec = METHOD_SPECS[method]
        if spec.shared_fe is not None:
            out[spec.family] = spec.shared_fe
        else:
            out[method] = ablation_fe(model, seq_len, spec.kv_sweep) * spec.sweeps
    return out
