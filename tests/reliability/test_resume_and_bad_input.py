"""Reliability: killed sweeps resume to identical results, SIGINT stops cleanly, bad input is one line + exit 2."""

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from headprune.cli.main import main

from helpers import TINY, save_hf_gpt2


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    import pydoc_data.topics

    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    path.write_text(" ".join(list(pydoc_data.topics.topics.values())[:60])[:30000])
    return path


def _env(tmp_path, **extra):
    return {**os.environ, "HEADPRUNE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", **extra}


def _score_cmd(model, corpus, out, max_tokens=1000):
    return [sys.executable, "-m", "headprune", "score", "--model", str(model), "--data", str(corpus), "--out", str(out),
            "--max-tokens", str(max_tokens), "--seq-len", "64", "--stride", "48", "--batch-size", "2",
            "--ablation-rows", "4", "--device", "cpu", "--quiet"]


def _curve_cmd(model, corpus, out, scores):
    return [sys.executable, "-m", "headprune", "curve", "--model", str(model), "--data", str(corpus), "--out", str(out),
            "--scores", str(scores), "--methods", "wo_fro,abl_zero", "--fractions", "0,0.25,0.5", "--seeds", "2",
            "--max-tokens", "300", "--batch-size", "2", "--device", "cpu", "--quiet"]


def _run_cmd(model, corpus, out):
    return [sys.executable, "-m", "headprune", "run", "--model", str(model), "--data", str(corpus), "--score-data",
            str(corpus), "--out", str(out), "--max-tokens", "200", "--batch-size", "2", "--fractions", "0,0.5",
            "--seeds", "2", "--device", "cpu", "--quiet"]


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _units(progress: Path) -> list[str]:
    return [json.loads(line)["unit"] for line in progress.read_text().splitlines()[1:]]


