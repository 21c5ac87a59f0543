"""Reliability classes: the right behaviour behind the bad-input cases of test_resume_and_bad_input.py.

Each test names the issue's class it covers. The one-line/exit-2/nothing-written cases are in
``test_reliability._bad_cases`` and ``test_info_cli.test_bad_model_one_line_exit_2``.
"""

import json
import os
import socket
import stat
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch

from headprune.cli.main import main
from headprune.data.sources import load_texts
from headprune.data.tokens import tokenize_corpus
from headprune.errors import HeadpruneError
from headprune.io.read.fingerprint import model_fingerprint
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import load_tokenizer
from headprune.io.work.files import read_table, write_table
from headprune.io.work.progress import Progress


def _one_line_error(capsys, words: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith("headprune: error:") and err.count("\n") == 1 and words in err, err
    return err


# ---------------------------------------------------------------- 1: every tensor is fingerprinted


@pytest.mark.parametrize("name", ["h.1.mlp.c_fc.weight", "h.2.mlp.c_proj.bias", "ln_f.weight", "h.0.ln_1.bias",
                                  "wte.weight", "wpe.weight"])
def test_a_change_in_any_tensor_changes_the_fingerprint(tiny_dir, name):
    model = load_model(tiny_dir, device="cpu")
    before = model_fingerprint(model)
    model.state_dict()[name].view(-1)[-1] += 0.25
    assert model_fingerprint(model) != before


def test_fingerprint_is_the_same_for_fp32_and_bf16_loads_and_fast(tiny_dir):
    assert model_fingerprint(load_model(tiny_dir, device="cpu")) == model_fingerprint(
        load_model(tiny_dir, device="cpu", dtype="bf16"))
    model = load_model(device="cpu")  # the shipped 6.9M-parameter model
    t0 = time.perf_counter()
    model_fingerprint(model)
    assert time.perf_counter() - t0 < 5.0  # ~0.1 s on an idle core; generous for a loaded CI machine


def test_curves_record_the_model_fingerprint(tiny_dir, corpus, tmp_path):
    scores, curves = tmp_path / "s.csv", tmp_path / "c.csv"
    common = ["--model", str(tiny_dir), "--data", str(corpus), "--max-tokens", "200", "--device", "cpu", "--quiet"]
    assert main(["score", *common, "--methods", "wo_fro", "--out", str(scores)]) == 0
    assert main(["curve", *common, "--scores", str(scores), "--fractions", "0,0.5", "--seeds", "1",
                 "--out", str(curves)]) == 0
    assert set(read_table(curves)["model_fingerprint"]) == set(read_table(scores)["model_fingerprint"])


# ---------------------------------------------------------------- 3: the token cache carries a checksum


def test_a_flipped_bit_in_the_token_cache_is_detected_and_retokenized(tiny_dir, corpus, tmp_path):
    texts, tok = load_texts(str(corpus)), load_tokenizer(tiny_dir)
    ids = tokenize_corpus(texts, tok, tmp_path)
    (file,) = tmp_path.glob("*.safetensors")
    data = bytearray(file.read_bytes())
    data[-3] ^= 0x01  # one bit of the last id
    file.write_bytes(bytes(data))
    assert torch.equal(tokenize_corpus(texts, tok, tmp_path), ids)
    assert torch.equal(tokenize_corpus(texts, tok, tmp_path), ids)  # and the entry was rewritten whole
    assert file.read_bytes() != bytes(data)


# ---------------------------------------------------------------- 6, 7: nothing lost, nothing left behind


def test_a_run_refused_before_any_work_does_not_block_the_corrected_rerun(tiny_dir, corpus, tmp_path, capsys):
    out = tmp_path / "s.csv"
    (tmp_path / "one.txt").write_text("hi")
    args = ["score", "--model", str(tiny_dir), "--methods", "wo_fro,out_norm", "--out", str(out), "--device", "cpu",
            "--quiet"]
    assert main([*args, "--data", str(tmp_path / "one.txt")]) == 2
    assert list(tmp_path.iterdir()) == [tmp_path / "one.txt"]
    assert main([*args, "--data", str(corpus), "--max-tokens", "200"]) == 0 and out.is_file()


def test_progress_survives_an_output_that_cannot_be_written(tiny_dir, corpus, tmp_path, capsys, monkeypatch):
    import errno

    from headprune.cli import sweeps
    out = tmp_path / "s.csv"
    progress = tmp_path / "s.csv.progress.jsonl"
    args = ["score", "--model", str(tiny_dir), "--data", str(corpus), "--max-tokens", "200", "--methods",
            "wo_fro,out_norm", "--out", str(out), "--device", "cpu", "--quiet"]

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(out))

    monkeypatch.setattr(sweeps, "write_table", full)  # where finish_sweep looks it up
    assert main(args) == 2
    _one_line_error(capsys, "No space left on device")
    assert progress.is_file() and not out.exists()  # the work is kept
    monkeypatch.undo()
    monkeypatch.setenv("HEADPRUNE_TEST_KILL_AFTER_UNITS", "1")  # a recomputed unit would kill this process
    assert main(args) == 0 and out.is_file() and not progress.exists()


