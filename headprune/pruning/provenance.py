"""Where a pruned export came from, checked by content before fine-tuning trusts it.

- The teacher of ``finetune --teacher`` must be the model the export was pruned from: ``prune`` records that
  model's fingerprint (``source_fingerprint`` in ``headprune_export.json``, with ``fold_value_bias``), and the
  teacher, loaded the same way, must have it. An export without the record (made by another tool or an older
  headprune) is checked by shape only.
- An ``hf`` export's ``removed_heads`` must name heads that really are zero: every Q/K/V column, bias and W_O
  row of the head exactly 0 (as :func:`headprune.io.write.export.export_hf` writes them); otherwise "removing" them
  again would change the model the user exported.
"""

from __future__ import annotations

from headprune.errors import HeadpruneError, warn


def check_teacher(teacher, student, marker: dict, teacher_source: str) -> None:
    """HeadpruneError unless ``teacher`` is the model the export (record ``marker``) was pruned from."""
    from headprune.io.read.fingerprint import model_fingerprint

    tc, sc = teacher.cfg, student.cfg
    for name in ("vocab_size", "n_positions", "n_layers", "d_model"):
        if getattr(tc, name, None) != getattr(sc, name, None):
            raise HeadpruneError(f"the teacher {teacher_source} has {name} {getattr(tc, name, None)}, the pruned model "
                                 f"{getattr(sc, name, None)}: distil from the model that was pruned")
    recorded = marker.get("source_fingerprint")
    if recorded is None:
        warn(f"the export does not record the model it was pruned from; cannot check that {teacher_source} is it")
        return
    if (mine := model_fingerprint(teacher)) != recorded:
        raise HeadpruneError(f"the teacher {teacher_source} (fingerprint {mine}) is not the model the export "
                             f"was pruned from (fingerprint {recorded}); pass the original model as --teacher")


def check_removed_heads_zero(model, heads: list[tuple[int, int]], folder) -> None:
    """HeadpruneError unless every listed head of the full-width (zeroed hf export) ``model`` contributes exactly 0:
    its W_Q^(i), b_Q^(i) and W_O^(i) are zero (z_i W_O^(i) = 0 whatever it attends to)."""
    cfg = model.cfg
    for layer, head in heads:
        if not (0 <= layer < cfg.n_layers and 0 <= head < cfg.n_heads):
            raise HeadpruneError(f"{folder}: the export record lists L{layer}H{head}, which the model does not have; "
                                 "the export is damaged")
        attn = model.h[layer].attn
        if any(bool(p[head].abs().max() > 0) for p in (attn.W_Q, attn.b_Q, attn.W_O)):
            raise HeadpruneError(f"{folder}: the export record says L{layer}H{head} was removed, but its weights are "
                                 "not zero; the export was edited or damaged: re-export it with headprune prune")
