"""Recovery after pruning: how much of the perplexity lost at 50% of heads removed do a few fine-tuning or
distillation steps win back, for the best one-shot head set and for a jointly learned one?

    python -m analyses.recovery [--steps 400] [--methods abl_zero,abl_mean,grad] [--gate-steps 150]
        -> reports/recovery/

Two head sets of the same size are removed physically: the best one-shot set (of ``--methods``, columns of a
score run, ``--scores``, default the committed ``reports/stdlib-gpt2-mini/scores.csv``; lowest test perplexity
wins) and the set closed by hard-concrete gates learned at that sparsity (Voita et al. 2019; ``--gate-steps``
batches of 4 windows of 128 validation tokens, as in ``analyses.learned_gates``; 0 skips it). Each is recovered
two ways, for the same number of AdamW steps on the train split: fine-tuning (CE) and distillation from the
unpruned model (KL, α = 1). As a control the unpruned model gets the same fine-tuning (what the steps buy a model
that lost nothing: the shipped model is small and briefly trained, so part of any "recovery" is just more
training). Share of the gap recovered = (P_pruned − P_recovered) / (P_pruned − P_unpruned), test split, each set
against its own pruned perplexity.
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from analyses.common import REPORTS, save, setup
from headprune.data.tokens import corpus_ids
from headprune.io.read.tokenizer import model_tokenizer
from headprune.io.work.files import read_scores
from headprune.models.gpt2 import GPT2
from headprune.models.heads import format_heads
from headprune.perplexity import Windowing, evaluate
from headprune.pruning.finetune import Recipe, finetune
from headprune.pruning.gates import GATE, gate_head_sets
from headprune.pruning.prune import prune_model
from headprune.pruning.selection import check_scores_match, select_heads
from headprune.report import markdown_table
from headprune.schema import gap_recovered

GATE_SEQ, GATE_BATCH = 128, 4  # gate training windows, as analyses.learned_gates
GATES = "learned gates"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--scores", default="reports/stdlib-gpt2-mini/scores.csv",
                    help="scores table of the model (relative: to the repository root)")
    ap.add_argument("--methods", default="abl_zero,abl_mean,grad",
                    help="scores columns that compete (lowest test ppl wins)")
    ap.add_argument("--fraction", type=float, default=0.5)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--gate-steps", type=int, default=150, help="gate training steps (0: no learned set)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--train-seq-len", type=int, default=128, help="training window length")
    ap.add_argument("--distill-weight", type=float, default=1.0)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)


args, model, score_ids, eval_ids, out = setup("recovery", __doc__, add_arguments)
w = args.windowing
train_ids = corpus_ids(args.data, "train", model_tokenizer(model))
scores_path = Path(args.scores) if Path(args.scores).is_absolute() else REPORTS.parent / args.scores
scores = read_scores(scores_path)
check_scores_match(scores, model, args.scores)
methods = [m.strip() for m in args.methods.split(",") if m.strip()]


def ppl(m: GPT2) -> float:
    return evaluate(m, eval_ids, w, progress=False).ppl


unpruned = ppl(model)
oneshot = [{"method": m, "heads": select_heads(scores, m, fraction=args.fraction)} for m in methods]
for row in oneshot:
    row["test_ppl"] = ppl(prune_model(model, row["heads"]))
oneshot_table = pd.DataFrame(oneshot).sort_values("test_ppl", kind="stable").reset_index(drop=True)
best = str(oneshot_table.method[0])
head_sets = {f"one-shot {best}": list(oneshot_table.heads[0])}
gate_seconds = 0.0
if args.gate_steps:
    t0 = time.perf_counter()
    gate_batches = Windowing.for_model(model, GATE_SEQ, None, GATE_BATCH).batches(score_ids)
    head_sets[GATES] = gate_head_sets(model, gate_batches, [args.fraction], args.gate_steps, seed=args.seed,
                                      show_progress=False)[(GATE, args.fraction)]
    gate_seconds = time.perf_counter() - t0
sets_table = pd.DataFrame([{"head_set": name, "heads_pruned": len(heads), "heads": format_heads(heads)}
                           for name, heads in head_sets.items()])

recipe = Recipe(steps=args.steps, lr=args.lr, batch_size=args.batch_size, seq_len=args.train_seq_len, seed=args.seed)
distill = Recipe(**{**recipe.as_dict(), "distill_weight": args.distill_weight, "temperature": args.temperature})


def recover(start: GPT2, rec: Recipe, teacher: GPT2 | None) -> dict:
    """Train a copy of ``start``; its test perplexity, seconds and first -> last-5-mean loss."""
    student = copy.deepcopy(start)
    t0 = time.perf_counter()
    result = finetune(student, train_ids, rec, teacher, show_progress=False)
    tail = result.losses[-5:]
    return {"test_ppl": ppl(student), "seconds": time.perf_counter() - t0,
            "losses": f"{result.losses[0]:.3f} -> {sum(tail) / len(tail):.3f}"}


rows = [{"head_set": "none (unpruned)", "recovery": "none", "steps": 0, "test_ppl": unpruned, "gap_recovered": None,
         "seconds": 0.0, "losses": ""}]
for name, heads in head_sets.items():
    pruned = prune_model(model, heads)
    pruned_ppl = ppl(pruned)
    rows.append({"head_set": name, "recovery": "none", "steps": 0, "test_ppl": pruned_ppl, "gap_recovered": 0.0,
                 "seconds": 0.0, "losses": ""})
    for how, rec, teacher in (("fine-tuning", recipe, None), ("distillation", distill, model)):
        done = recover(pruned, rec, teacher)
        rows.append({"head_set": name, "recovery": how, "steps": args.steps, **done,
                     "gap_recovered": gap_recovered(unpruned, pruned_ppl, done["test_ppl"])})
        print(rows[-1], flush=True)
rows.append({"head_set": "none (unpruned)", "recovery": "fine-tuning (control)", "steps": args.steps,
             **recover(model, recipe, None), "gap_recovered": None})
table = pd.DataFrame(rows)[["head_set", "recovery", "steps", "test_ppl", "gap_recovered", "seconds", "losses"]]


def at(head_set: str, recovery: str) -> float:
    return float(table.test_ppl[(table.head_set == head_set) & (table.recovery == recovery)].iloc[0])


control = at("none (unpruned)", "fine-tuning (control)")


def verdict(gain_ft: float, gain_kd: float, gain_control: float) -> str:
    """One sentence on whether the perplexity won back is recovery or just more training (gains: ppl drops)."""
    best_gain, how = max((gain_ft, "fine-tuning"), (gain_kd, "distillation"))
    if best_gain <= 0:
        return f"Neither recovers anything in {args.steps} steps at this learning rate."
    if best_gain > gain_control:
        return (f"{how.capitalize()} lowers its perplexity by {best_gain:.2f}, more than the same steps of fine-tuning "
                f"change the unpruned model ({-gain_control:+.2f}), so it is recovery of what pruning removed, not "
                "only more training.")
    return (f"The unpruned model gains as much from the same steps ({gain_control:.2f} lower), so the gain is mostly "
            "further training of a small, briefly trained model rather than recovery of what pruning removed.")


def set_sentence(name: str) -> str:
    p, ft, kd = at(name, "none"), at(name, "fine-tuning"), at(name, "distillation")
    return (f"With the {name} set, test perplexity rises from {unpruned:.2f} to {p:.2f}; {args.steps} fine-tuning "
            f"steps bring it to {ft:.2f} ({gap_recovered(unpruned, p, ft):.0%} of the gap) and {args.steps} "
            f"distillation steps to {kd:.2f} ({gap_recovered(unpruned, p, kd):.0%}). "
            + verdict(p - ft, p - kd, unpruned - control))


n_pruned = len(head_sets[f"one-shot {best}"])
words = (f"Removing {args.fraction:.0%} of the heads ({n_pruned} of {len(model.head_ids)}): `{best}` gives the lowest "
         f"one-shot test perplexity of {', '.join(methods)}"
         + (f", and hard-concrete gates ({args.gate_steps} steps) learn a set jointly" if GATES in head_sets else "")
         + f". Each recovery is {args.steps} AdamW steps of {args.batch_size} windows x {args.train_seq_len} tokens "
         f"({args.steps * args.batch_size * args.train_seq_len:,} training tokens); distillation with alpha "
         f"{args.distill_weight:g}, T {args.temperature:g}. The same fine-tuning takes the unpruned model from "
         f"{unpruned:.2f} to {control:.2f}.\n\n" + "\n".join(f"- {set_sentence(name)}" for name in head_sets))

fig = Figure(figsize=(6.8, 0.45 * len(table) + 1.2))
ax = fig.subplots()
labels = [f"{s}, {r}" if r != "none" else (s if s.startswith("none") else f"{s}, pruned") for s, r in
          zip(table.head_set, table.recovery)]
colors = {"none": "#999999", "fine-tuning": "#009E73", "distillation": "#D55E00", "fine-tuning (control)": "#555555"}
ax.barh(labels[::-1], table.test_ppl[::-1], color=[colors[r] for r in table.recovery[::-1]])
ax.axvline(unpruned, color="k", ls=":", lw=1)
ax.tick_params(labelsize=8)
ax.set(xlabel="test perplexity", xlim=(min(table.test_ppl) * 0.95, max(table.test_ppl) * 1.02),
       title=f"{args.steps} steps of recovery after pruning {args.fraction:.0%} of heads")
settings = {k: v for k, v in vars(args).items() if k not in ("windowing", "out")} | {
    "best_method": best, "train_tokens": len(train_ids), "test_tokens": len(eval_ids),
    "score_tokens": len(score_ids), "gate_seconds": round(gate_seconds, 1), "recipe": recipe.as_dict(),
    "distill_recipe": distill.as_dict()}
oneshot_table = oneshot_table.assign(heads=oneshot_table.heads.map(format_heads))
save(out, "oneshot_at_50", table=oneshot_table)
save(out, "recovery", fig=fig, table=table, meta=settings,
     text=f"# Recovery after pruning ({args.model})\n\n{words}\n\n"
          f"One-shot methods at {args.fraction:.0%} (test perplexity, lowest first):\n\n"
          f"{markdown_table(oneshot_table.drop(columns='heads'))}\n\n"
          f"Recovery ({args.steps} AdamW steps each, lr {args.lr:g} with 10% warmup and cosine decay, "
          f"seed {args.seed}; test split, {len(eval_ids):,} tokens; gap shares against each set's own pruned "
          f"perplexity; seconds on this machine, 2 cores):\n\n{markdown_table(table)}\n\nHeads removed:\n\n"
          f"{markdown_table(sets_table)}\n")
print(words)