# ---------------------------------------------------------------- 8: stale temporaries


def test_stale_temporaries_of_the_same_output_are_removed(tiny_dir, corpus, tmp_path):
    dead = 2**22 + 12345  # above pid_max on every default Linux: no such process
    stale_dir = tmp_path / f".out.{dead}.abcd1234.tmp"
    stale_file = tmp_path / f".s.csv.{dead}.abcd1234.tmp"
    live = tmp_path / f".s.csv.{os.getppid()}.abcd1234.tmp"  # a writer that still runs: left alone
    stale_dir.mkdir()
    (stale_dir / "model.safetensors").write_bytes(b"half")
    stale_file.write_text("half")
    live.write_text("busy")
    assert main(["prune", "--model", str(tiny_dir), "--heads", "L0H1", "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert main(["score", "--model", str(tiny_dir), "--methods", "wo_fro", "--out", str(tmp_path / "s.csv")]) == 0
    assert not stale_dir.exists() and not stale_file.exists() and live.exists()


def test_a_previous_export_left_by_a_kill_between_the_swap_renames_is_restored_or_removed(tiny_dir, tmp_path):
    """export swaps folders with two renames (old export aside, new one in); a SIGKILL between them leaves the
    target missing and the old export under ``.out.PID.RANDOM.old``; after them, a leftover .old."""
    import shutil

    dead = 2**22 + 12345
    out = tmp_path / "out"
    prune = ["prune", "--model", str(tiny_dir), "--out", str(out), "--quiet"]
    assert main([*prune, "--heads", "L0H1"]) == 0
    first = json.loads((out / "headprune_export.json").read_text())
    killed_between = tmp_path / f".out.{dead}.abcd1234.old"
    out.rename(killed_between)  # target missing: the previous export must come back, not be lost
    from headprune.io.write.export_folder import clear_stale_old

    clear_stale_old(out)
    assert not killed_between.exists() and json.loads((out / "headprune_export.json").read_text()) == first
    killed_after = tmp_path / f".out.{dead}.ef567890.old"
    shutil.copytree(out, killed_after)  # target present: a leftover to delete
    live = tmp_path / f".out.{os.getppid()}.00000000.old"  # a writer that still runs: left alone
    live.mkdir()
    assert main([*prune, "--heads", "L0H2"]) == 0
    assert json.loads((out / "headprune_export.json").read_text())["heads"] == "L0H2"
    assert not killed_after.exists() and live.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")) == [live.name]


# ---------------------------------------------------------------- 9: byte-reproducible parquet


def test_identical_tables_give_identical_parquet_files_whatever_their_attrs(tmp_path):
    df = pd.DataFrame({"a": [1.0, 2.0]})
    for name in ("a", "b"):
        df.attrs = {"seconds": time.perf_counter(), "baseline": {"nll": 1.0}}
        write_table(df, tmp_path / f"{name}.parquet")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()


def test_identical_score_runs_give_identical_parquet(tiny_dir, corpus, tmp_path):
    for name in ("a", "b"):
        assert main(["score", "--model", str(tiny_dir), "--data", str(corpus), "--max-tokens", "200", "--methods",
                     "wo_fro,out_norm", "--out", str(tmp_path / f"{name}.parquet"), "--device", "cpu", "--quiet"]) == 0
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()


# ---------------------------------------------------------------- 12: progress records of the wrong shape


@pytest.mark.parametrize("line", ['{"fingerprint": "x", "settings": {}}', "42", "{}", '{"unit": 1, "value": 2}'])
def test_progress_records_of_the_wrong_shape_are_damage(tmp_path, line):
    path = tmp_path / "p.jsonl"
    Progress(path, {"x": 1}).get_or_compute("a", lambda: 1)
    path.write_text(path.read_text() + line + "\n")
    with pytest.raises(HeadpruneError, match="line 3 is damaged"):
        Progress(path, {"x": 1})


@pytest.mark.parametrize("header", ["42", "[]", '"text"', '{"settings": {}}', '{"fingerprint": 7, "settings": {}}',
                                    '{"unit": "a", "value": 1}'])
def test_a_progress_header_of_the_wrong_shape_is_named_as_such(tmp_path, header):
    path = tmp_path / "p.jsonl"
    path.write_text(header + "\n")
    with pytest.raises(HeadpruneError, match="line 1 is not a headprune progress header") as err:
        Progress(path, {"x": 1})
    assert "different run" not in str(err.value) and "--overwrite" in str(err.value)
    Progress(path, {"x": 1}, overwrite=True).get_or_compute("a", lambda: 1)  # and --overwrite gets past it
    assert Progress(path, {"x": 1}).units == {"a": 1}


def test_a_progress_header_of_another_run_still_says_so(tmp_path):
    path = tmp_path / "p.jsonl"
    Progress(path, {"x": 1}).get_or_compute("a", lambda: 1)
    with pytest.raises(HeadpruneError, match="progress of a different run"):
        Progress(path, {"x": 2})


@pytest.mark.slow
def test_cli_names_a_damaged_progress_header(tiny_dir, corpus, tmp_path, capsys):
    (tmp_path / "s.csv.progress.jsonl").write_text("[1, 2]\n")
    assert main(["score", "--model", str(tiny_dir), "--data", str(corpus), "--max-tokens", "200", "--methods",
                 "wo_fro", "--out", str(tmp_path / "s.csv"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a headprune progress header" in err


# ---------------------------------------------------------------- 13: full disks, full stdout


def test_a_report_folder_is_complete_or_absent(tmp_path, capsys, monkeypatch):
    import errno

    from headprune import report

    from report_tables import BASELINE, SETTINGS, make_curves, make_scores

    calls = []

    def full(target, data):
        calls.append(target)
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    monkeypatch.setattr(report, "write_bytes", full)  # the pictures come after the tables
    with pytest.raises(OSError):
        report.build_report(make_scores(), make_curves(), tmp_path / "rep", settings=SETTINGS, baseline=BASELINE)
    assert calls and not (tmp_path / "rep").exists() and list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("redirect", [">/dev/full", ">&-"])
def test_a_full_or_closed_stdout_is_one_line_and_exit_2(tiny_dir, tmp_path, redirect):
    if "full" in redirect and not (os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode)):
        pytest.skip("this machine has no /dev/full device (a redirect would create a plain file there)")
    err = tmp_path / "err"
    cmd = (f"{sys.executable} -m headprune info --model {tiny_dir} --seq-len 64 2>{err} {redirect}; "
           f"echo $? >{tmp_path / 'rc'}")
    subprocess.run(["bash", "-c", cmd], timeout=120, check=False)
    text, rc = err.read_text(), int((tmp_path / "rc").read_text())
    assert rc == 2 and text.startswith("headprune: error:") and text.count("\n") == 1, text


# ---------------------------------------------------------------- 14: stray distributed environments


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("env, words", [
    ({"WORLD_SIZE": "2"}, "incomplete torch.distributed"),
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1"}, "MASTER_PORT unset"),
    ({"WORLD_SIZE": "2", "RANK": "5", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, "impossible"),
    ({"WORLD_SIZE": "two"}, "must be an integer"),
    ({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "PORT"}, "could not join"),
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "PORT"}, "could not join"),
])
def test_a_stray_distributed_environment_fails_within_seconds(tiny_dir, capsys, monkeypatch, env, words):
    for key, value in env.items():
        monkeypatch.setenv(key, str(_free_port()) if value == "PORT" else value)
    monkeypatch.setenv("HEADPRUNE_DIST_TIMEOUT", "2")
    t0 = time.perf_counter()
    assert main(["info", "--model", str(tiny_dir), "--device", "cpu"]) == 2
    assert time.perf_counter() - t0 < 30
    _one_line_error(capsys, words)


# ---------------------------------------------------------------- a fully pruned model


@pytest.fixture(scope="module")
def headless_dir(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("headless") / "m"
    heads = ",".join(f"L{l}H{h}" for l in range(3) for h in range(4))
    assert main(["prune", "--model", str(tiny_dir), "--heads", heads, "--out", str(out), "--quiet"]) == 0
    return out


@pytest.mark.parametrize("methods", ["wo_fro", "out_norm", "entropy", "grad", "abl_zero", "all"])
def test_a_fully_pruned_model_has_no_heads_to_score(headless_dir, corpus, tmp_path, capsys, methods):
    common = ["--model", str(headless_dir), "--data", str(corpus), "--max-tokens", "200", "--device", "cpu"]
    assert main(["score", *common, "--methods", methods, "--out", str(tmp_path / "s.csv")]) == 2
    _one_line_error(capsys, "no attention heads")
    assert list(tmp_path.iterdir()) == []


def test_a_fully_pruned_model_still_evaluates(headless_dir, corpus, capsys):
    assert main(["eval", "--model", str(headless_dir), "--data", str(corpus), "--max-tokens", "200", "--device",
                 "cpu", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tokens"] > 0 and result["nll"] > 0



# ---------------------------------------------------------------- 16: tokenizing stops once enough tokens exist


def _long_line(chars: int) -> str:
    import pydoc_data.topics

    text = " ".join(pydoc_data.topics.topics.values()).replace("\n", " ")
    return (text * (chars // len(text) + 1))[:chars]


def test_pieces_of_a_long_line_tokenize_exactly_like_the_whole(tiny_dir, tmp_path):
    tok = load_tokenizer(tiny_dir)
    docs = [_long_line(300_000), "  spaced  text ", "x" * 70_000 + " y", "tail"]
    expected: list[int] = []
    for i, doc in enumerate(docs):
        expected += ([tok.eos_token_id] if i else []) + tok(doc, add_special_tokens=False)["input_ids"]
    assert tokenize_corpus(docs, tok, tmp_path).tolist() == expected
    assert tokenize_corpus(docs, tok, tmp_path, limit=500).tolist() == expected[:500]


def test_a_huge_one_line_text_with_max_tokens_reads_only_its_start(tiny_dir, tmp_path, monkeypatch, capsys):
    from headprune.data import tokens
    calls: list[int] = []
    tok = load_tokenizer(tiny_dir)
    real = type(tok).__call__
    monkeypatch.setattr(type(tok), "__call__", lambda self, texts, **k: calls.append(sum(map(len, texts)))
                        or real(self, texts, **k))
    (tmp_path / "big.txt").write_text(_long_line(20_000_000))
    monkeypatch.setenv("HEADPRUNE_CACHE", str(tmp_path / "cache"))
    assert main(["eval", "--model", str(tiny_dir), "--data", str(tmp_path / "big.txt"), "--max-tokens", "300",
                 "--device", "cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] > 0
    assert sum(calls) <= 2 * tokens.PIECE_CHARS  # not 20 MB


def test_a_huge_text_file_is_streamed_in_bounded_memory(tiny_dir, tmp_path, monkeypatch):
    """The file is hashed (cache key) and decoded chunk by chunk: a 20 MB file for 300 tokens never holds more
    than a few chunks in memory, where reading it whole would hold 20 MB of bytes and 20 MB of text."""
    import tracemalloc

    from headprune.data import sources, tokens
    big = tmp_path / "big.txt"
    big.write_text(_long_line(20_000_000) + " \N{SNOWMAN} tail")
    tok = load_tokenizer(tiny_dir)
    decoded: list[int] = []
    real_chunks = sources.TextFile.chunks
    monkeypatch.setattr(sources.TextFile, "chunks",
                        lambda self: (decoded.append(len(c)) or c for c in real_chunks(self)))
    small = tmp_path / "small.txt"
    small.write_text(_long_line(100_000))

    def peak_bytes(path) -> tuple[int, torch.Tensor]:
        tracemalloc.start()
        try:
            ids = tokens.corpus_ids(str(path), "test", tok, 300)
            return tracemalloc.get_traced_memory()[1], ids
        finally:
            tracemalloc.stop()

    peak_bytes(small)  # imports and the tokenizer's fingerprint: the same for any file
    base, _ = peak_bytes(small)
    decoded.clear()
    peak, ids = peak_bytes(big)
    assert len(ids) == 300 and peak - base < 4 * sources.READ_BYTES  # not 20 MB
    assert sum(decoded) <= 2 * sources.READ_BYTES  # only the start was decoded
    whole = big.read_text()
    assert ids.tolist() == tok(whole[:20_000], add_special_tokens=False)["input_ids"][:300]
    assert tokens._cache_key([sources.TextFile(big)], tok) == tokens._cache_key([whole], tok)  # the same entry
    full = tokens.tokenize_corpus([sources.TextFile(big)], tok, tmp_path / "c")  # read to the end, chunk by chunk
    assert full[-3:].tolist() == tok(whole[-40:], add_special_tokens=False)["input_ids"][-3:]
