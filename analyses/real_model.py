"""The study of a real model, beside its ``headprune run`` report: what the run's report does not answer.

    headprune run --model smollm2-135m-instruct --out reports/smollm2-135m-instruct
    python -m analyses.real_model reports/smollm2-135m-instruct      -> study.md, study_*.csv, study_*.png there

It reads the run's settings (model, token budget, windows, seed) and tables, and adds, on the same budget:

- **prose vs code**: ``abl_zero`` of every head on the ``code`` corpus (the standard library's source, validation
  split), beside the run's on ``default`` (its documentation): do the induction and previous-token heads the anatomy
  finds cost the most when ablated, and on which data;
- **units**: pruning curves by KV group (a group's query heads and their shared K/V removed together, ranked by
  the group's joint ``abl_zero``) and by the best uniform prune (:func:`headprune.pruning.uniform.uniform_heads`,
  what stock transformers loads at smaller shapes), against random groups;
- **recovery**: the best ranking's prunes at 30% and 50% distilled from the unpruned model (KL, α = 1) for a few
  steps on the train split;
- **tasks**: each built-in patching task's clean accuracy (answer logit above the wrong one) and logit difference:
  which the model performs, and an exact patching study of each performed task the run did not patch.

Each part is written as it finishes and skipped when its table is already there with the same settings, so a
killed study resumes (the code sweep also per layer, through its progress file). ``study.md``'s sentences are
computed from the tables by :func:`analyses.study_findings.findings` (tested against tables built by hand);
``--render-only`` re-renders study.md from the committed tables without loading the model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from analyses.common import save
from analyses.study_findings import PERFORMS, TOP, findings, prose_code_roles
from headprune.io.work.files import write_text

UNIT_FRACTIONS = (0.1, 0.2, 0.3, 0.5)
RECOVER_FRACTIONS = (0.3, 0.5)
RANDOM_GROUP_SEEDS = 3


# --- the parts, each one table ------------------------------------------------------------------------------------

def code_scores(model, ids, windowing, bootstrap: int, seed: int, progress) -> pd.DataFrame:
    """``abl_zero`` of every head on ``ids`` (the code corpus), with its 95% interval over windows."""
    from headprune.scoring import ScoringOptions, score_heads

    scored = score_heads(model, ids, ["abl_zero"], windowing=windowing,
                         options=ScoringOptions(bootstrap=bootstrap, seed=seed), progress=progress)
    t = scored.table
    return t[["layer", "head", "head_id", "abl_zero", "abl_zero_ci_lo", "abl_zero_ci_hi"]]


def unit_curves(model, score_ids, eval_ids, windowing, scores: pd.DataFrame, best: str, seed: int,
                bootstrap: int, progress) -> pd.DataFrame:
    """Curves by KV group (joint group ``abl_zero``), random groups (seeded), and the best uniform prune by ``best``
    and by ``abl_zero``: each a head set per fraction, evaluated like the run's curves."""
    from headprune.pruning.curves import pruning_curves
    from headprune.pruning.options import CurveOptions, Selection
    from headprune.pruning.uniform import uniform_heads
    from headprune.schema import split_ranking
    from headprune.scoring.groups import GROUP_METHOD, groups, score_groups

    table, _ = score_groups(model, score_ids, scores, windowing, replicates=0, seed=seed)
    members = {f"L{layer}G{kv}": [(layer, h) for h in heads] for layer, kv, heads in groups(model)}
    n_groups = len(members)
    order = table.sort_values([GROUP_METHOD, "group_id"])["group_id"].tolist()  # least important first
    rng = np.random.default_rng(seed)
    shuffles = [rng.permutation(sorted(members)).tolist() for _ in range(RANDOM_GROUP_SEEDS)]
    sets: dict[tuple[str, float], list] = {}
    name, by_layer = split_ranking(best)
    selection = Selection(seed=seed).by_layer() if by_layer else Selection(seed=seed)
    for f in UNIT_FRACTIONS:
        k = round(f * n_groups)
        sets[("group:abl_zero", f)] = [h for g in order[:k] for h in members[g]]
        for s, shuffled in enumerate(shuffles):
            sets[(f"group:random#{s}", f)] = [h for g in shuffled[:k] for h in members[g]]
        sets[(f"uniform:{best}", f)] = uniform_heads(model, scores, name, fraction=f, selection=selection)
        sets[("uniform:abl_zero", f)] = uniform_heads(model, scores, "abl_zero", fraction=f)
    methods = sorted({m for m, _ in sets})
    options = CurveOptions(fractions=UNIT_FRACTIONS, seeds=1, bootstrap=bootstrap, selection=Selection(seed=seed),
                           windowing=windowing, head_sets=sets)
    return pruning_curves(model, eval_ids, scores, [(m, "none") for m in methods], options=options,
                          progress=progress)


