"""``headprune patch``: the table it writes equals the library's patching of the same pairs, a bad pair file is one
line naming the line, and a rerun resumes to the same table."""

import json

import numpy as np
import pytest

from headprune.cli.main import main
from headprune.io.read.loading import load_model
from headprune.io.work.files import read_table
from headprune.patching import (
    PatchOptions,
    Subsampling,
    atp_star_z,
    atp_z,
    missed_bound,
    patch,
    patch_z,
    run_pairs,
    task_pairs,
)


def test_patch_table_equals_the_library_on_the_same_pairs(tiny_dir, tmp_path, capsys):
    out = tmp_path / "patch.csv"
    argv = ["patch", "--model", str(tiny_dir), "--task", "induction", "--n-pairs", "4", "--seed", "3",
            "--bootstrap", "0", "--out", str(out), "--quiet", "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    table = read_table(out)
    model = load_model(tiny_dir)
    pairs = task_pairs("induction", model, n_pairs=4, seed=3)
    exact, atp = patch_z(model, pairs), atp_z(model, pairs)
    np.testing.assert_allclose(table["patch_z"], exact.effect.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(table["atp_z"], atp.effect.numpy(), rtol=0, atol=1e-12)
    assert summary["gap"] == pytest.approx(float((exact.m_clean - exact.m_corrupt).mean()), abs=1e-6)  # float32 runs
    top = table.assign(size=table["patch_z"].abs()).sort_values("size", ascending=False)["head_id"].head(5).tolist()
    assert summary["top_heads"] == top
    agreement = read_table(tmp_path / "patch_agreement.csv")
    assert list(agreement["method"]) == ["atp_z", "atp_star_z"]
    # the bound on what each approximation leaves unverified: the library's, with the same seed
    missed = read_table(tmp_path / "patch_missed.csv")
    runs = run_pairs(model, pairs)
    for approx, bound in zip([atp, atp_star_z(model, pairs)], summary["bounds"], strict=True):
        want = missed_bound(model, runs, approx, subsampling=Subsampling(seed=3))
        got = missed[missed["method"] == approx.method]
        np.testing.assert_allclose(got["upper"], want.table["upper"], rtol=0, atol=1e-9)
        assert bound["bound"] == pytest.approx(want.bound, abs=1e-9) and bound["verified"] == want.verified
        exact_change = dict(zip(table["head_id"], exact.change.abs().tolist()))
        np.testing.assert_allclose(got["exact"], [exact_change[h] for h in got["head_id"]], rtol=0, atol=1e-12)
    assert main(argv) == 0 and read_table(out).equals(table)  # the finished table is rewritten identically
    # rerun into the same --out without approximations: no agreement or bound of the first run stays beside it
    capsys.readouterr()
    assert main([*argv, "--approximations", "", "--overwrite"]) == 0
    assert not (tmp_path / "patch_agreement.csv").exists() and not (tmp_path / "patch_missed.csv").exists()


@pytest.mark.parametrize("line, words", [
    ('{"clean_ids": [1, 2], "corrupt_ids": [1], "answer_id": 3, "wrong_id": 4}', "line 2"),
    ('{"clean_ids": [1, 2], "corrupt_ids": [1, 5], "answer_id": 3', "line 2"),
])
def test_a_bad_pair_file_is_one_line_naming_the_line(tiny_dir, tmp_path, capsys, line, words):
    pairs = tmp_path / "pairs.jsonl"
    good = '{"clean_ids": [1, 2, 3], "corrupt_ids": [4, 5, 6], "answer_id": 7, "wrong_id": 8}'
    pairs.write_text(good + "\n" + line + "\n")
    out = tmp_path / "patch.csv"
    assert main(["patch", "--model", str(tiny_dir), "--pairs", str(pairs), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("headprune: error:") and words in err[0]
    assert not out.exists() and not list(tmp_path.glob("patch.csv*"))


def test_by_position_table_holds_every_activation(tiny_dir, tmp_path):
    out = tmp_path / "pos.csv"
    assert main(["patch", "--model", str(tiny_dir), "--task", "induction", "--n-pairs", "3", "--activations", "z,q",
                 "--by-position", "--out", str(out), "--quiet"]) == 0
    table = read_table(out)
    model = load_model(tiny_dir)
    pairs = task_pairs("induction", model, n_pairs=3, seed=0)
    T = pairs.clean.shape[1]
    assert len(table) == 12 * T and list(table["position"][:T]) == list(range(T))
    for activation in ["z", "q"]:
        want = patch(model, pairs, activation, options=PatchOptions(by_position=True)).effect.reshape(-1).numpy()
        np.testing.assert_allclose(table[f"patch_{activation}"], want, rtol=0, atol=1e-12)
