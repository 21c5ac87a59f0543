"""Do W_O norms predict which heads matter? Weight-only scores against zero-ablation, per head.

    python -m analyses.wo_norms_vs_ablation [--model M] [--max-tokens K]   -> reports/wo_norms_vs_ablation/
"""

import pandas as pd
from matplotlib.figure import Figure
from scipy.stats import kendalltau, spearmanr

from analyses.common import save, setup
from headprune.report import markdown_table
from headprune.scoring import score_heads

WEIGHTS = ["wo_fro", "wo_spec", "ov_fro", "ov_spec"]

args, model, score_ids, _, out = setup("wo_norms_vs_ablation", __doc__)
scores = score_heads(model, score_ids, WEIGHTS + ["abl_zero"], args.windowing).table
rows = [{"score": m, "spearman": spearmanr(scores[m], scores.abl_zero)[0],
         "kendall": kendalltau(scores[m], scores.abl_zero)[0]} for m in WEIGHTS]
table = pd.DataFrame(rows)
fig = Figure(figsize=(4 * len(WEIGHTS), 3.6))
for ax, m, r in zip(fig.subplots(1, len(WEIGHTS)), WEIGHTS, rows):
    ax.scatter(scores[m], scores.abl_zero, c=scores.layer, cmap="viridis", s=18)
    ax.set(xlabel=m, ylabel="abl_zero (ΔNLL, nats/token)", title=f"{m}: Spearman {r['spearman']:.2f}")
save(out, "scores", table=scores)
save(out, "correlations", fig=fig, table=table,
     text=f"# W_O norms vs zero-ablation ({args.model})\n\nHeads scored on the validation split "
          f"({len(score_ids):,} tokens). Rank correlation of each weight-only score with `abl_zero`:\n\n"
          + markdown_table(table) + "\n")
print(table.to_string(index=False))
