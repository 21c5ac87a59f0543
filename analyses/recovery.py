"""Recovery after pruning: how much of the perplexity lost at 50% of heads removed do a few fine-tuning or
distillation steps win back?

    python -m analyses.recovery [--steps 40] [--methods abl_zero,abl_mean,grad] [--scores S]   -> reports/recovery/

The heads come from a score run (``--scores``, default the committed ``reports/stdlib-gpt2-mini/scores.csv``;
any column of it can compete, e.g. ``--methods abl_zero,abl_mean,grad,gate`` once learned gates are scored).
Each method removes the same 50% of heads; the one with the lowest test perplexity is recovered three ways,
each for the same number of AdamW steps on the train split: fine-tuning (CE), distillation from the unpruned
model (KL, α = 1), and, as a control, the same fine-tuning of the UNPRUNED model (what the steps buy a model
that lost nothing: the shipped model is small and briefly trained, so part of any "recovery" is just more
training). Share of the gap recovered = (P_pruned − P_recovered) / (P_pruned − P_unpruned), test split.
"""

from __future__ import annotations

import argparse
import copy
import time

import pandas as pd
from matplotlib.figure import Figure

from analyses.common import REPORTS, save
from headprune.corpus import corpus_ids
from headprune.finetune import Recipe, finetune
from headprune.loading import load_model, model_tokenizer
from headprune.outputs import ensure_dir, read_scores
from headprune.perplexity import evaluate
from headprune.pruning import prune_model
from headprune.recovery import gap_recovered
from headprune.report import markdown_table
from headprune.schema import DEFAULT_MODEL
from headprune.selection import check_scores_match, select_heads

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--model", default=DEFAULT_MODEL)
ap.add_argument("--scores", default=str(REPORTS / "stdlib-gpt2-mini" / "scores.csv"), help="scores table of the model")
ap.add_argument("--methods", default="abl_zero,abl_mean,grad", help="scores columns that compete (lowest test ppl wins)")
ap.add_argument("--fraction", type=float, default=0.5)
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--lr", type=float, default=1e-4)
ap.add_argument("--batch-size", type=int, default=8)
ap.add_argument("--seq-len", type=int, default=128, help="training window length")
ap.add_argument("--distill-weight", type=float, default=1.0)
ap.add_argument("--temperature", type=float, default=1.0)
ap.add_argument("--max-tokens", type=int, default=None, help="test tokens to evaluate on (default: all)")
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--out", default=str(REPORTS / "recovery"))
args = ap.parse_args()

model = load_model(args.model)
tok = model_tokenizer(model)
train_ids = corpus_ids("default", "train", tok)
eval_ids = corpus_ids("default", "test", tok, args.max_tokens)
n = model.cfg.n_positions
ppl = lambda m: evaluate(m, eval_ids, n, n, progress=False).ppl
scores = read_scores(args.scores)
check_scores_match(scores, model, args.scores)
methods = [m.strip() for m in args.methods.split(",") if m.strip()]

unpruned = ppl(model)
oneshot = []
for method in methods:
    heads = select_heads(scores, method, fraction=args.fraction)
    oneshot.append({"method": method, "heads_pruned": len(heads), "test_ppl": ppl(prune_model(model, heads))})
oneshot_table = pd.DataFrame(oneshot).sort_values("test_ppl", kind="stable").reset_index(drop=True)
best = str(oneshot_table.method[0])
pruned = prune_model(model, select_heads(scores, best, fraction=args.fraction))
pruned_ppl = float(oneshot_table.test_ppl[0])

recipe = Recipe(steps=args.steps, lr=args.lr, batch_size=args.batch_size, seq_len=args.seq_len, seed=args.seed)
distill = Recipe(**{**recipe.as_dict(), "distill_weight": args.distill_weight, "temperature": args.temperature})
runs = [("pruned, fine-tuned", pruned, recipe, None), ("pruned, distilled", pruned, distill, model),
        ("unpruned, fine-tuned (control)", model, recipe, None)]
rows = [{"model": "unpruned", "steps": 0, "test_ppl": unpruned, "gap_recovered": None, "seconds": 0.0,
         "losses": ""},
        {"model": f"pruned ({best}, {args.fraction:.0%})", "steps": 0, "test_ppl": pruned_ppl, "gap_recovered": 0.0,
         "seconds": 0.0, "losses": ""}]
