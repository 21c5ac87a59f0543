"""The study of a real model, beside its ``headprune run`` report: what the run's report does not answer.

    headprune run --model smollm2-135m-instruct --out reports/smollm2-135m-instruct
    python -m analyses.real_model reports/smollm2-135m-instruct      -> study.md, study_*.csv, study_*.png there

It reads the run's settings (model, token budget, windows, seed) and tables, and adds, on the same budget:

- **prose vs code**: ``abl_zero`` of every head on the ``code`` corpus (the standard library's source, validation
  split), beside the run's on ``default`` (its documentation): do the induction and previous-token heads the anatomy
  finds cost the most when ablated, and on which data;
- **units**: query heads, KV groups (a group's query heads and their shared K/V removed together) and the best
  uniform prune (:func:`headprune.pruning.uniform.uniform_heads`, what stock transformers loads at smaller shapes)
  compared at equal head counts and by one score, against random query heads and random KV groups
  (:mod:`analyses.study_units`);
- **recovery**: the best ranking's prunes at 30% and 50% distilled from the unpruned model (KL, α = 1) for a few
  steps on the train split, against a random prune of as many heads and the unpruned model trained the same way, with
  3 seeds each, measured on the test split and on the other built-in corpus (:mod:`analyses.study_recovery`);
- **tasks**: each built-in patching task's clean accuracy (answer logit above the wrong one) and logit difference:
  which the model performs, and an exact patching study of each performed task the run did not patch.

Each part is written as it finishes and skipped when its table is already there with the same settings, so a
killed study resumes (the code sweep also per layer, through its progress file). ``study.md``'s sentences are
computed from the tables by :func:`analyses.study_findings.findings` (tested against tables built by hand), and
its last section rates each headline finding certified, contested or refuted from its table's intervals
(:mod:`analyses.study_status`); ``--render-only`` re-renders study.md from the committed tables without loading the
model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analyses.common import save
from analyses.study_figure import plot_study
from analyses.study_findings import PERFORMS, findings
from analyses.study_recovery import (
    BATCH,
    RANDOM,
    RECOVER_FRACTIONS,
    RECOVER_SEEDS,
    UNPRUNED,
    Arm,
    arms,
    distill_arm,
    held_out_corpus,
    recovery_table,
)
from analyses.study_status import status_section
from analyses.study_units import GROUP, JOINT, QUERY, RANDOM_SEEDS, UNIT_FRACTIONS, random_sets, unit_counts
from headprune.io.work.files import write_text

# --- the parts, each one table ------------------------------------------------------------------------------------

def code_scores(model, ids, windowing, bootstrap: int, seed: int, progress) -> pd.DataFrame:
    """``abl_zero`` of every head on ``ids`` (the code corpus), with its 95% interval over windows."""
    from headprune.scoring import ScoringOptions, score_heads

    scored = score_heads(model, ids, ["abl_zero"], windowing=windowing,
                         options=ScoringOptions(bootstrap=bootstrap, seed=seed), progress=progress)
    t = scored.table
    return t[["layer", "head", "head_id", "abl_zero", "abl_zero_ci_lo", "abl_zero_ci_hi"]]


def unit_curves(study: Study) -> pd.DataFrame:
    """The units table (:mod:`analyses.study_units`): query heads, KV groups (by the same summed abl_zero and by
    their joint ablation), uniform shapes and random query heads and KV groups, each at the same head counts,
    evaluated like the run's curves, with the parameters each prune removes."""
    from headprune.models.ledger import param_table
    from headprune.pruning.curves import pruning_curves
    from headprune.pruning.options import CurveOptions, Selection
    from headprune.pruning.selection import select_heads
    from headprune.pruning.uniform import loadable_shapes, uniform_heads
    from headprune.schema import split_ranking
    from headprune.scoring.groups import GROUP_METHOD, groups, score_groups

    model, scores, best, seed = study.inputs.model, study.scores, study.best, study.s.seed
    table, _ = score_groups(model, study.inputs.score_ids, scores, study.inputs.windowing, replicates=0, seed=seed)
    members = {f"L{layer}G{kv}": [(layer, h) for h in heads] for layer, kv, heads in groups(model)}
    r, n_heads = model.cfg.group_size, len(scores)
    by_sum = table.sort_values(["abl_zero", "group_id"])["group_id"].tolist()  # least important first
    by_joint = table.sort_values([GROUP_METHOD, "group_id"])["group_id"].tolist()
    by_layer = split_ranking(best)[1]
    selection = Selection(seed=seed).by_layer() if by_layer else Selection(seed=seed)
    uniform = sorted({"abl_zero", best})
    heads = [(int(layer), int(h)) for layer, h in zip(scores["layer"], scores["head"])]
    sets: dict[tuple[str, float], list] = {}
    for n in unit_counts(n_heads, r, loadable_shapes(model).values()):
        f = n / n_heads
        sets[(QUERY, f)] = select_heads(scores, "abl_zero", count=n)
        sets[(GROUP, f)] = [h for g in by_sum[:n // r] for h in members[g]]
        sets[(JOINT, f)] = [h for g in by_joint[:n // r] for h in members[g]]
        for s, drawn in enumerate(random_sets(heads, n, RANDOM_SEEDS, seed + n)):
            sets[(f"query:random#{s}", f)] = drawn
        for s, drawn in enumerate(random_sets(sorted(members), n // r, RANDOM_SEEDS, seed + n)):
            sets[(f"group:random#{s}", f)] = [h for g in drawn for h in members[g]]
        for m in uniform:
            sets[(f"uniform:{m}", f)] = uniform_heads(model, scores, split_ranking(m)[0], count=n,
                                                      selection=selection if m == best else Selection(seed=seed))
    methods = sorted({m for m, _ in sets})
    options = CurveOptions(fractions=tuple(sorted({f for _, f in sets})), seeds=1, bootstrap=study.s.bootstrap,
                           selection=Selection(seed=seed), windowing=study.inputs.windowing, head_sets=sets)
    units = pruning_curves(model, study.inputs.eval_ids, scores, [(m, "none") for m in methods], options=options,
                           progress=study.progress)
    return units.assign(params_removed=int(param_table(model).params.sum()) - units["params"])


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


# --- the script ---------------------------------------------------------------------------------------------------

def ranking_key(scores: pd.DataFrame, best: str) -> str:
    """A digest of the head orders the unit and recovery parts prune by (``best``'s and ``abl_zero``'s): a rerun of
    the run that reorders heads recomputes them, one that moves scores in their last bits only does not."""
    from headprune.schema import split_ranking

    orders = [scores.sort_values([m, "head_id"])["head_id"].tolist() for m in (split_ranking(best)[0], "abl_zero")]
    return hashlib.sha256(json.dumps(orders).encode()).hexdigest()[:16]


def _fresh(out: Path, name: str, meta: dict) -> bool:
    """Whether part ``name`` must be computed: its table is absent or was made with other settings. A setting the
    table's record lacks counts as None (a key added later, e.g. ``bos``, at the value every earlier table had)."""
    record = out / f"{name}.json"
    if not (out / f"{name}.csv").is_file() or not record.is_file():
        return True
    return dict.fromkeys(meta) | json.loads(record.read_text()) != meta


@dataclass
class Study:
    """What every part reads: the run's folder and settings.json, the settings it ran with and the inputs its own
    stage rebuilds from them (:func:`headprune.stages.inputs.load_inputs`), its scores, and the study's progress."""

    run: Path
    record: dict  # settings.json as the run wrote it
    s: Any  # the RunSettings (headprune.stages.settings.saved_settings)
    inputs: Any  # the RunInputs: model, windows, tokenizer, both token streams
    scores: pd.DataFrame
    progress: Any = None

    @property
    def best(self) -> str:
        return self.record["commands"]["ranking"]

    @property
    def base(self) -> dict:
        """What every part's table depends on."""
        w = self.inputs.windowing
        return {"model_fingerprint": self.record["model_fingerprint"], "tokens": self.s.max_tokens,
                "seq_len": w.seq_len, "bos": w.bos, "seed": self.s.seed}


def open_study(run: Path) -> Study:
    """The run's settings and its inputs as its own stage loads them, its scores and the study's progress file."""
    from headprune.io.work.progress import Progress
    from headprune.scoring.result import load_scores
    from headprune.stages.inputs import reload_inputs

    record, s, inputs = reload_inputs(run)
    study = Study(run, record, s, inputs, load_scores(run / "scores.parquet").table)
    study.progress = Progress(run / ".study-progress.jsonl", study.base)
    return study


def code_part(study: Study, args: argparse.Namespace) -> None:
    from headprune.data.tokens import corpus_ids

    if _fresh(study.run, "study_code_scores", meta := study.base | {"bootstrap": study.s.bootstrap}):
        print("[1/4] zero-ablation of every head on code (the code corpus' validation split)")
        code_ids = corpus_ids("code", "validation", study.inputs.tokenizer, study.s.max_tokens)
        save(study.run, "study_code_scores", table=code_scores(study.inputs.model, code_ids, study.inputs.windowing,
                                                               study.s.bootstrap, study.s.seed, study.progress),
             meta=meta)


def units_part(study: Study, args: argparse.Namespace) -> None:
    meta = study.base | {"best": study.best, "fractions": list(UNIT_FRACTIONS), "random_seeds": RANDOM_SEEDS,
                         "units": "equal head counts",
                         "ranking": ranking_key(study.scores, study.best)}
    if _fresh(study.run, "study_units", meta):
        print("[2/4] query heads, KV groups and uniform prunes at equal head counts")
        save(study.run, "study_units", table=unit_curves(study), meta=meta)


def recovery_part(study: Study, args: argparse.Namespace) -> None:
    from headprune.data.sources import is_builtin
    from headprune.data.tokens import corpus_ids

    seeds, w = args.recover_seeds, study.inputs.windowing
    meta = study.base | {"best": study.best, "steps": args.recover_steps, "seeds": seeds,
                         "fractions": list(RECOVER_FRACTIONS), "controls": [RANDOM, UNPRUNED],
                         "ranking": ranking_key(study.scores, study.best)}
    if not _fresh(study.run, "study_recovery", meta):
        return
    if not is_builtin(study.s.data):
        raise SystemExit(f"the run's data {study.s.data} has no train split apart from its test text; "
                         "distillation trains on a built-in corpus' train split (default or code)")
    todo = arms(study.scores, study.best, study.s.seed, seeds)
    print(f"[3/4] distillation of {study.best}'s prunes against a random prune and the unpruned model: {len(todo)} "
          f"runs of {args.recover_steps} steps ({seeds} seeds each), resumable run by run")
    tokenizer, n = study.inputs.tokenizer, study.s.max_tokens
    train_ids = corpus_ids(study.s.data, "train", tokenizer, args.recover_steps * BATCH * w.seq_len + 1)
    held_out = held_out_corpus(study.s.data)
    # the run's own test tokens first, then the corpus distillation never sees
    evals = {study.s.data: study.inputs.eval_ids, held_out: corpus_ids(held_out, "test", tokenizer, n)}
    model, progress = study.inputs.model, study.progress
    units = {"steps": args.recover_steps, "ranking": meta["ranking"]}

    def run_arm(arm: Arm) -> list[dict]:
        checkpoint = study.run / ".study-distill.pt"
        rows = progress.get_or_compute(f"{arm.unit}:{units}", lambda: distill_arm(
            model, arm, train_ids, evals, w, args.recover_steps, checkpoint=checkpoint))
        checkpoint.unlink(missing_ok=True)
        return rows

    save(study.run, "study_recovery", table=recovery_table(model, study.best, todo, evals, w, args.recover_steps,
                                                           run_arm), meta=meta)


def tasks_part(study: Study, args: argparse.Namespace) -> None:
    from headprune.io.work.progress import Progress
    from headprune.patching.study import StudyOptions, patch_study
    from headprune.patching.tasks import TASK_TEXT, task_pairs
    from headprune.report.patching_section import PatchingReport, write_patching_files

    if not _fresh(study.run, "study_tasks", meta := study.base | {"pairs": args.task_pairs}):
        return
    print("[4/4] the built-in tasks: which the model performs; patching of those the run did not patch")
    model, seed = study.inputs.model, study.s.seed
    tasks = task_table(model, seed, args.task_pairs)
    for r in tasks[tasks["performs"]].itertuples():
        if r.task == study.record.get("patch_task"):
            continue
        task_progress = Progress(study.run / f".study-progress-{r.task}.jsonl", meta | {"task": r.task})
        patched = patch_study(model, task_pairs(r.task, model, n_pairs=args.task_pairs, seed=seed),
                              StudyOptions(bootstrap=study.s.bootstrap, seed=seed), progress=task_progress,
                              show_progress=True)
        write_patching_files(study.run / f"study_patch_{r.task}.csv", PatchingReport(
            patched.table, patched.agreement, patched.missed,
            patched.summary | {"task": r.task, "task_text": TASK_TEXT[r.task]}))
        task_progress.remove()
    save(study.run, "study_tasks", table=tasks, meta=meta)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="the folder a headprune run wrote (its tables are read, the study is added)")
    ap.add_argument("--recover-steps", type=int, default=50, help="distillation steps per prune")
    ap.add_argument("--recover-seeds", type=int, default=RECOVER_SEEDS,
                    help="training seeds per arm (the ranking's prune, a random prune, the unpruned model)")
    ap.add_argument("--task-pairs", type=int, default=32, help="prompt pairs per task")
    ap.add_argument("--render-only", action="store_true",
                    help="only re-render study.md from the tables already in the folder (no model, no computation)")
    args = ap.parse_args()
    run = Path(args.run)
    if not args.render_only:
        study = open_study(run)
        for part in (code_part, units_part, recovery_part, tasks_part):
            part(study, args)
        tables = {name: pd.read_csv(run / f"{name}.csv") for name in ("curves", "study_units", "study_recovery",
                                                                      "study_code_scores", "anatomy")}
        save(run, "study", fig=plot_study(tables["curves"], tables["study_units"], tables["study_recovery"],
                                          study.scores, tables["study_code_scores"], tables["anatomy"], study.best))
        study.progress.remove()
    print("\n".join(write_study(run)))


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
               + "\n".join(f"- {line}" for line in lines) + "\n\n" + status_section(run))
    return lines


if __name__ == "__main__":
    main()
