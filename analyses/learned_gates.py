"""Jointly learned head sets (hard-concrete gates, Voita et al. 2019) against one-shot and iterative ablation.

    python -m analyses.learned_gates [--model M] [--max-tokens K]   -> reports/learned_gates/

At 30/50/70% of heads removed: gates learned at that target sparsity (headprune.pruning.gates, STEPS steps of BATCH
windows of SEQ tokens on the validation split), one-shot pruning by zero- and mean-ablation scores
(abl_zero, abl_mean) and iterative pruning by abl_zero (ITERATIVE steps, re-scoring the remaining heads
between them); every set is removed physically and judged by test-split perplexity.
"""

import math
import time

import pandas as pd
from matplotlib.figure import Figure

from analyses.common import save, setup
from headprune.models.heads import format_heads
from headprune.perplexity import Windowing, evaluate
from headprune.pruning.gates import gate_head_sets
from headprune.pruning.iterative import prune_iteratively
from headprune.pruning.options import PruningOptions, ScoringData
from headprune.pruning.prune import prune_model
from headprune.pruning.selection import select_heads
from headprune.report import markdown_table
from headprune.scoring import score_heads

FRACTIONS = (0.3, 0.5, 0.7)
STEPS, SEQ, BATCH = 150, 128, 4  # gate training per fraction: STEPS batches of BATCH windows of SEQ tokens
ITERATIVE = 3  # steps of iterative abl_zero pruning

args, model, score_ids, eval_ids, out = setup("learned_gates", __doc__)
w = args.windowing


def test_nll(heads) -> float:
    return evaluate(prune_model(model, heads), eval_ids, w, progress=False).nll


base = evaluate(model, eval_ids, w, progress=False)
seconds: dict[str, float] = {}
t0 = time.perf_counter()
scores = score_heads(model, score_ids, ["abl_zero", "abl_mean"], windowing=w, show_progress=False).table
seconds["one-shot scores (abl_zero, abl_mean)"] = time.perf_counter() - t0
t0 = time.perf_counter()
gate_batches = Windowing.for_model(model, SEQ, None, BATCH).batches(score_ids)
gates = gate_head_sets(model, gate_batches, list(FRACTIONS), STEPS, show_progress=False)
seconds[f"learned gates ({len(FRACTIONS)} fractions x {STEPS} steps)"] = time.perf_counter() - t0
rows = []
t_iter = 0.0
for fraction in FRACTIONS:
    sets = {"learned gates": gates[("gate", fraction)]}
    for method in ("abl_zero", "abl_mean"):
        sets[f"one-shot {method}"] = select_heads(scores, method, fraction=fraction)
    t0 = time.perf_counter()
    _, sets[f"iterative abl_zero ({ITERATIVE} steps)"] = prune_iteratively(
        model, scores, "abl_zero", fraction=fraction, options=PruningOptions(steps=ITERATIVE),
        data=ScoringData(score_ids, w), show_progress=False)
    t_iter += time.perf_counter() - t0
    for name, heads in sets.items():
        rows.append({"fraction": fraction, "method": name, "heads_pruned": len(heads),
                     "delta_nll": test_nll(heads) - base.nll, "heads": format_heads(sorted(heads))})
seconds[f"iterative abl_zero ({len(FRACTIONS)} fractions x {ITERATIVE} steps)"] = t_iter
table = pd.DataFrame(rows)
table.insert(4, "ppl", [math.exp(base.nll + d) for d in table["delta_nll"]])

GATES = "learned gates"
lines = []
for fraction, g in table.groupby("fraction", sort=True):
    by = g.set_index("method")["delta_nll"]
    mine, others = by[GATES], by.drop(GATES)
    beaten = [m for m, v in others.items() if mine < v]
    verdict = ("beat every ablation schedule" if len(beaten) == len(others) else
               f"beat {', '.join(beaten)} but not {', '.join(m for m in others.index if m not in beaten)}" if beaten
               else "beat none of the ablation schedules")
    lines.append(f"- At {fraction:.0%} of heads removed ({int(g.heads_pruned.iloc[0])}), the learned gates {verdict}: "
                 f"test ΔNLL {mine:+.4f} against " + ", ".join(f"{m} {v:+.4f}" for m, v in others.items()) + ".")
wins = sum(lines_i.count("beat every") for lines_i in lines)
timing = ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items())

fig = Figure(figsize=(6.4, 3.8))
ax = fig.subplots()
for method, g in table.groupby("method", sort=False):
    ax.plot(100 * g.fraction, g.delta_nll, marker="o", label=method)
ax.set(xlabel="% of heads removed", ylabel="test ΔNLL (nats/token)", title="learned gates vs ablation")
ax.legend(fontsize=8)
text = (f"# Learned gates vs one-shot and iterative ablation ({args.model})\n\n"
        f"Gates: hard-concrete, model frozen, target-sparsity Lagrangian, {STEPS} steps of {BATCH} windows of {SEQ} "
        f"tokens per fraction (validation split, {len(score_ids):,} tokens; the same tokens score the ablation "
        f"baselines). Every head set is removed physically; ΔNLL on the test split ({len(eval_ids):,} tokens, "
        f"unpruned NLL {base.nll:.4f}, perplexity {base.ppl:.3f}).\n\n" + "\n".join(lines) + "\n\n"
        f"The learned sets beat every ablation schedule at {wins} of {len(FRACTIONS)} fractions.\n\n"
        + markdown_table(table.drop(columns="heads")) + f"\n\nSeconds (this machine): {timing}.\n\n"
        "Heads removed by each method:\n\n" + markdown_table(table[["fraction", "method", "heads"]]) + "\n")
save(out, "learned_gates", fig=fig, table=table, text=text,
     meta={"seconds": {k: round(v, 1) for k, v in seconds.items()}, "steps": STEPS, "seq_len": SEQ, "batch": BATCH,
           "iterative_steps": ITERATIVE, "base_nll": base.nll})
print(text)