for name, start, rec, t in runs:
    student = copy.deepcopy(start)
    t0 = time.perf_counter()
    result = finetune(student, train_ids, rec, t, show_progress=False)
    seconds = time.perf_counter() - t0
    after = ppl(student)
    share = gap_recovered(unpruned, pruned_ppl, after) if start is pruned else None
    rows.append({"model": name, "steps": args.steps, "test_ppl": after, "gap_recovered": share, "seconds": seconds,
                 "losses": f"{result.losses[0]:.3f} -> {sum(result.losses[-5:]) / len(result.losses[-5:]):.3f}"})
    print(rows[-1], flush=True)
table = pd.DataFrame(rows)

ft, kd, control = (float(table.test_ppl[i]) for i in (2, 3, 4))


def verdict(gain_ft: float, gain_kd: float, gain_control: float) -> str:
    """One sentence on whether the perplexity won back is recovery or just more training (gains: ppl drops)."""
    best_gain, how = max((gain_ft, "fine-tuning"), (gain_kd, "distillation"))
    if best_gain <= 0:
        return f"Neither recovers anything in {args.steps} steps at this learning rate."
    if best_gain > gain_control:
        return (f"{how.capitalize()} lowers the pruned model's perplexity by {best_gain:.2f}, more than the same steps "
                f"of fine-tuning change the unpruned one ({-gain_control:+.2f}), so it is recovery of what pruning "
                "removed, not only more training.")
    return (f"The unpruned model gains as much from the same steps ({gain_control:.2f} lower), so the pruned model's gain is "
            "mostly further training of a small, briefly trained model rather than recovery of what pruning removed.")

words = (f"Removing {args.fraction:.0%} of the heads ({len(model.head_ids) - len(pruned.head_ids)} of "
         f"{len(model.head_ids)}) by `{best}` (the lowest test perplexity of {', '.join(methods)}) raises test perplexity "
         f"from {unpruned:.2f} to {pruned_ppl:.2f}. {args.steps} fine-tuning steps ({args.batch_size} windows x "
         f"{args.seq_len} tokens, {args.steps * args.batch_size * args.seq_len:,} training tokens) bring it to "
         f"{ft:.2f}, {gap_recovered(unpruned, pruned_ppl, ft):.0%} of the gap; {args.steps} distillation steps "
         f"(alpha {args.distill_weight:g}, T {args.temperature:g}) bring it to {kd:.2f}, "
         f"{gap_recovered(unpruned, pruned_ppl, kd):.0%} of the gap. The same {args.steps} fine-tuning steps take the "
         f"unpruned model from {unpruned:.2f} to {control:.2f}. " + verdict(pruned_ppl - ft, pruned_ppl - kd,
                                                                                unpruned - control))


out = ensure_dir(args.out)
fig = Figure(figsize=(6.4, 3.4))
ax = fig.subplots()
ax.barh(table.model[::-1], table.test_ppl[::-1], color=["#999999", "#0072B2", "#009E73", "#D55E00", "#555555"][::-1])
ax.axvline(unpruned, color="k", ls=":", lw=1)
ax.set(xlabel="test perplexity", xlim=(min(table.test_ppl) * 0.95, max(table.test_ppl) * 1.02),
       title=f"{args.steps} steps of recovery after pruning {args.fraction:.0%} of heads")
settings = {k: v for k, v in vars(args).items()} | {"best_method": best, "train_tokens": len(train_ids),
                                                    "test_tokens": len(eval_ids), "recipe": recipe.as_dict(),
                                                    "distill_recipe": distill.as_dict()}
save(out, "oneshot_at_50", table=oneshot_table)
save(out, "recovery", fig=fig, table=table, meta=settings,
     text=f"# Recovery after pruning ({args.model})\n\n{words}\n\n"
          f"One-shot methods at {args.fraction:.0%} (test perplexity, lowest first):\n\n{markdown_table(oneshot_table)}\n\n"
          f"Recovery ({args.steps} AdamW steps each, lr {args.lr:g} with 10% warmup and cosine decay, seed {args.seed}; "
          f"test split, {len(eval_ids):,} tokens):\n\n{markdown_table(table)}\n")
print(words)
