"""End to end through the CLI: run, score, prune, curve, report on a tiny model and a small corpus."""

import json
import math
import re
import shutil
from collections import Counter
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import GPT2LMHeadModel

from headprune.cli.main import main
from headprune.io.read.loading import load_model
from headprune.io.work.files import read_scores
from headprune.models.interventions import mask_gates
from headprune.schema import CURVE_COLUMNS, FILL_COLUMN, METHODS, OPT_IN, SCORES_DIGEST, score_columns

RUN_METHODS = [m for m in METHODS if m not in OPT_IN]  # abl_opt only with RunSettings(optimal=True)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    import pydoc_data.topics

    folder = tmp_path_factory.mktemp("corpus")
    (folder / "c.txt").write_text(" ".join(list(pydoc_data.topics.topics.values())[:30])[:12000])
    return folder / "c.txt"


@pytest.fixture(autouse=True)
def token_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HEADPRUNE_CACHE", str(tmp_path_factory.getbasetemp() / "token-cache"))


@pytest.fixture(scope="module")
def run_dir(tiny_dir, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "report"
    mp = pytest.MonkeyPatch()
    mp.setenv("HEADPRUNE_CACHE", str(tmp_path_factory.getbasetemp() / "token-cache"))
    mp.setenv("HEADPRUNE_TEST_KEEP_PROGRESS", "1")  # removed at the end; kept for the resume test's complete file
    code = main(["run", "--model", str(tiny_dir), "--data", str(corpus), "--score-data", str(corpus), "--out", str(out),
                 "--max-tokens", "400", "--fractions", "0,0.25,0.5,0.75", "--seeds", "2", "--quiet"])
    mp.undo()
    assert code == 0
    return out


class _Images(HTMLParser):
    def __init__(self):
        super().__init__()
        self.srcs = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.srcs.append(dict(attrs)["src"])


def test_run_writes_every_report_file(run_dir):
    names = {p.name for p in run_dir.iterdir()}
    for name in ["scores.parquet", "scores.csv", "scores.means.safetensors", "scores.meta.json", "curves.parquet",
                 "curves.csv", "summary.md", "report.html", "curves.png", "rank_correlation.png", "predictiveness.csv",
                 "ledger.txt"]:
        assert name in names
    assert {"heatmaps.png", "scatters.png", "pruning_order.png"} <= names
    assert not [n for n in names if n.endswith(".tmp")]


def test_run_tables(run_dir):
    scores = read_scores(run_dir / "scores.parquet")
    assert list(scores.columns) == score_columns(RUN_METHODS)
    assert len(scores) == 12 and scores[RUN_METHODS].notna().all().all()
    curves = pd.read_parquet(run_dir / "curves.parquet")
    assert list(curves.columns) == [*CURVE_COLUMNS, FILL_COLUMN, SCORES_DIGEST]
    assert (curves[FILL_COLUMN] == "").eq(curves.compensation == "none").all()
    assert curves.loc[curves.compensation == "mean", FILL_COLUMN].str.contains("validation split").all()
    baseline = json.loads((run_dir / "baseline.json").read_text())
    zero = curves[curves.fraction == 0]
    assert (zero.nll == baseline["nll"]).all() and (zero.delta_nll == 0).all()
    assert math.exp(baseline["nll"]) == pytest.approx(baseline["ppl"], rel=1e-12)
    for _, group in curves.groupby(["method", "compensation"]):
        assert group.sort_values("fraction").heads_pruned.is_monotonic_increasing
        assert group.heads_pruned.tolist() == [0, 3, 6, 9]
    assert set(curves.compensation) == {"none", "mean"}
    random = curves[curves.method == "random"]
    assert (random.n_seeds == 2).all() and (random[random.fraction > 0].nll_std > 0).all()
    summary = (run_dir / "summary.md").read_text()
    assert "validation split" in summary and "test split" in summary
    assert isinstance(baseline["bytes"], int) and baseline["bytes"] >= baseline["tokens"]
    assert f"{baseline['nll'] * baseline['tokens'] / (math.log(2) * baseline['bytes']):.4g} bits/byte" in summary
    # the stages' results read back whole from the report folder
    from headprune.scoring.result import load_scores
    from headprune.stages.curves import load_curves

    saved = load_scores(run_dir / "scores.parquet")
    assert set(saved.means) == set(zip(scores["layer"], scores["head"], strict=True))
    assert saved.measured_on["seq_len"] == json.loads((run_dir / "settings.json").read_text())["seq_len"]
    loaded = load_curves(run_dir)
    assert loaded.baseline == baseline and loaded.choice.pick in summary
    # the pick's break located: no midpoint of its bracket left that removes a head count neither end removes
    from headprune.pruning.selection import ranking_heads
    from headprune.report.breaks import find_break, next_fraction

    pick = loaded.choice.pick
    heads_at = lambda f: len(ranking_heads(scores, pick, f))
    assert next_fraction(curves, pick, heads_at) is None
    grid = {0.0, 0.25, 0.5, 0.75}
    assert set(curves[curves.method != pick].fraction) <= grid  # only the pick is measured between grid points
    mine = curves[(curves.method == pick) & (curves.compensation == "none")]
    on_grid = find_break(mine[mine.fraction.isin(grid)], pick)
    for f in set(mine.fraction) - grid:  # each inside the bracket the grid left
        assert on_grid is not None and on_grid.before < f < on_grid.after


def test_scored_bytes_count_only_the_scored_tokens():
    from headprune.perplexity import Windowing, scored_bytes

    class Fake:
        def decode(self, ids):
            return "".join("é" if i % 2 else "a" for i in ids)  # 2 bytes or 1

    ids = torch.arange(10)  # seq_len 4, stride 4: windows [0,4) [4,8) [8,10) score 3, 3 and 1 new tokens
    scored = [1, 2, 3, 5, 6, 7, 9]
    assert scored_bytes(Fake(), ids, Windowing(4, 4, 1)) == sum(2 if i % 2 else 1 for i in scored)


def test_run_html_self_contained(run_dir):
    parser = _Images()
    parser.feed((run_dir / "report.html").read_text())
    assert len(parser.srcs) >= 5  # curves, per-layer rankings, pruning order, scatters, rank correlations, ...
    for src in parser.srcs:
        assert src.startswith("data:image/png;base64,")


# Where each unit family's work function is looked up at call time (patching the defining module would not
# reach the callers that imported the name), keyed by the unit-key prefix of the family.
WORK = {"weights": ("headprune.scoring.weights", "weight_scores"),
        "act": ("headprune.scoring.activations", "batch_sums"),
        "grad": ("headprune.scoring.gradients", "batch_gate_grad"),
        "abl": ("headprune.scoring.ablation", "ablate_layer"), "base": ("headprune.scoring.ablation", "cache_batch"),
        "curve": ("headprune.pruning.curves", "pruned_window_sums")}


def _count_work(monkeypatch):
    """Count the calls of every unit family's work function and the units computed through any Progress."""
    import importlib

    from headprune.io.work.progress import Progress

    calls, computed = Counter(), []

    def counting(family, fn):
        def wrapper(*a, **k):
            calls[family] += 1
            return fn(*a, **k)
        return wrapper

    for family, (module, name) in WORK.items():
        mod = importlib.import_module(module)
        monkeypatch.setattr(mod, name, counting(family, getattr(mod, name)))
    get_or_compute = Progress.get_or_compute

    def counted(self, unit, compute):
        return get_or_compute(self, unit, lambda: (computed.append(unit), compute())[1])

    monkeypatch.setattr(Progress, "get_or_compute", counted)
    return calls, computed


def _expected_calls(units) -> Counter:
    """Work-function calls that computing ``units`` takes: one per unit, but one cache_batch per ablated batch, no
    evaluation for a curve point at fraction 0 (its pruned model is the unpruned one: the baseline's number), and
    none for the curve baseline (its sums come with the cached residual stream)."""
    calls = Counter()
    for u in units:
        family = u.split("/")[0]
        if family.startswith("abl_"):
            calls["abl"] += 1
        elif family == "curve" and (u == "curve/w/baseline" or u.split("/")[4] == "0.0"):
            continue
        elif family != "base":  # a base unit reads the batch's cache
            calls[family] += 1
    calls["base"] = len({u.split("/")[2] for u in units if u.startswith(("base/", "abl_"))})
    return calls


def _unit_keys(progress) -> list[str]:
    return [json.loads(line)["unit"] for line in progress.read_text().splitlines()[1:]]


def _run_args(model, corpus, out):
    """The arguments the ``run_dir`` fixture ran with."""
    return ["run", "--model", str(model), "--data", str(corpus), "--score-data", str(corpus), "--out", str(out),
            "--max-tokens", "400", "--fractions", "0,0.25,0.5,0.75", "--seeds", "2", "--quiet"]


def test_run_is_resumable_without_recompute(run_dir, tiny_dir, corpus, capsys, monkeypatch, tmp_path):
    """A complete progress file (a run stopped after its last unit; a finished run removes it) answers every unit:
    rerunning computes no unit, appends nothing and writes the same tables; a unit missing from the file is the
    only one recomputed."""
    monkeypatch.setenv("HEADPRUNE_TEST_KEEP_PROGRESS", "1")
    out = tmp_path / "report"
    shutil.copytree(run_dir, out)
    progress = out / ".progress.jsonl"
    recorded = progress.read_bytes()
    tables = {name: (out / name).read_bytes() for name in ["scores.csv", "curves.csv", "baseline.json"]}
    units = _unit_keys(progress)
    assert {u.split("/")[0] for u in units} == {"weights", "act", "grad", "base", "abl_zero", "abl_mean",
                                                "abl_layer", "curve", "patch_z"}
    args = _run_args(tiny_dir, corpus, out)

    calls, computed = _count_work(monkeypatch)
    capsys.readouterr()
    assert main(args) == 0
    assert computed == [] and calls == Counter()
    assert progress.read_bytes() == recorded
    # the best method as printed: the even test windows' choice, and what the odd ones chose, read off curves.csv
    said = re.search(r"^best method: (\S+)(.*)$", capsys.readouterr().out, flags=re.MULTILINE)
    c = pd.read_csv(out / "curves.csv")
    sel = c[(c.method != "random") & (c.compensation == "none") & (c.fraction > 0) & (c.fraction <= 0.5)]
    even, odd = (sel.groupby("method")[h].mean().idxmin() for h in ("delta_nll_even", "delta_nll_odd"))
    assert said is not None and said[1] == even
    assert said[2] == (" (chosen alike on the even and the odd test windows)" if even == odd
                       else f" (chosen on the even test windows; the odd ones chose {odd})")
    assert {name: (out / name).read_bytes() for name in tables} == tables

    # one unit of every family forgotten: exactly those are recomputed, each by its own work function
    forget = ["weights", "act/w/True/b1", "grad/b0", "base/w/b1", "abl_zero/w/b1/L0", "abl_zero/w/b0/L1",
              "abl_mean/w/b0/L2", "curve/w/baseline",
              "curve/w/random/none/0.5/s1", "patch_z/logit_diff/denoise/all/L1"]
    assert set(forget) <= set(units)
    progress.write_text("".join(line for line in recorded.decode().splitlines(keepends=True)
                                if not any(f'"unit": "{u}"' in line for u in forget)))
    assert main(args) == 0
    assert sorted(computed) == sorted(forget)
    # batches 0 and 1 each rebuild their cache
    assert calls == Counter(weights=1, act=1, grad=1, base=2, abl=3, curve=1)
    assert sorted(_unit_keys(progress)) == sorted(units)
    assert {name: (out / name).read_bytes() for name in tables} == tables

    capsys.readouterr()
    assert main(["run", "--model", str(tiny_dir), "--data", str(corpus), "--out", str(out), "--max-tokens", "300",
                 "--quiet"]) == 2
    assert "different run" in capsys.readouterr().err
    assert sorted(_unit_keys(progress)) == sorted(units)


def _interrupt_after(monkeypatch, n: int):
    """Make the n+1-th unit computed through a Progress raise KeyboardInterrupt (as Ctrl-C would)."""
    from headprune.io.work.progress import Progress

    get_or_compute, done = Progress.get_or_compute, []

    def interrupting(self, unit, compute):
        if unit not in self:
            if len(done) == n:
                raise KeyboardInterrupt
            done.append(unit)
        return get_or_compute(self, unit, compute)

    monkeypatch.setattr(Progress, "get_or_compute", interrupting)


@pytest.mark.parametrize("command", ["score", "curve", "curve-compensated"])
def test_sweep_resume_computes_only_unrecorded_units(command, run_dir, tiny_dir, corpus, tmp_path, monkeypatch):
    """A sweep stopped after k units and rerun computes exactly the other units, once each, and writes the table
    an uninterrupted sweep writes; the progress file is removed at the end."""
    common = ["--model", str(tiny_dir), "--data", str(corpus), "--max-tokens", "300", "--batch-size", "2", "--quiet"]
    if command == "score":
        args = ["score", *common, "--seq-len", "64", "--stride", "48", "--ablation-rows", "4"]
    else:
        args = ["curve", *common, "--scores", str(run_dir / "scores.parquet"), "--methods", "wo_fro,abl_mean",
                "--fractions", "0,0.25,0.5", "--seeds", "2"]
        args += ["--compensate", "mean", "--score-data", str(corpus)] if command == "curve-compensated" else []
    whole, part = tmp_path / "whole.csv", tmp_path / "part.csv"
    progress = tmp_path / "part.csv.progress.jsonl"

    with monkeypatch.context() as mp:
        calls, computed = _count_work(mp)
        assert main(args + ["--out", str(whole)]) == 0
    units = list(computed)
    assert len(set(units)) == len(units) and calls == _expected_calls(units)
    families = {u.split("/")[0] for u in units}
    expected = {"score": {"weights", "act", "grad", "base", "abl_zero", "abl_mean"},
                "curve": {"curve"},
                "curve-compensated": {"act", "curve"}}  # the means on --score-data are units too: never recomputed
    assert families == expected[command]

    k = len(units) // 2 + 1  # score: inside the ablation units
    with monkeypatch.context() as mp:
        _interrupt_after(mp, k)
        assert main(args + ["--out", str(part)]) == 130
    recorded = _unit_keys(progress)
    assert recorded == units[:k] and not part.exists()

    with monkeypatch.context() as mp:
        calls, computed = _count_work(mp)
        assert main(args + ["--out", str(part)]) == 0
    assert computed == units[k:]
    assert calls == _expected_calls(units[k:])
    assert part.read_bytes() == whole.read_bytes()
    assert not progress.exists()


@pytest.fixture(scope="module")
def rebuilt(run_dir, tmp_path_factory):
    """``headprune report`` on the run's saved tables (its anatomy and patching files beside them)."""
    again = tmp_path_factory.mktemp("rebuilt") / "again"
    assert main(["report", "--scores", str(run_dir / "scores.parquet"), "--curves", str(run_dir / "curves.parquet"),
                 "--out", str(again)]) == 0
    return again


def test_report_rebuilds_from_tables(rebuilt):
    assert (rebuilt / "report.html").is_file()


def test_prune_native_and_hf_exports(run_dir, tiny_dir, corpus, tmp_path, capsys):
    scores = str(run_dir / "scores.parquet")
    args = ["prune", "--model", str(tiny_dir), "--scores", scores, "--method", "abl_zero", "--fraction", "0.5",
            "--data", str(corpus), "--max-tokens", "300", "--quiet"]
    assert main(args + ["--out", str(tmp_path / "native")]) == 0
    out = capsys.readouterr().out
    assert "heads removed (6)" in out and "perplexity on" in out
    # the 6 lowest abl_zero heads, as a hand sort of the table gives them
    table = read_scores(scores).sort_values(["abl_zero", "layer", "head"])
    removed = list(zip(table.layer[:6], table["head"][:6]))
    base = load_model(tiny_dir)
    native = load_model(tmp_path / "native")
    tokens = torch.randint(0, 50257, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        masked = base(tokens, gates=mask_gates(base, removed))
        assert (native(tokens) - masked).abs().max() <= 1e-4
        assert sorted(set(base.head_ids) - set(native.head_ids)) == sorted(removed)
    assert main(args + ["--out", str(tmp_path / "hf"), "--format", "hf"]) == 0
    with torch.no_grad():
        hf = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
        assert (hf(tokens).logits - masked).abs().max() <= 1e-4


def test_curve_command(run_dir, tiny_dir, corpus, tmp_path):
    out = tmp_path / "curves.csv"
    args = ["curve", "--model", str(tiny_dir), "--data", str(corpus), "--scores", str(run_dir / "scores.parquet"),
            "--methods", "wo_fro,taylor", "--fractions", "0,0.5", "--seeds", "2", "--max-tokens", "300", "--quiet",
            "--out", str(out)]
    assert main(args) == 0
    curves = pd.read_csv(out)
    assert list(curves.columns) == [*CURVE_COLUMNS, FILL_COLUMN, SCORES_DIGEST]
    assert curves.method.tolist() == ["wo_fro", "wo_fro", "taylor", "taylor", "random", "random"]
    assert not out.with_name("curves.csv.progress.jsonl").exists()
    assert main(args) == 0  # deterministic: the same seed gives bit-identical curves
    pd.testing.assert_frame_equal(curves, pd.read_csv(out), check_exact=True)


def test_run_reports_head_anatomy(run_dir, rebuilt, tiny_dir):
    """run adds the head-anatomy section: its tables equal the anatomy API on the same probe and windows, its
    pictures are on the page, and ``headprune report`` rebuilds it from the saved files."""
    from headprune.anatomy import copying_scores, detect_heads, repeated_random_tokens
    from headprune.anatomy.for_report import PROBE_COUNT, PROBE_LENGTH

    model = load_model(tiny_dir)
    heads = pd.read_csv(run_dir / "anatomy.csv")
    assert len(heads) == 12 and heads["head_id"].tolist() == read_scores(run_dir / "scores.csv")["head_id"].tolist()
    probe = repeated_random_tokens(model.cfg.vocab_size, min(PROBE_LENGTH, 32), PROBE_COUNT, 0)  # n_positions 64
    pd.testing.assert_series_equal(heads["induction"], detect_heads(model, probe)["induction"], rtol=1e-5)
    pd.testing.assert_series_equal(heads["copying"], copying_scores(model)["copying"], rtol=1e-6)
    html = (run_dir / "report.html").read_text()
    summary = (run_dir / "summary.md").read_text()
    assert "Head anatomy" in html and "Head anatomy" in summary
    for name in ("anatomy_roles.png", "anatomy_composition.png", "anatomy_attention.png"):
        assert (run_dir / name).is_file() and name in html
    assert "seconds_anatomy" in json.loads((run_dir / "settings.json").read_text())
    assert (rebuilt / "anatomy.csv").read_bytes() == (run_dir / "anatomy.csv").read_bytes()
    assert "Head anatomy" in (rebuilt / "summary.md").read_text()


def test_run_methods_restricts_scores_and_curves(run_dir, tiny_dir, corpus, tmp_path, capsys):
    """``run --methods`` scores only those methods; the ones that rank heads get curves (entropy describes only);
    their values equal the full run's (the same data, settings and seed)."""
    out = tmp_path / "r"
    assert main(["run", "--model", str(tiny_dir), "--data", str(corpus), "--score-data", str(corpus), "--out", str(out),
                 "--max-tokens", "400", "--fractions", "0,0.25,0.5,0.75", "--seeds", "2", "--quiet",
                 "--methods", "entropy,wo_fro,grad"]) == 0
    scores, full = read_scores(out / "scores.csv"), read_scores(run_dir / "scores.csv")
    assert [c for c in scores.columns[4:] if "_ci_" not in c] == ["wo_fro", "entropy", "grad"]
    pd.testing.assert_frame_equal(scores, full[list(scores.columns)])
    curves = pd.read_csv(out / "curves.csv")
    assert set(curves.method) == {"wo_fro", "wo_fro@layer", "grad", "random"}
    assert json.loads((out / "settings.json").read_text())["methods"] == ["wo_fro", "entropy", "grad"]
    capsys.readouterr()
    assert main(["run", "--model", str(tiny_dir), "--out", str(tmp_path / "e"), "--methods", "entropy"]) == 2
    assert "--methods entropy rank no heads" in capsys.readouterr().err and not (tmp_path / "e").exists()
    assert main(["run", "--model", str(tiny_dir), "--out", str(tmp_path / "e"), "--methods", "bogus"]) == 2
    assert "unknown scoring method(s) bogus" in capsys.readouterr().err and not (tmp_path / "e").exists()


def test_run_reports_patching_of_the_brackets_task(run_dir, rebuilt, tiny_dir):
    """The run's patching section: its table is the library's patching of the same built-in pairs, its sentences
    are recomputed here from that table, and ``headprune report`` rebuilds the same section from the files."""
    from headprune.patching import atp_star_z, patch_z, task_pairs
    from headprune.report.patching_section import SECTION_TITLE, patching_findings, read_patching_files, top_patched

    model = load_model(tiny_dir)
    pairs = task_pairs("brackets", model, n_pairs=32, seed=0)
    table = pd.read_csv(run_dir / "patch.csv")
    exact, star = patch_z(model, pairs), atp_star_z(model, pairs)
    np.testing.assert_allclose(table["patch_z"], exact.effect.numpy(), rtol=0, atol=1e-9)
    np.testing.assert_allclose(table["atp_star_z"], star.effect.numpy(), rtol=0, atol=1e-9)
    saved = read_patching_files(run_dir)
    scores = read_scores(run_dir / "scores.parquet")
    sentences = patching_findings(saved, top_patched(saved, scores, None))
    lead = table.assign(size=table["patch_z"].abs()).sort_values(["size", "layer", "head"],
                                                                 ascending=[False, True, True]).head(3)
    assert ", ".join(f"{h} ({v:+.2f})" for h, v in zip(lead["head_id"], lead["patch_z"])) in sentences[1]
    gap = float((exact.m_clean - exact.m_corrupt).mean())
    assert f"(gap {gap:.2f})" in sentences[0]
    missed = pd.read_csv(run_dir / "patch_missed.csv")
    bound = missed[missed.method == "atp_star_z"]["upper"].max()
    assert f"more than {bound:.3f}" in sentences[-1]
    html = (run_dir / "report.html").read_text()
    assert SECTION_TITLE in html and "patching.png" in {p.name for p in run_dir.iterdir()}
    again = (rebuilt / "summary.md").read_text()
    original = (run_dir / "summary.md").read_text()
    section = lambda text: text[text.index(SECTION_TITLE):].split("\n## ")[0]
    assert section(original) == section(again) and len(section(again)) > 500