def recovery(model, train_ids, eval_ids, windowing, scores: pd.DataFrame, best: str, steps: int, seed: int
             ) -> pd.DataFrame:
    """The best ranking's prune at each of :data:`RECOVER_FRACTIONS`, distilled ``steps`` steps (KL from the
    unpruned model, batches of 4 windows of the run's length): test perplexity before and after."""
    from headprune.perplexity import evaluate
    from headprune.pruning.finetune import Recipe, finetune, gap_recovered
    from headprune.pruning.options import Selection
    from headprune.pruning.prune import prune_model
    from headprune.pruning.selection import select_heads
    from headprune.schema import split_ranking

    name, by_layer = split_ranking(best)
    selection = Selection(seed=seed).by_layer() if by_layer else Selection(seed=seed)
    base = evaluate(model, eval_ids, windowing, progress=False).ppl
    rows = []
    for f in RECOVER_FRACTIONS:
        heads = select_heads(scores, name, fraction=f, selection=selection)
        pruned = prune_model(model, heads)
        before = evaluate(pruned, eval_ids, windowing, progress=False).ppl
        recipe = Recipe(steps=steps, batch_size=4, seq_len=windowing.seq_len, seed=seed, distill_weight=1.0,
                        temperature=1.0)
        t0 = time.perf_counter()
        finetune(pruned, train_ids, recipe, teacher=model, show_progress=True)
        after = evaluate(pruned, eval_ids, windowing, progress=False).ppl
        rows.append({"method": best, "fraction": f, "heads_pruned": len(heads), "steps": steps,
                     "train_tokens": steps * 4 * windowing.seq_len, "ppl_unpruned": base, "ppl_pruned": before,
                     "ppl_distilled": after, "gap_recovered": gap_recovered(base, before, after),
                     "seconds": time.perf_counter() - t0})
    return pd.DataFrame(rows)


def task_table(model, seed: int, pairs_per_task: int) -> pd.DataFrame:
    """Each built-in task: its clean accuracy and mean logit differences (clean, corrupt), or why it cannot run."""
    from headprune.errors import HeadpruneError
    from headprune.patching.exact import run_pairs
    from headprune.patching.tasks import TASKS, task_pairs

    rows = []
    for task in TASKS:
        try:
            pairs = task_pairs(task, model, n_pairs=pairs_per_task, seed=seed)
        except HeadpruneError as e:
            rows.append({"task": task, "pairs": 0, "accuracy": math.nan, "logit_diff_clean": math.nan,
                         "logit_diff_corrupt": math.nan, "performs": False, "note": str(e)})
            continue
        runs = run_pairs(model, pairs)
        accuracy = float((runs.m_clean > 0).double().mean())
        rows.append({"task": task, "pairs": len(pairs), "accuracy": accuracy,
                     "logit_diff_clean": float(runs.m_clean.mean()), "logit_diff_corrupt": float(runs.m_corrupt.mean()),
                     "performs": accuracy >= PERFORMS, "note": ""})
    return pd.DataFrame(rows)


# --- the figure ---------------------------------------------------------------------------------------------------

