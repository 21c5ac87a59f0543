"""Head roles against head importance: does the model have induction heads, and are they among the heads pruning
must keep? Also: do the heads that pruning removes write into directions the kept heads of their layer cover?

    python -m analyses.roles_vs_importance [--model M] [--max-tokens K]   -> reports/roles_vs_importance/

Importance is abl_zero (NLL increase when the head is zero-ablated) on the validation split; roles come from the
induction probe (8 random sequences of 32 tokens repeated twice) and the first 8 scoring windows.
"""

import numpy as np
import pandas as pd

from analyses.common import save, setup
from headprune.anatomy import corpus_rows, head_anatomy, head_patterns, repeated_random_tokens
from headprune.anatomy.for_report import induction_baselines
from headprune.anatomy.geometry import principal_cosines, row_bases
from headprune.io.work.files import write_bytes
from headprune.report import markdown_table
from headprune.report.anatomy import Thumbnail, plot_roles, plot_thumbnails, role_correlations
from headprune.scoring import score_heads

PROBE_LENGTH, PROBE_COUNT, ROWS, SEED, PRUNED = 32, 8, 8, 0, 0.5

args, model, score_ids, _, out = setup("roles_vs_importance", __doc__)
bos = args.windowing.bos
length = min(PROBE_LENGTH, (model.cfg.n_positions - (bos is not None)) // 2)
probe = repeated_random_tokens(model.cfg.vocab_size, length, PROBE_COUNT, SEED, bos)
anatomy = head_anatomy(model, probe, corpus_rows(score_ids, args.seq_len, ROWS, bos))
scores = score_heads(model, score_ids, ["abl_zero"], windowing=args.windowing).table
heads = scores[["layer", "head", "head_id", "abl_zero"]].merge(anatomy.heads.drop(columns=["layer", "head"]),
                                                               on="head_id")
heads["importance_rank"] = heads["abl_zero"].rank(ascending=False, method="min").astype(int)
n = len(heads)
keep_top = int(np.ceil(0.1 * n))
uniform, ideal = induction_baselines(probe)
corr = role_correlations(heads)

# The heads pruning removes first (lowest abl_zero, PRUNED of them): how much of what each writes could the kept
# heads of its layer write? mean cos² of the principal angles between its W_O row space and the span of the kept
# heads' rows, against a random subspace of the same dimensions (expected min(1, kept·d_k/d)).
pruned = set(heads.nsmallest(int(PRUNED * n), ["abl_zero"])["head_id"])
cover = []
for layer in model.active_layers:
    W_O = model.h[layer].attn.W_O.double()
    ids = [f"L{layer}H{h}" for h in model.cfg.kept_heads[layer]]
    kept = [i for i, h in enumerate(ids) if h not in pruned]
    for i, h in enumerate(ids):
        if h in pruned and kept:
            Q_kept = row_bases(W_O[kept].reshape(1, -1, W_O.shape[-1]))[0]
            share = float(principal_cosines(row_bases(W_O[i:i + 1])[0], Q_kept).square().sum() / W_O.shape[1])
            cover.append({"head_id": h, "layer": layer, "kept_in_layer": len(kept), "covered": share,
                          "random_expectation": min(1.0, len(kept) * W_O.shape[1] / W_O.shape[2])})
cover = pd.DataFrame(cover)

best = heads.loc[heads["induction"].idxmax()]
strong = heads[heads["induction"] >= 0.3 * ideal]
top_ind = heads.nlargest(3, "induction")
patterns = head_patterns(model, probe[0], [(int(r.layer), int(r.head)) for r in top_ind.itertuples()])
thumbs = [Thumbnail(r.head_id, f"induction #{i + 1}", "probe", patterns[int(r.layer), int(r.head)].tolist())
          for i, r in enumerate(top_ind.itertuples())]
comp = anatomy.composition
ranks = dict(zip(heads.head_id, heads.importance_rank))
comp_top = comp.assign(rank_a=comp.head_a_id.map(ranks), rank_b=comp.head_b_id.map(ranks))
comp_top = comp_top[(comp_top.rank_a <= keep_top * 2) & (comp_top.rank_b <= keep_top * 2)]
comp_top = comp_top.sort_values("k_comp", ascending=False).head(8)

verdict = (f"has {len(strong)} head(s) reaching 30% of it ({', '.join(strong.head_id)})" if len(strong) else
           "has no induction head: no head reaches 30% of it")
must_keep = heads.nsmallest(keep_top, "importance_rank")
kept_roles = ", ".join(f"{r.head_id} (#{r.importance_rank}: prev {r.previous_token_corpus:.2f}, dup "
                       f"{r.duplicate_token_corpus:.2f}, ind {r.induction:.3f}, dla {r.dla:+.3f})"
                       for r in must_keep.itertuples())
rho = corr.set_index("anatomy")
finding = [
    (f"- **Induction heads**: on {PROBE_COUNT} random sequences of {probe.shape[1] // 2} tokens repeated twice "
    f"the strongest induction score is {best.induction:.3f} ({best.head_id}); an ideal induction head scores "
    f"{ideal:.3f} and uniform attention {uniform:.3f}. The model {verdict}. {best.head_id} ranks "
    f"#{best.importance_rank} of {n} by abl_zero, so the top induction-like head is "
    f"{'among' if best.importance_rank <= keep_top else 'not among'} "
    f"the {keep_top} heads (top 10%) pruning must keep."),
    f"- **The heads pruning must keep** (top 10% by abl_zero): {kept_roles}.",
    f"- **Roles vs importance** (Spearman over {n} heads, 95% bootstrap interval): "
    + "; ".join(f"{a} {r.spearman_rho:+.2f} [{r.ci95_low:+.2f}, {r.ci95_high:+.2f}]" for a, r in rho.iterrows()) + ".",
    (f"- **What pruned heads write**: for the {len(cover)} heads with the lowest abl_zero ({PRUNED:.0%}), "
    f"the kept heads of their layer can write a mean {cover.covered.mean():.2f} of their W_O row space "
    f"(mean cos² of principal angles), against {cover.random_expectation.mean():.2f} for random subspaces "
    "of the same sizes."),
]
text = (f"# Head roles vs importance ({args.model})\n\nImportance: abl_zero on the validation split "
        f"({len(score_ids):,} tokens). Roles: TransformerLens detect_head scores ('mul') on the induction probe "
        f"(seed {SEED}) and on the first {ROWS} scoring windows (*_corpus); dla, copying and W_O geometry as in "
        "docs/anatomy.md.\n\n"
        + "\n".join(finding) + "\n\n## Correlations\n\n" + markdown_table(corr)
        + "\n\n## Top heads by abl_zero\n\n" + markdown_table(heads.sort_values("importance_rank").head(12).round(4))
        + "\n\n## Strongest K-composition among the top 20% heads\n\n"
        + markdown_table(comp_top[["head_a_id", "head_b_id", "rank_a", "rank_b",
                                   "q_comp", "k_comp", "v_comp"]].round(4))
        + "\n\n## Pruned heads' W_O row space covered by the kept heads of their layer\n\n"
        + markdown_table(cover.groupby("layer")[["covered", "random_expectation"]].mean().reset_index().round(4))
        + "\n")
save(out, "heads", table=heads)
save(out, "correlations", table=corr)
save(out, "coverage", table=cover)
save(out, "roles_vs_importance", text=text)
write_bytes(out / "roles.png", plot_roles(heads, corr))
write_bytes(out / "induction_attention.png", plot_thumbnails(thumbs))
print("\n".join(finding))
