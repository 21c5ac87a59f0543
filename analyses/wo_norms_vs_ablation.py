"""Do W_O norms predict which heads matter? Weight-only scores against zero-ablation, per head.

    python -m analyses.wo_norms_vs_ablation [--model M] [--max-tokens K]   -> reports/wo_norms_vs_ablation/
"""

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from scipy.stats import kendalltau, spearmanr

from analyses.common import save, setup
from headprune.report import markdown_table
from headprune.report.plots.scatters import label_points, layer_legend, scatter_by_layer
from headprune.schema import METHOD_UNITS
from headprune.scoring import score_heads

WEIGHTS = ["wo_fro", "wo_spec", "ov_fro", "ov_spec"]

args, model, score_ids, _, out = setup("wo_norms_vs_ablation", __doc__)
scores = score_heads(model, score_ids, WEIGHTS + ["abl_zero"], windowing=args.windowing).table
rows = [{"score": m, "spearman": spearmanr(scores[m], scores.abl_zero)[0],
         "kendall": kendalltau(scores[m], scores.abl_zero)[0]} for m in WEIGHTS]
table = pd.DataFrame(rows)
fig = Figure(figsize=(3.4 * len(WEIGHTS), 3.4), layout="constrained")
axes = fig.subplots(1, len(WEIGHTS), sharey=True)
n_layers = int(scores.layer.max()) + 1
top = np.argsort(-scores.abl_zero.to_numpy(), kind="stable")
for ax, m, r in zip(axes, WEIGHTS, rows):
    x, y = scores[m].to_numpy(float), scores.abl_zero.to_numpy(float)
    scatter_by_layer(ax, x, y, scores.layer.to_numpy(), n_layers)
    label_points(ax, x, y, list(scores.head_id), top, k=3)
    ax.set(xlabel=f"{m} ({METHOD_UNITS[m]})", title=f"{m}: Spearman {r['spearman']:.2f}")
    ax.grid(alpha=0.3)
axes[0].set_ylabel(f"abl_zero ({METHOD_UNITS['abl_zero']})")
layer_legend(fig, n_layers)
save(out, "scores", table=scores)
save(out, "correlations", fig=fig, table=table,
     text=f"# W_O norms vs zero-ablation ({args.model})\n\nHeads scored on the validation split "
          f"({len(score_ids):,} tokens). Rank correlation of each weight-only score with `abl_zero`:\n\n"
          + markdown_table(table) + "\n")
print(table.to_string(index=False))