def plot_study(curves: pd.DataFrame, units: pd.DataFrame, rec: pd.DataFrame, scores: pd.DataFrame,
               code: pd.DataFrame, anatomy: pd.DataFrame, best: str):
    """Left: ΔNLL against heads removed by unit (query head, KV group, uniform) and random, with the distilled
    points; right: each head's zero-ablation cost on prose against code, the strongest induction and
    previous-token heads marked."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.4), layout="constrained")
    ax, bx = fig.subplots(1, 2)
    n_heads = len(scores)

    def line(frame: pd.DataFrame, method: str, label: str, **style) -> None:
        c = frame[(frame["method"] == method) & (frame["compensation"] == "none")].sort_values("fraction")
        ax.plot(c["heads_pruned"] / n_heads, c["delta_nll"], label=label, **style)

    if best != "abl_zero":  # (drawn next)
        line(curves, best, f"{best} (query heads)", color="#0072B2", marker="o")
    line(curves, "abl_zero", "abl_zero (query heads)", color="#009E73", marker="s")
    line(curves, "random", "random query heads (mean of seeds)", color="grey", marker=".")
    line(units, "group:abl_zero", "KV groups by joint abl_zero", color="#D55E00", marker="^")
    rand = units[units["method"].str.startswith("group:random")].groupby("fraction")[["heads_pruned", "delta_nll"]]
    rand = rand.mean().reset_index()
    ax.plot(rand["heads_pruned"] / n_heads, rand["delta_nll"], color="grey", ls="--", marker="x",
            label="random KV groups (mean)")
    for m, color in zip(sorted(units["method"][units["method"].str.startswith("uniform:")].unique()),
                        ("#CC79A7", "#E69F00")):
        line(units, m, f"uniform by {m.split(':', 1)[1]}", color=color, marker="D", ls=":")
    ax.scatter(rec["heads_pruned"] / n_heads, np.log(rec["ppl_distilled"] / rec["ppl_unpruned"]), marker="*", s=140,
               color="#0072B2", zorder=5, label=f"{best} distilled ({int(rec['steps'].iloc[0])} steps)")
    ax.set(xlabel="share of heads removed", ylabel="ΔNLL (nats/token, test split)",
           title="Pruning by unit")
    ax.set_yscale("symlog", linthresh=0.01)
    ax.legend(fontsize=8)
    j = prose_code_roles(scores, code, anatomy)
    bx.scatter(j["abl_zero"], j["code"], s=12, color="lightgrey", label="every head")
    for role, color, marker in (("induction", "#D55E00", "^"), ("previous_token", "#0072B2", "s")):
        top = j.nlargest(TOP, role)
        bx.scatter(top["abl_zero"], top["code"], s=40, color=color, marker=marker,
                   label=f"{TOP} strongest {role.replace('_', '-')} heads")
    named = pd.concat([j.nlargest(3, "abl_zero"), j.nlargest(3, "code")]).drop_duplicates("head_id")
    for k, r in enumerate(named.sort_values("abl_zero").itertuples()):  # labels alternate below and above
        bx.annotate(r.head_id, (r.abl_zero, r.code), fontsize=8, textcoords="offset points",
                    xytext=(-34, -12) if k % 2 else (4, 4))
    bx.set(xlabel="abl_zero on prose (nats/token)", ylabel="abl_zero on code (nats/token)",
           title="Which heads cost the most: prose vs code")
    ticks = [-0.01, 0.0, 0.01, 0.1]
    bx.set_xscale("symlog", linthresh=0.005)
    bx.set_yscale("symlog", linthresh=0.005)
    bx.set_xticks(ticks, [f"{t:g}" for t in ticks])
    bx.set_yticks(ticks, [f"{t:g}" for t in ticks])
    bx.legend(fontsize=8)
    return fig


# --- the script ---------------------------------------------------------------------------------------------------

def ranking_key(scores: pd.DataFrame, best: str) -> str:
    """A digest of the head orders the unit and recovery parts prune by (``best``'s and ``abl_zero``'s): a rerun of
    the run that reorders heads recomputes them, one that moves scores in their last bits only does not."""
    from headprune.schema import split_ranking

    orders = [scores.sort_values([m, "head_id"])["head_id"].tolist() for m in (split_ranking(best)[0], "abl_zero")]
    return hashlib.sha256(json.dumps(orders).encode()).hexdigest()[:16]


def _fresh(out: Path, name: str, meta: dict) -> bool:
    """Whether part ``name`` must be computed: its table is absent or was made with other settings."""
    record = out / f"{name}.json"
    return not (out / f"{name}.csv").is_file() or not record.is_file() or json.loads(record.read_text()) != meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="the folder a headprune run wrote (its tables are read, the study is added)")
    ap.add_argument("--recover-steps", type=int, default=50, help="distillation steps per prune")
    ap.add_argument("--task-pairs", type=int, default=32, help="prompt pairs per task")
    ap.add_argument("--render-only", action="store_true",
                    help="only re-render study.md from the tables already in the folder (no model, no computation)")
    args = ap.parse_args()
    if args.render_only:
        print("\n".join(write_study(Path(args.run))))
        return
    from headprune.data.sources import is_builtin
    from headprune.data.tokens import corpus_ids
    from headprune.io.read.loading import load_model
    from headprune.io.read.tokenizer import model_tokenizer
    from headprune.io.work.progress import Progress
    from headprune.patching.study import StudyOptions, patch_study
    from headprune.patching.tasks import TASK_TEXT, task_pairs
    from headprune.perplexity import Windowing
    from headprune.report.patching_section import PatchingReport, write_patching_files

    run = Path(args.run)
    s = json.loads((run / "settings.json").read_text())
    model = load_model(s["model"], dtype=s["dtype"])
    tok = model_tokenizer(model)
    w = Windowing.for_model(model, s["seq_len"], s["stride"], s["batch_size"])
    tokens, seed, bootstrap = s["max_tokens"], s["seed"], s["bootstrap"]
    score_ids = corpus_ids(s["score_data"].split(" (validation split)")[0], "validation", tok, tokens)
    eval_ids = corpus_ids(s["data"], "test", tok, tokens)
    scores = pd.read_csv(run / "scores.csv")
    best = s["commands"]["ranking"]
    base = {"model_fingerprint": s["model_fingerprint"], "tokens": tokens, "seq_len": w.seq_len, "bos": w.bos,
            "seed": seed}
    progress = Progress(run / ".study-progress.jsonl", base)
    ranking = ranking_key(scores, best)

    if _fresh(run, "study_code_scores", meta := base | {"bootstrap": bootstrap}):
        print("[1/4] zero-ablation of every head on code (the code corpus' validation split)")
        code_ids = corpus_ids("code", "validation", tok, tokens)
        save(run, "study_code_scores", table=code_scores(model, code_ids, w, bootstrap, seed, progress), meta=meta)
    if _fresh(run, "study_units", meta := base | {"best": best, "fractions": list(UNIT_FRACTIONS),
                                                "ranking": ranking}):
        print("[2/4] pruning curves by KV group and uniform prunes")
        save(run, "study_units", table=unit_curves(model, score_ids, eval_ids, w, scores, best, seed, bootstrap,
                                                   progress), meta=meta)
    if _fresh(run, "study_recovery", meta := base | {"best": best, "steps": args.recover_steps,
                                                   "ranking": ranking}):
        print(f"[3/4] distillation of {best}'s prunes, {args.recover_steps} steps each")
        if not is_builtin(s["data"]):
            raise SystemExit(f"the run's data {s['data']} has no train split apart from its test text; distillation "
                             "trains on a built-in corpus' train split (default or code)")
        train_ids = corpus_ids(s["data"], "train", tok, args.recover_steps * 4 * w.seq_len + 1)
        save(run, "study_recovery", table=recovery(model, train_ids, eval_ids, w, scores, best, args.recover_steps,
                                                   seed), meta=meta)
    if _fresh(run, "study_tasks", meta := base | {"pairs": args.task_pairs}):
        print("[4/4] the built-in tasks: which the model performs; patching of those the run did not patch")
        tasks = task_table(model, seed, args.task_pairs)
        for r in tasks[tasks["performs"]].itertuples():
            if r.task == s.get("patch_task"):
                continue
            task_progress = Progress(run / f".study-progress-{r.task}.jsonl", meta | {"task": r.task})
            study = patch_study(model, task_pairs(r.task, model, n_pairs=args.task_pairs, seed=seed),
                                StudyOptions(bootstrap=bootstrap, seed=seed), progress=task_progress,
                                show_progress=True)
            write_patching_files(run / f"study_patch_{r.task}.csv", PatchingReport(
                study.table, study.agreement, study.missed,
                study.summary | {"task": r.task, "task_text": TASK_TEXT[r.task]}))
            task_progress.remove()
        save(run, "study_tasks", table=tasks, meta=meta)
    save(run, "study", fig=plot_study(pd.read_csv(run / "curves.csv"), pd.read_csv(run / "study_units.csv"),
                                      pd.read_csv(run / "study_recovery.csv"), scores,
                                      pd.read_csv(run / "study_code_scores.csv"), pd.read_csv(run / "anatomy.csv"),
                                      best))
    lines = write_study(run)
    progress.remove()
    print("\n".join(lines))


def write_study(run: Path) -> list[str]:
    """study.md from the tables in ``run`` (:func:`findings`); its sentences."""
    missing = [n for n in ("settings.json", "scores.csv", "curves.csv", "predictiveness.csv", "anatomy.csv",
                           "study_code_scores.csv", "study_units.csv", "study_recovery.csv", "study_tasks.csv")
               if not (run / n).is_file()]
    if missing:
        raise SystemExit(f"{run} lacks {', '.join(missing)}: run the study without --render-only first")
    lines = findings(run)
    write_text(run / "study.md", "# What the run's report does not answer\n\n"
               + f"Computed by `python -m analyses.real_model {run}` from the tables in this folder (re-rendered "
               f"from them alone by `python -m analyses.real_model {run} --render-only`); the figure is "
               "study.png.\n\n![Pruning by unit; ablation cost on prose vs code](study.png)\n\n"
               + "\n".join(f"- {line}" for line in lines) + "\n")
    return lines


if __name__ == "__main__":
    main()
