"""The real-model study's sentences (``study.md``), each computed from the tables in the run's folder: the run's
(scores, curves, predictiveness, anatomy, serving) and the study's own (``study_*.csv``). Nothing here loads a model,
so ``python -m analyses.real_model RUN --render-only`` re-renders study.md from committed tables in seconds.

What a sentence may claim is what its table measured: units are compared at equal head counts, each prune's own
(:mod:`analyses.study_units`); a break point is located between two
measured points (:mod:`headprune.report.breaks`); a random band comes with its seed count and range; a layer's cost
is its heads removed together (chosen on validation, reported on test: :mod:`headprune.report.layers`), or, for a run
without that table, a sum of single ablations said to be one; a distillation result says what it was measured on
and what it lacks; a serving difference is a speed-up only where the slowest–fastest ranges separate.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from analyses.study_recovery import controlled, recovery_sentences
from analyses.study_units import unit_sentences
from headprune.report.breaks import BREAK_NATS, find_break
from headprune.report.layers import layer_finding, read_layers

PERFORMS = 0.8  # a task is performed when at least this share of clean prompts ranks the answer above the wrong token
TOP = 5


def _heads(items) -> str:
    items = list(items)
    return ", ".join(items[:-1]) + f" and {items[-1]}" if len(items) > 1 else "".join(items)


def _ranks(values: pd.Series) -> pd.Series:
    """1 = the largest value."""
    return values.rank(ascending=False, method="min").astype(int)


def prose_code_roles(scores: pd.DataFrame, code: pd.DataFrame, anatomy: pd.DataFrame) -> pd.DataFrame:
    """One row per head: abl_zero on prose (``abl_zero``) and on code (``code``) beside its anatomy columns."""
    code = code[["head_id", "abl_zero"]].rename(columns={"abl_zero": "code"})
    return scores[["head_id", "abl_zero"]].merge(code, on="head_id").merge(anatomy, on="head_id")


def role_sentences(scores: pd.DataFrame, code: pd.DataFrame, anatomy: pd.DataFrame, seed: int = 0) -> list[str]:
    """Do the strongest induction and previous-token heads cost the most when ablated, on prose and on code? Ranks:
    1 = the costliest head."""
    from headprune.report.anatomy import bootstrap_spearman

    j = prose_code_roles(scores, code, anatomy)
    n = len(j)
    prose_rank, code_rank = _ranks(j["abl_zero"]), _ranks(j["code"])
    out = []
    for role, what in (("induction", "induction"), ("previous_token", "previous-token")):
        top = j[role].sort_values(ascending=False).index[:TOP]
        names = [f"{j.at[i, 'head_id']} ({j.at[i, role]:.2f})" for i in top]
        rho_p = bootstrap_spearman(j[role].to_numpy(), j["abl_zero"].to_numpy(), seed=seed)
        rho_c = bootstrap_spearman(j[role].to_numpy(), j["code"].to_numpy(), seed=seed)
        out.append(
            f"The {TOP} strongest {what} heads ({what} score in brackets: {_heads(names)}) rank "
            f"{_heads(str(prose_rank[i]) for i in top)} of {n} by zero-ablation cost (1 = costliest) on prose and "
            f"{_heads(str(code_rank[i]) for i in top)} on code (median ranks {np.median(prose_rank[top]):.0f} and "
            f"{np.median(code_rank[top]):.0f}); Spearman ρ of the {what} score with the ablation cost over all heads: "
            f"{rho_p[0]:+.2f} [{rho_p[1]:+.2f}, {rho_p[2]:+.2f}] on prose, {rho_c[0]:+.2f} "
            f"[{rho_c[1]:+.2f}, {rho_c[2]:+.2f}] on code.")
    rho = bootstrap_spearman(j["abl_zero"].to_numpy(), j["code"].to_numpy(), seed=seed)
    top_p = set(j.nlargest(TOP, "abl_zero")["head_id"])
    top_c = set(j.nlargest(TOP, "code")["head_id"])
    moved = j.assign(shift=(prose_rank - code_rank).abs()).nlargest(3, "shift")
    out.append(
        f"Prose vs code: the heads' zero-ablation costs rank-correlate at ρ {rho[0]:+.2f} [{rho[1]:+.2f}, "
        f"{rho[2]:+.2f}]; {len(top_p & top_c)} of the top {TOP} are shared (prose: {_heads(sorted(top_p))}; code: "
        f"{_heads(sorted(top_c))}); the total over all heads is {j['abl_zero'].sum():.3f} nats/token on prose and "
        f"{j['code'].sum():.3f} on code; the heads that move most: "
        + _heads(f"{r.head_id} (rank {prose_rank[i]} → {code_rank[i]})" for i, r in moved.iterrows()) + ".")
    return out


def _between(curves: pd.DataFrame, method: str) -> str:
    found = find_break(curves, method)
    if found is None:
        return f"not up to {float(curves['fraction'].max()):.0%}"
    share = lambda f: f"{f:.1%}".replace(".0%", "%")  # 10%, 12.5%
    return f"between {share(found.before)} and {share(found.after)} of heads"


def curve_sentences(curves: pd.DataFrame, units: pd.DataFrame, best: str, n_heads: int) -> list[str]:
    """Where the best ranking and random break (between two grid points), then the units compared at equal head
    counts (:func:`analyses.study_units.unit_sentences`)."""
    out = [(f"Where pruning breaks (ΔNLL first above {BREAK_NATS} nats/token, perplexity "
            f"+{math.expm1(BREAK_NATS):.1%}; located between two measured points, random's on the grid): "
            f"{best} {_between(curves, best)}, "
            f"random {_between(curves, 'random')}.")]
    return out + unit_sentences(units, n_heads)


def recovery_sentence(rec: pd.DataFrame) -> str:
    """Distillation's share of the gap won back, with what it was measured on and what it lacks: the table of one
    seed and no control the studies had before :mod:`analyses.study_recovery`."""
    parts = [f"at {r.fraction:.0%} ({r.heads_pruned} heads) perplexity {r.ppl_unpruned:.2f} → {r.ppl_pruned:.2f}, "
             f"distilled {r.ppl_distilled:.2f} ("
             + (f"{r.gap_recovered:.0%} of the gap recovered)" if math.isfinite(r.gap_recovered)
                else "no gap to recover)")
             for r in rec.itertuples()]
    r0 = rec.iloc[0]
    return (f"Distillation from the unpruned model ({int(r0.steps)} steps, {int(r0.train_tokens):,} training tokens, "
            f"{r0.method}'s prunes): " + "; ".join(parts) + ". Measured on the test split of the corpus it trained "
            "on (the train split), one seed, no control (no random prune or unpruned model trained the same way).")


def task_sentences(tasks: pd.DataFrame, patched: dict[str, pd.DataFrame]) -> list[str]:
    """Per task: performed or not (and why not run); for a performed task with an exact patching table, the three
    heads that restore the most of the clean-corrupt gap (patch_z, a share of the gap, denoising) and their sum."""
    out = []
    for r in tasks.itertuples():
        if not r.pairs:
            out.append(f"{r.task}: not run ({r.note})")
            continue
        verdict = "performs it" if r.performs else f"does not perform it (below {PERFORMS:.0%})"
        line = (f"{r.task}: the model {verdict}: {r.accuracy:.0%} of {r.pairs} clean prompts rank the answer above "
                f"the wrong token, logit difference {r.logit_diff_clean:+.2f} clean, {r.logit_diff_corrupt:+.2f} "
                "corrupt")
        if r.performs and r.task in patched:
            top = patched[r.task].nlargest(3, "patch_z")
            line += ("; exact patching: " + _heads(f"{h.head_id} {h.patch_z:.2f}" for h in top.itertuples())
                     + f" of the gap each, the largest of {len(patched[r.task])} heads (single-head effects need not "
                     f"add up: {top['patch_z'].sum():.2f} together)")
        out.append(line + ".")
    return out


def speed(r, base, column: str) -> str:
    """``faster`` / ``slower`` than ``base`` where the slowest–fastest ranges of ``column`` separate, else
    ``no difference shown`` (the ranges overlap): :func:`headprune.report.serving_section.rate_verdict`."""
    from headprune.report.serving_section import rate_verdict

    verdict = rate_verdict(pd.Series(r._asdict()), pd.Series(base._asdict()), column)
    return "no difference shown (ranges overlap)" if verdict == "within the spread" else verdict


def serving_sentence(serving: pd.DataFrame) -> str:
    """Each uniform export's size, perplexity and speeds; against the unpruned row, a difference in speed is named
    only where the ranges separate."""
    base = next((r for r in serving.itertuples() if int(r.removed) == 0), None)
    rows = []
    for r in serving.itertuples():
        text = (f"{r.fraction:.0%} asked, {int(r.removed)} heads removed ({int(r.query_heads)} query / "
                f"{int(r.kv_heads)} KV heads per layer): {int(r.parameters) / 1e6:.1f} M parameters, "
                f"perplexity {r.ppl:.2f}, "
                f"prefill {r.prefill_tokens_per_s:,.0f} tokens/s ({r.prefill_tokens_per_s_min:,.0f}–"
                f"{r.prefill_tokens_per_s_max:,.0f}), decode (32 sequences) {r.decode_b32_tokens_per_s:,.0f} "
                f"tokens/s ({r.decode_b32_tokens_per_s_min:,.0f}–{r.decode_b32_tokens_per_s_max:,.0f})")
        if base is not None and int(r.removed) > 0:
            text += (f", against unpruned: prefill {speed(r, base, 'prefill_tokens_per_s')}, decode "
                     f"{speed(r, base, 'decode_b32_tokens_per_s')}")
        rows.append(text)
    return "Uniform exports in stock transformers (median of repeats after warm-up, slowest–fastest): " + "; ".join(
        rows) + "."


def within_note(inverse: pd.DataFrame) -> str:
    """For the inversely ranking scores whose within-layer ρ interval reaches 0 or above: that the inversion is
    across layers only (empty where the table has no within-layer ρ or none is)."""
    if "within_layer_ci_hi" not in inverse or inverse.empty:
        return ""
    across = inverse[inverse["within_layer_ci_hi"] >= 0]
    if across.empty:
        return ""
    lo, hi = across["within_layer_rho"].min(), across["within_layer_rho"].max()
    return (f", across layers only: within a layer {_heads(across['method'])} "
            f"{'has' if len(across) == 1 else 'have'} ρ {lo:+.2f} to {hi:+.2f}, every 95% interval reaching 0 or "
            "above")


def findings(run: Path) -> list[str]:
    """The study's sentences from the tables in ``run`` (the run's and the study's own)."""
    settings = json.loads((run / "settings.json").read_text())
    scores = pd.read_csv(run / "scores.csv")
    curves = pd.read_csv(run / "curves.csv")
    pred = pd.read_csv(run / "predictiveness.csv")
    best = settings["commands"]["ranking"]
    layer_total = scores.groupby("layer")["abl_zero"].sum()
    first = int(layer_total.idxmax())
    rest = layer_total.drop(first)
    top = scores.nlargest(TOP, "abl_zero")
    heads = ("Which heads matter (zero-ablation on prose, 95% interval over windows): "
             + _heads(f"{r.head_id} {r.abl_zero:.3f} [{r.abl_zero_ci_lo:.3f}, {r.abl_zero_ci_hi:.3f}]"
                      for r in top.itertuples()))
    layers = read_layers(run)
    if layers is not None:  # the run removed each layer's heads together: the library's sentence on it
        out = [heads + ".", layer_finding(layers, scores)]
    else:
        out = [heads + f"; layer {first} holds {layer_total[first] / layer_total.sum():.0%} of the total "
               f"({layer_total[first]:.3f} of {layer_total.sum():.3f} nats/token, a sum of single ablations: the "
               "layer's heads were not removed together); the second-largest layer is "
               f"{int(rest.idxmax())} ({rest.max():.3f})."]
    out += role_sentences(scores, pd.read_csv(run / "study_code_scores.csv"), pd.read_csv(run / "anatomy.csv"))
    cheap = pred[(pred["kind"] == "importance") & ~pred["method"].str.startswith("abl_")].sort_values(
        "spearman_rho", ascending=False)
    good = cheap.iloc[0]
    bad = cheap[cheap["spearman_ci_hi"] <= 0]["method"].tolist()
    out.append(f"Cheap scores against zero-ablation (Spearman ρ over {int(good.n)} heads, 95% interval): "
               + "; ".join(f"{r.method} {r.spearman_rho:+.2f} [{r.spearman_ci_lo:+.2f}, {r.spearman_ci_hi:+.2f}]"
                           for r in cheap.itertuples())
               + f". The best is {good.method}" + (f"; {_heads(bad)} rank heads inversely" if bad else "")
               + within_note(cheap[cheap["spearman_ci_hi"] <= 0]) + ".")
    out += curve_sentences(curves, pd.read_csv(run / "study_units.csv"), best, len(scores))
    rec = pd.read_csv(run / "study_recovery.csv")
    out += recovery_sentences(rec) if controlled(rec) else [recovery_sentence(rec)]
    tasks = pd.read_csv(run / "study_tasks.csv", keep_default_na=False, na_values=[""])
    patched = {t: pd.read_csv(p) for t, p in [(settings.get("patch_task"), run / "patch.csv"),
                                               *[(t, run / f"study_patch_{t}.csv") for t in tasks["task"]]]
               if t and p.is_file()}
    out += task_sentences(tasks, patched)
    if (run / "serving.csv").is_file():
        out.append(serving_sentence(pd.read_csv(run / "serving.csv")))
    if (run / "serving_llama_cpp.csv").is_file():  # the run's report section's sentences, from the same table
        from headprune.report.serving_gguf_section import gguf_serving_findings

        gguf = pd.read_csv(run / "serving_llama_cpp.csv")
        ranking = settings.get("serving_llama_cpp", {}).get("ranking", settings["commands"]["ranking"])
        out += [f"In llama.cpp: {s[0].lower()}{s[1:]}" for s in gguf_serving_findings(gguf, ranking)]
    return out