def _kill_and_resume(cmd, progress: Path, kills: list[int], tmp_path) -> list[str]:
    """Run ``cmd`` once per N in ``kills`` with HEADPRUNE_TEST_KILL_AFTER_UNITS=N (each run must die of SIGKILL
    right after recording its N-th new unit), then once to the end. Returns the units recorded before the end."""
    done: list[str] = []
    for n in kills:
        proc = subprocess.run(cmd, check=False, env=_env(tmp_path, HEADPRUNE_TEST_KILL_AFTER_UNITS=str(n)),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
        units = _units(progress)
        # exactly N more units, none recorded twice, the earlier ones untouched
        assert units[: len(done)] == done and len(units) == len(done) + n and len(set(units)) == len(units)
        done = units
    proc = subprocess.run(cmd, check=False, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return done


@pytest.mark.slow
def test_sigkill_after_fixed_units_then_resume_gives_identical_scores(tiny_dir, corpus, tmp_path):
    whole, out = tmp_path / "whole.csv", tmp_path / "killed.csv"
    subprocess.run(_score_cmd(tiny_dir, corpus, whole, 400), env=_env(tmp_path), check=True, capture_output=True,
                   timeout=300)
    progress = tmp_path / "killed.csv.progress.jsonl"
    done = _kill_and_resume(_score_cmd(tiny_dir, corpus, out, 400), progress, [3, 18], tmp_path)
    # 8 windows, 4 batches: the weights unit, 4 activation and 4 gradient units come first, so the first kill hits
    # the activations and the second the ablation
    assert [u.split("/")[0] for u in done[:9]] == ["weights"] + ["act"] * 4 + ["grad"] * 4
    assert {u.split("/")[0] for u in done[9:]} == {"base", "abl_zero", "abl_mean"}
    assert out.read_bytes() == whole.read_bytes()  # no lost, no duplicated, no changed value
    assert not progress.exists()


@pytest.mark.slow
def test_sigkill_curve_after_fixed_units_then_resume_gives_identical_curves(tiny_dir, corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("HEADPRUNE_CACHE", str(tmp_path / "cache"))
    scores = tmp_path / "scores.csv"
    assert main(["score", "--model", str(tiny_dir), "--data", str(corpus), "--methods", "wo_fro,abl_zero",
                 "--max-tokens", "200", "--out", str(scores), "--device", "cpu", "--quiet"]) == 0
    whole, out = tmp_path / "whole.csv", tmp_path / "killed.csv"
    subprocess.run(_curve_cmd(tiny_dir, corpus, whole, scores), env=_env(tmp_path), check=True, capture_output=True,
                   timeout=300)
    progress = tmp_path / "killed.csv.progress.jsonl"
    done = _kill_and_resume(_curve_cmd(tiny_dir, corpus, out, scores), progress, [1, 7], tmp_path)
    assert done[0] == "curve/w/baseline"  # 1 baseline + 2 methods x 3 fractions + 3 fractions x 2 seeds = 13 units
    assert out.read_bytes() == whole.read_bytes()
    assert not progress.exists()


@pytest.mark.slow
def test_sigkill_run_after_fixed_units_then_resume_gives_identical_tables(tiny_dir, corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("HEADPRUNE_TEST_KEEP_PROGRESS", "1")  # a finished run removes it: kept to compare the units
    whole, out = tmp_path / "whole", tmp_path / "killed"
    subprocess.run(_run_cmd(tiny_dir, corpus, whole), env=_env(tmp_path), check=True, capture_output=True, timeout=300)
    progress = out / ".progress.jsonl"
    order = _units(whole / ".progress.jsonl")
    layers = next(i for i, u in enumerate(order) if u.startswith("abl_layer/"))
    curves = next(i for i, u in enumerate(order) if u.startswith("curve/"))
    assert layers < curves
    # the first kill lands in the activations, the second in the layers removed whole, the third in the curves
    done = _kill_and_resume(_run_cmd(tiny_dir, corpus, out), progress, [2, layers - 1, curves - layers + 1],
                            tmp_path)
    assert [u.split("/")[0][:3] for u in (done[1], done[8], done[layers], done[curves + 1])] == [
        "act", "abl", "abl", "cur"]
    assert done[layers].startswith("abl_layer/")
    for name in ["scores.csv", "curves.csv", "baseline.json", "predictiveness.csv"]:
        assert (out / name).read_bytes() == (whole / name).read_bytes(), name
    # the same units, each once, as the uninterrupted run's
    assert sorted(_units(progress)) == sorted(_units(whole / ".progress.jsonl"))


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_gives_identical_scores(tiny_dir, corpus, tmp_path):
    """Kills after a seeded random number of units (the kill-after-N-units hook: deterministic, no race with the
    machine's load), the progress file left with a torn last line as a kill in mid-write leaves it; the resumed
    table is exact."""
    env = _env(tmp_path)
    whole = tmp_path / "whole.csv"
    subprocess.run(_score_cmd(tiny_dir, corpus, whole, 400), env=env, check=True, capture_output=True, timeout=300)
    out = tmp_path / "killed.csv"
    progress = tmp_path / "killed.csv.progress.jsonl"
    rng = random.Random(7)
    for _ in range(3):
        seen = _lines(progress)
        proc = subprocess.run(_score_cmd(tiny_dir, corpus, out, 400),
                              env={**env, "HEADPRUNE_TEST_KILL_AFTER_UNITS": str(rng.randint(1, 6))},
                              check=False, capture_output=True, timeout=300)
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
        assert _lines(progress) > seen
        with progress.open("a") as f:
            f.write('{"unit": "act/torn", "val')  # torn in mid-write: that unit is redone
    finished = subprocess.run(_score_cmd(tiny_dir, corpus, out, 400), check=False, env=env, capture_output=True,
                              text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    assert out.read_bytes() == whole.read_bytes()  # no lost, no duplicated, no changed value
    assert not progress.exists()


@pytest.mark.slow
def test_sigint_stops_cleanly_and_says_how_to_resume(tiny_dir, corpus, tmp_path):
    """SIGINT right after the third unit is recorded (the kill-after-N-units hook sending SIGINT: deterministic
    whatever the machine's load): exit 130, one line saying how to resume, no output, the progress kept."""
    out = tmp_path / "s.csv"
    progress = tmp_path / "s.csv.progress.jsonl"
    env = _env(tmp_path, HEADPRUNE_TEST_KILL_AFTER_UNITS="3", HEADPRUNE_TEST_KILL_SIGNAL="INT")
    # a shell without job control starts background jobs with SIGINT ignored, and Python keeps an ignored SIGINT:
    # the child gets the default disposition back, as a terminal's foreground process has it
    proc = subprocess.run(_score_cmd(tiny_dir, corpus, out), env=env, check=False, capture_output=True, text=True,
                          timeout=300, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "run the same command again to resume" in proc.stderr
    assert not out.exists() and _lines(progress) == 4  # the header and the three units


def test_other_settings_refuse_to_resume_unless_overwrite(tiny_dir, corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HEADPRUNE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "s.csv"
    progress = out.with_name("s.csv.progress.jsonl")
    progress.write_text('{"fingerprint": "0000", "settings": {}}\n{"unit": "x", "value": 1}\n')
    args = ["score", "--model", str(tiny_dir), "--data", str(corpus), "--out", str(out), "--methods", "wo_fro",
            "--max-tokens", "200", "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "different run" in err and "--overwrite" in err and err.count("\n") == 1 and not out.exists()
    assert main(args + ["--overwrite"]) == 0 and out.exists()


@pytest.fixture(scope="module")
def small_vocab_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("small-vocab")
    save_hf_gpt2(folder, **{**TINY, "vocab_size": 1000})
    return folder


@pytest.fixture(scope="module")
def variant_dirs(tiny_dir, tmp_path_factory):
    """Copies of the tiny model that differ from it in one MLP weight, and in the final LayerNorm's bias."""
    from safetensors.torch import load_file, save_file

    dirs = {}
    for name, key in (("mlp", "h.1.mlp.c_fc.weight"), ("ln", "ln_f.bias")):
        folder = tmp_path_factory.mktemp(f"variant-{name}")
        for f in tiny_dir.iterdir():
            shutil.copy(f, folder / f.name)
        state = load_file(folder / "model.safetensors")
        state[f"transformer.{key}"].view(-1)[0] += 0.5
        save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
        dirs[name] = folder
    return dirs


def _curves(fingerprint: str, nll0: float) -> pd.DataFrame:
    rows = [{"method": m, "compensation": "none", "fraction": f, "heads_pruned": int(12 * f), "params": 1000,
             "nll": nll0 + f, "ppl": math.exp(nll0 + f), "delta_nll": f, "delta_ppl": 0.0, "nll_std": 0.0,
             "ppl_std": 0.0, "n_seeds": 1, "model_fingerprint": fingerprint}
            for m in ("wo_fro", "random") for f in (0.0, 0.5)]
    return pd.DataFrame(rows)


def _forge_cache(tiny, text_file: Path, cache: Path, ids: list[int]) -> None:
    """A token-cache entry for ``text_file`` with the right checksum but ``ids`` outside the vocabulary."""
    import torch
    from safetensors.torch import save_file

    from headprune.data.sources import load_texts
    from headprune.data.tokens import _cache_key, _ids_digest
    from headprune.io.read.tokenizer import load_tokenizer

    key = _cache_key(load_texts(str(text_file)), load_tokenizer(tiny))
    cache.mkdir(parents=True, exist_ok=True)
    tensor = torch.tensor(ids, dtype=torch.long)
    save_file({"ids": tensor}, cache / f"{key}.safetensors", metadata={"sha256": _ids_digest(tensor)})


def _prepare(tmp: Path, tiny: Path, corpus: Path) -> None:
    """The files the bad cases read, written before the 'nothing written' snapshot."""
    from headprune.io.work.files import read_scores

    (tmp / "empty.txt").write_text("")
    (tmp / "afile").write_text("not a folder")
    (tmp / "one.txt").write_text("hi")
    (tmp / "number.jsonl").write_text('{"text": "hello world"}\n{"text": 5}\n')
    (tmp / "null.jsonl").write_text('{"text": "hello world"}\n{"text": null}\n')
    os.mkfifo(tmp / "fifo.txt")
    (tmp / "outdir.csv").mkdir()
    (tmp / "p42.csv.progress.jsonl").write_text("42\n")
    (tmp / "plist.csv.progress.jsonl").write_text("[]\n")
    (tmp / "pdir.csv.progress.jsonl").mkdir()
    fingerprint = read_scores(tmp / "scores.csv")["model_fingerprint"].iloc[0]
    _curves("f" * 16, 3.0).to_csv(tmp / "curves_other_model.csv", index=False)
    (tmp / "runA").mkdir()
    shutil.copy(tmp / "scores.csv", tmp / "runA" / "scores.csv")
    (tmp / "runA" / "baseline.json").write_text(json.dumps({"tokens": 100, "nll": 3.0, "ppl": math.exp(3.0)}))
    _curves(fingerprint, 3.5).to_csv(tmp / "curves_other_data.csv", index=False)
    for name, ids in (("big", [1, 2, 60000]), ("negative", [1, -3, 2])):
        text = tmp / f"forged_{name}.txt"
        text.write_text(corpus.read_text()[:2000] + name)
        _forge_cache(tiny, text, tmp / "cache", ids)


def _bad_cases(tiny, small_vocab, corpus, tmp, variants=None):
    scores = tmp / "scores.csv"
    model = ["--model", str(tiny)]
    prune = ["prune", *model, "--out", str(tmp / "out")]
    data = ["--data", str(corpus), "--max-tokens", "200"]
    return {
        "missing model": (["eval", "--model", str(tmp / "nope"), *data], "does not exist"),
        "tokenizer larger than vocab": (["eval", "--model", str(small_vocab), *data], "embeds only 1000"),
        "unknown head L99H0": ([*prune, "--heads", "L99H0"], "L99H0"),
        "negative head L0H-1": ([*prune, "--heads", "L0H-1"], "L0H-1"),
        "garbage head": ([*prune, "--heads", "layer0,head1"], "bad head id"),
        "more heads than exist": ([*prune, "--scores", str(scores), "--method", "wo_fro", "--count", "13"], "13"),
        "fraction above 1": ([*prune, "--scores", str(scores), "--method", "wo_fro", "--fraction", "1.5"], "[0, 1]"),
        "fraction below 0": (["curve", *model, "--scores", str(scores), "--fractions", "0,-0.1", "--out",
                              str(tmp / "c.csv"), *data], "[0, 1]"),
        "scores lack method": ([*prune, "--scores", str(scores), "--method", "taylor", "--fraction", "0.5"], "taylor"),
        "scores of another model": (["prune", "--model", str(small_vocab), "--out", str(tmp / "out"), "--scores",
                                     str(scores), "--method", "wo_fro", "--fraction", "0.5"], "another model"),
        "entropy is no importance": ([*prune, "--scores", str(scores), "--method", "entropy", "--fraction", "0.5"],
                                     "entropy"),
        "empty corpus": (["score", *model, "--data", str(tmp / "empty.txt"), "--out", str(tmp / "s.csv")], "empty"),
        "seq-len > n_positions": (["score", *model, *data, "--seq-len", "65", "--out", str(tmp / "s.csv")],
                                  "n_positions"),
        "stride <= 0": (["curve", *model, "--scores", str(scores), *data, "--stride", "0", "--out", str(tmp / "c.csv")],
                        "--stride 0"),
        "unwritable output folder": (["score", *model, *data, "--out", str(tmp / "afile" / "s.csv")], "is a file"),
        "bad output suffix": (["score", *model, *data, "--out", str(tmp / "s.xlsx")], ".csv or .parquet"),
        "fp16 on the CPU": (["run", *model, "--device", "cpu", "--dtype", "fp16", "--out", str(tmp / "r")], "fp16"),
        "unknown method": (["score", *model, *data, "--methods", "magic", "--out", str(tmp / "s.csv")], "magic"),
        # 1: every tensor is fingerprinted, not only attention
        "scores of a model differing in one MLP weight": (["prune", "--model", str(variants["mlp"]), "--out",
                                                           str(tmp / "out"), "--scores", str(scores), "--method",
                                                           "wo_fro", "--fraction", "0.5"], "another model"),
        "scores of a model differing in ln_f": (["curve", "--model", str(variants["ln"]), "--scores", str(scores),
                                                 *data, "--out", str(tmp / "c.csv")], "another model"),
        # 2: report refuses tables that do not belong together
        "report: curves of another model": (["report", "--scores", str(scores), "--curves",
                                             str(tmp / "curves_other_model.csv"), "--out", str(tmp / "rep")],
                                            "different models"),
        "report: curves on other data": (["report", "--scores", str(tmp / "runA" / "scores.csv"), "--curves",
                                          str(tmp / "curves_other_data.csv"), "--out", str(tmp / "rep")],
                                         "differs from the baseline"),
        # 3: cached ids are checked (checksum: see test_reliability_classes) and validated against the vocabulary
        "token cache: id beyond the vocabulary": (["eval", *model, "--data", str(tmp / "forged_big.txt"),
                                                   "--max-tokens", "0"],
                                                  "outside the model's vocabulary"),
        "token cache: negative id": (["eval", *model, "--data", str(tmp / "forged_negative.txt"),
                                                   "--max-tokens", "0"],
                                     "outside the model's vocabulary"),
        # 4: every numeric option, every command
        "run --max-tokens -5": (["run", *model, "--max-tokens", "-5", "--out", str(tmp / "r")], "--max-tokens -5"),
        "score --ablation-rows 0": (["score", *model, *data, "--ablation-rows", "0", "--out", str(tmp / "s.csv")],
                                    "--ablation-rows 0"),
        "prune --count -1": ([*prune, "--scores", str(scores), "--method", "wo_fro", "--count", "-1"], "--count -1"),
        "curve --seed -1": (["curve", *model, "--scores", str(scores), *data, "--seed", "-1", "--out",
                             str(tmp / "c.csv")], "--seed -1"),
        "prune --iterative 0": ([*prune, "--scores", str(scores), "--method", "wo_fro", "--count", "1",
                                 "--iterative", "0"], "--iterative 0"),
        # 6: everything is validated before the first byte is written
        "prune: missing --data": ([*prune, "--heads", "L0H1", "--data", str(tmp / "nope.txt")], "does not exist"),
        "prune: --data too short": ([*prune, "--heads", "L0H1", "--data", str(tmp / "one.txt")], "at least 2"),
        "score: one-token corpus": (["score", *model, "--data", str(tmp / "one.txt"), "--out", str(tmp / "s.csv")],
                                    "at least 2"),
        "curve: one-token corpus": (["curve", *model, "--scores", str(scores), "--data", str(tmp / "one.txt"),
                                     "--out", str(tmp / "c.csv")], "at least 2"),
        "run: one-token corpus": (["run", *model, "--data", str(tmp / "one.txt"), "--out", str(tmp / "r")],
                                  "at least 2"),
        # 7: the output path is checked up front
        "score --out is a folder": (["score", *model, *data, "--out", str(tmp / "outdir.csv")], "is a folder"),
        "curve --out is a folder": (["curve", *model, "--scores", str(scores), *data, "--out", str(tmp / "outdir.csv")],
                                    "is a folder"),
        # 11: devices torch knows but headprune does not run on, impossible sizes
        "device meta": (["info", *model, "--device", "meta"], "not supported"),
        "device mps": (["eval", *model, *data, "--device", "mps"], "not supported"),
        "device xpu": (["info", *model, "--device", "xpu"], "not supported"),
        "info --batch-size 100000000": (["info", *model, "--batch-size", "100000000"],
                                        "--batch-size 100000000 is too large"),
        "score --batch-size 10**9": (["score", *model, *data, "--batch-size", "1000000000", "--out",
                                      str(tmp / "s.csv")], "--batch-size 1000000000 is too large"),
        # 12: progress files of the wrong shape, or not a file
        "progress header 42": (["score", *model, *data, "--out", str(tmp / "p42.csv")],
                               "not a headprune progress header"),
        "progress header []": (["score", *model, *data, "--out", str(tmp / "plist.csv")],
                               "not a headprune progress header"),
        "progress path a folder": (["score", *model, *data, "--out", str(tmp / "pdir.csv")], "not a regular file"),
        # 13: over-long names
        "score --out name too long": (["score", *model, *data, "--out", str(tmp / ("x" * 300 + ".csv"))],
                                      "longer than 255"),
        "run --out name too long": (["run", *model, "--out", str(tmp / ("r" * 300))], "longer than 255"),
        # 15: non-regular files as data
        "--data a FIFO": (["eval", *model, "--data", str(tmp / "fifo.txt")], "not a regular file"),
        "--data a device": (["eval", *model, "--data", "/dev/null"], "not a regular file"),
        # 5: text rows that are not strings
        "jsonl text a number": (["eval", *model, "--data", str(tmp / "number.jsonl")], "not strings"),
        "jsonl text null": (["eval", *model, "--data", str(tmp / "null.jsonl")], "not strings"),
    }


CASES = list(_bad_cases("m", "v", "c", Path("t"), {"mlp": "m", "ln": "m"}))


@pytest.mark.parametrize("case", CASES)
def test_bad_input_one_line_exit_2_nothing_written(case, tiny_dir, small_vocab_dir, variant_dirs, corpus, tmp_path,
                                                   capsys, monkeypatch):
    monkeypatch.setenv("HEADPRUNE_CACHE", str(tmp_path / "cache"))
    assert main(["score", "--model", str(tiny_dir), "--methods", "wo_fro", "--out", str(tmp_path / "scores.csv")]) == 0
    _prepare(tmp_path, tiny_dir, corpus)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "cache" not in p.parts)
    capsys.readouterr()
    argv, words = _bad_cases(tiny_dir, small_vocab_dir, corpus, tmp_path, variant_dirs)[case]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("headprune: error:") and err.count("\n") == 1 and words in err, err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "cache" not in p.parts) == before
