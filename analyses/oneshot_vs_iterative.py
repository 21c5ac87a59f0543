"""One-shot vs iterative pruning (Michel et al., 2019): re-scoring the remaining heads between steps.

    python -m analyses.oneshot_vs_iterative [--model M] [--max-tokens K] [--steps 4]   -> reports/oneshot_vs_iterative/
"""

import pandas as pd
from matplotlib.figure import Figure

from analyses.common import save, setup
from headprune.perplexity import evaluate
from headprune.pruning.iterative import prune_iteratively
from headprune.pruning.options import PruningOptions, ScoringData
from headprune.report import markdown_table
from headprune.scoring import score_heads

METHOD, STEPS = "taylor", 4
args, model, score_ids, eval_ids, out = setup("oneshot_vs_iterative", __doc__)
scores = score_heads(model, score_ids, [METHOD], windowing=args.windowing, show_progress=False).table
base = evaluate(model, eval_ids, args.windowing).nll
rows = []
for fraction in [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]:
    for steps in (1, STEPS):
        pruned, heads = prune_iteratively(model, scores, METHOD, fraction=fraction, options=PruningOptions(steps=steps),
                                          data=ScoringData(score_ids, args.windowing), show_progress=False)
        nll = evaluate(pruned, eval_ids, args.windowing, progress=False).nll
        rows.append({"fraction": fraction, "schedule": "one-shot" if steps == 1 else f"iterative ({steps} steps)",
                     "heads_pruned": len(heads), "delta_nll": nll - base})
table = pd.DataFrame(rows)
fig = Figure(figsize=(6, 3.6), layout="constrained")
ax = fig.subplots()
for (schedule, g), color in zip(table.groupby("schedule"), ["#009E73", "#E69F00"]):  # Okabe-Ito
    ax.plot(100 * g.fraction, g.delta_nll, marker="o", color=color, label=schedule)
ax.set(xlabel="heads pruned (%)", ylabel="test ΔNLL (nats/token)", title=f"ranking by {METHOD}")
ax.grid(alpha=0.3)
ax.legend()
save(out, "schedules", fig=fig, table=table,
     text=f"# One-shot vs iterative pruning ({args.model}, `{METHOD}`)\n\nScores on the validation split, "
          f"NLL change on the test split (unpruned {base:.4f}).\n\n" + markdown_table(table) + "\n")
print(table.to_string(index=False))
