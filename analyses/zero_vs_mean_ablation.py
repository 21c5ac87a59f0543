"""Zero vs mean ablation: per-head NLL changes, and pruning curves without and with mean compensation.

    python -m analyses.zero_vs_mean_ablation [--model M] [--max-tokens K]   -> reports/zero_vs_mean_ablation/
"""

import numpy as np
from matplotlib.figure import Figure
from scipy.stats import spearmanr

from analyses.common import save, setup
from headprune.pruning.curves import pruning_curves
from headprune.pruning.options import Compensation, CurveOptions
from headprune.report import markdown_table
from headprune.report.plots.scatters import label_points, layer_legend, scatter_by_layer
from headprune.scoring import score_heads

args, model, score_ids, eval_ids, out = setup("zero_vs_mean_ablation", __doc__)
scored = score_heads(model, score_ids, ["abl_zero", "abl_mean"], windowing=args.windowing)
scores, means = scored.table, scored.means
fractions = [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
curves = pruning_curves(model, eval_ids, scores, [("abl_zero", "none"), ("abl_zero", "mean"), ("abl_mean", "mean")],
                        options=CurveOptions(tuple(fractions), windowing=args.windowing),
                        compensation=Compensation(means=means))
rho = spearmanr(scores.abl_zero, scores.abl_mean)[0]
fig = Figure(figsize=(10, 4.2), layout="constrained")
ax1, ax2 = fig.subplots(1, 2)
n_layers = int(scores.layer.max()) + 1
x, y = scores.abl_zero.to_numpy(float), scores.abl_mean.to_numpy(float)
scatter_by_layer(ax1, x, y, scores.layer.to_numpy(), n_layers)
lim = [min(x.min(), y.min()), max(x.max(), y.max())]
ax1.plot(lim, lim, "k:", lw=1, label="abl_mean = abl_zero")
label_points(ax1, x, y, list(scores.head_id), np.argsort(-x, kind="stable"), k=4)
ax1.set(xlabel="abl_zero (ΔNLL, nats/token)", ylabel="abl_mean (ΔNLL, nats/token)",
        title=f"per head, Spearman {rho:.2f}")
ax1.grid(alpha=0.3)
layer_legend(fig, n_layers)
styles = {("abl_zero", "none"): ("#0072B2", "-", "o"), ("abl_zero", "mean"): ("#0072B2", "--", "s"),
          ("abl_mean", "mean"): ("#D55E00", "--", "^")}  # Okabe-Ito
for (method, comp), g in curves.groupby(["method", "compensation"], sort=False):
    color, ls, marker = styles.get((method, comp), ("#000000", ":", "x"))
    ax2.plot(100 * g.fraction, g.delta_nll, color=color, ls=ls, marker=marker, ms=4,
             label=f"rank by {method}, " + ("mean-compensated" if comp == "mean" else "no compensation"))
ax2.set(xlabel="heads pruned (%)", ylabel="test ΔNLL (nats/token)", title="pruning curves")
ax2.grid(alpha=0.3)
ax2.legend(fontsize=8)
save(out, "scores", table=scores)
save(out, "curves", fig=fig, table=curves,
     text=f"# Zero vs mean ablation ({args.model})\n\nSpearman rank correlation of per-head `abl_zero` and "
          f"`abl_mean`: {rho:.3f}; average ΔNLL over heads {scores.abl_zero.mean():.4f} "
          f"(zero) vs {scores.abl_mean.mean():.4f} (mean) nats/token. Heads scored on the validation split, "
          f"curves on the test split ({len(eval_ids):,} tokens):\n\n"
          + markdown_table(curves[["method", "compensation", "fraction", "heads_pruned", "ppl", "delta_nll"]]) + "\n")
print(curves[["method", "compensation", "fraction", "ppl"]].to_string(index=False))
