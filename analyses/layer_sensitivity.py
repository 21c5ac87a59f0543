"""Per-layer pruning sensitivity: the test NLL change from removing all heads, or half of them, of one layer.

    python -m analyses.layer_sensitivity [--model M] [--max-tokens K]   -> reports/layer_sensitivity/
"""

import pandas as pd
from matplotlib.figure import Figure

from analyses.common import save, setup
from headprune.perplexity import evaluate
from headprune.pruning.prune import prune_model
from headprune.report import markdown_table
from headprune.scoring import score_heads

args, model, score_ids, eval_ids, out = setup("layer_sensitivity", __doc__)
scores = score_heads(model, score_ids, ["abl_zero"], windowing=args.windowing).table
base = evaluate(model, eval_ids, args.windowing).nll
rows = []
for layer, kept in enumerate(model.cfg.kept_heads):
    ranked = scores[scores.layer == layer].sort_values(["abl_zero", "head"])
    half = [(layer, int(h)) for h in ranked["head"][: len(kept) // 2]]
    for label, heads in (("all heads", [(layer, h) for h in kept]), ("least important half", half)):
        nll = evaluate(prune_model(model, heads), eval_ids, args.windowing, progress=False).nll
        rows.append({"layer": layer, "pruned": label, "heads_pruned": len(heads), "delta_nll": nll - base})
table = pd.DataFrame(rows)
fig = Figure(figsize=(7, 3.6), layout="constrained")
ax = fig.subplots()
wide = table.pivot(index="layer", columns="pruned", values="delta_nll")
wide.plot.bar(ax=ax, rot=0, color=["#0072B2", "#E69F00"])  # Okabe-Ito; layer numbers upright
ax.set(xlabel="layer", ylabel="test ΔNLL (nats/token)", title="removing the heads of one layer")
ax.grid(alpha=0.3, axis="y")
save(out, "layers", fig=fig, table=table,
     text=f"# Per-layer pruning sensitivity ({args.model})\n\nTest NLL {base:.4f} unpruned; half = the layer's "
          "heads with the lowest `abl_zero` (validation split).\n\n" + markdown_table(table) + "\n")
print(table.to_string(index=False))
