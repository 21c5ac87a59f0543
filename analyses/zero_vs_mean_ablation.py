"""Zero vs mean ablation: per-head NLL changes, and pruning curves without and with mean compensation.

    python -m analyses.zero_vs_mean_ablation [--model M] [--max-tokens K]   -> reports/zero_vs_mean_ablation/
"""

from matplotlib.figure import Figure
from scipy.stats import spearmanr

from analyses.common import save, setup
from headprune.curves import pruning_curves
from headprune.report import markdown_table
from headprune.scoring import score_heads

args, model, score_ids, eval_ids, out = setup("zero_vs_mean_ablation", __doc__)
scored = score_heads(model, score_ids, ["abl_zero", "abl_mean"], args.windowing)
scores, means = scored.table, scored.means
fractions = [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
curves = pruning_curves(model, eval_ids, scores, [("abl_zero", "none"), ("abl_zero", "mean"), ("abl_mean", "mean")],
                        fractions, args.windowing, means=means)
rho = spearmanr(scores.abl_zero, scores.abl_mean)[0]
fig = Figure(figsize=(10, 4))
ax1, ax2 = fig.subplots(1, 2)
ax1.scatter(scores.abl_zero, scores.abl_mean, c=scores.layer, cmap="viridis", s=18)
lim = [min(scores.abl_zero.min(), scores.abl_mean.min()), max(scores.abl_zero.max(), scores.abl_mean.max())]
ax1.plot(lim, lim, "k:", lw=1)
ax1.set(xlabel="abl_zero (ΔNLL)", ylabel="abl_mean (ΔNLL)", title=f"per head, Spearman {rho:.2f}")
for (method, comp), g in curves.groupby(["method", "compensation"], sort=False):
    ax2.plot(g.fraction, g.ppl, marker="o", ls="--" if comp == "mean" else "-", label=f"rank by {method}, {comp}")
ax2.set(xlabel="fraction of heads pruned", ylabel="test perplexity", yscale="log", title="pruning curves")
ax2.legend()
save(out, "scores", table=scores)
save(out, "curves", fig=fig, table=curves,
     text=f"# Zero vs mean ablation ({args.model})\n\nSpearman rank correlation of per-head `abl_zero` and "
          f"`abl_mean`: {rho:.3f}; average ΔNLL over heads {scores.abl_zero.mean():.4f} "
          f"(zero) vs {scores.abl_mean.mean():.4f} (mean) nats/token. Heads scored on the validation split, "
          f"curves on the test split ({len(eval_ids):,} tokens):\n\n"
          + markdown_table(curves[["method", "compensation", "fraction", "heads_pruned", "ppl", "delta_nll"]]) + "\n")
print(curves[["method", "compensation", "fraction", "ppl"]].to_string(index=False))
