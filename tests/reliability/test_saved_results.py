"""Stage results saved and read back whole: HeadScores (table, head means, abl_opt's constants, baseline, which
tokens and windows), CurveResult (table, baseline, the choice); saved means reused by ``curve`` only where they were
measured on its tokens and windows, with the curves they give equal to measuring the means again."""

import pandas as pd
import pytest
import torch

from headprune.cli.main import main
from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.io.work.files import read_table
from headprune.perplexity import Windowing
from headprune.pruning.curves import pruning_curves
from headprune.pruning.options import Compensation, CurveOptions, Selection
from headprune.report.choice import choose
from headprune.scoring import head_means, score_heads
from headprune.scoring.result import MEANS, META, beside, load_scores, saved_means
from headprune.stages.curves import CurveResult, load_curves
from headprune.table_checks import check_curves, check_scores

from helpers import TINY

SEQ, WINDOWS = 16, 4


@pytest.fixture(scope="module")
def scored(tiny_dir):
    model = load_model(tiny_dir)
    ids = torch.randint(0, TINY["vocab_size"], (SEQ * WINDOWS,), generator=torch.Generator().manual_seed(3))
    w = Windowing(SEQ, SEQ, 2)
    return model, ids, w, score_heads(model, ids, ["wo_fro", "out_norm", "abl_zero", "abl_opt"], windowing=w,
                                      show_progress=False)


def test_scores_read_back_whole(scored, tmp_path):
    model, ids, w, result = scored
    path = result.save(tmp_path / "s.parquet")
    loaded = load_scores(path)
    pd.testing.assert_frame_equal(loaded.table, check_scores(result.table))
    assert loaded.means.keys() == result.means.keys() == set(model.head_ids)
    assert all(torch.equal(loaded.means[h], result.means[h]) for h in model.head_ids)
    assert all(torch.equal(loaded.optimal[h], result.optimal[h]) for h in model.head_ids)
    assert loaded.baseline == result.baseline and loaded.tokens == len(ids) == result.tokens
    assert loaded.measured_on == result.measured_on
    assert set(loaded.seconds) == set(result.seconds)
    # the means are those head_means measures on the same windows, and they are reused only there
    independent = head_means(model, ids, w, show_progress=False)
    assert all(torch.allclose(loaded.means[h], independent[h], atol=1e-6) for h in model.head_ids)
    assert saved_means(loaded, ids, w) is loaded.means
    assert saved_means(loaded, ids.flip(0), w) is None
    assert saved_means(loaded, ids, Windowing(SEQ // 2, SEQ // 2, 2)) is None


def test_a_table_saved_alone_reads_back_without_means(scored, tmp_path):
    model, ids, w, result = scored
    path = result.save(tmp_path / "s.csv")
    weights = score_heads(model, None, ["wo_fro"], show_progress=False)
    weights.save(path)  # the same path: the earlier means must not stay beside the new table
    assert not beside(path, MEANS).exists()
    loaded = load_scores(path)
    assert loaded.means is None and loaded.measured_on is None and saved_means(loaded, ids, w) is None
    beside(path, META).unlink()
    assert load_scores(path).baseline is None  # the table alone, as an older version saved it


def test_a_table_written_by_hand_needs_only_layer_head_and_a_method(scored, tmp_path):
    *_, result = scored
    path = tmp_path / "hand.csv"
    result.table[["layer", "head", "wo_fro"]].to_csv(path, index=False)
    loaded = load_scores(path)
    assert loaded.table["wo_fro"].tolist() == result.table["wo_fro"].tolist() and loaded.means is None
    result.table.assign(head_id="L0H0")[["layer", "head", "head_id", "wo_fro"]].to_csv(path, index=False)
    with pytest.raises(HeadpruneError, match="head_id 'L0H0' does not match its layer and head"):
        load_scores(path)


def test_bad_saved_means_are_one_clear_error(scored, tmp_path):
    result = scored[-1]
    path = result.save(tmp_path / "s.parquet")
    means = beside(path, MEANS)
    good = means.read_bytes()
    means.write_bytes(good[:40])
    with pytest.raises(HeadpruneError, match="cannot read .*means.safetensors"):
        load_scores(path)
    means.write_bytes(good)
    result.table[result.table["layer"] > 0].reset_index(drop=True).to_parquet(path, index=False)
    with pytest.raises(HeadpruneError, match="not a finite vector of a head of its scores table"):
        load_scores(path)  # means of layer 0 beside a table without it
    result.save(path)
    beside(path, META).write_text("[1, 2]")
    with pytest.raises(HeadpruneError, match="must hold a JSON object"):
        load_scores(path)


def test_curves_read_back_with_their_baseline_and_choice(scored, tmp_path):
    model, ids, w, result = scored
    curves = pruning_curves(model, ids, result.table, [("abl_zero", "none"), ("wo_fro", "none"), ("random", "none")],
                            options=CurveOptions((0.0, 0.25, 0.5), 2, 0, Selection(seed=1), w),
                            compensation=Compensation(means=result.means), show_progress=False)
    saved = CurveResult(curves, curves.attrs["baseline"], choose(curves))
    loaded = load_curves(saved.save(tmp_path / "run"))
    pd.testing.assert_frame_equal(loaded.table, check_curves(curves), check_exact=True)
    pd.testing.assert_frame_equal(check_curves(read_table(tmp_path / "run" / "curves.csv")), loaded.table,
                                  check_exact=True)
    assert loaded.baseline["nll"] == curves.attrs["baseline"]["nll"] and loaded.choice == saved.choice
    (tmp_path / "run" / "baseline.json").unlink()  # read off the fraction-0 row instead
    zero = curves[curves.fraction == 0].iloc[0]
    assert load_curves(tmp_path / "run").baseline["nll"] == zero.nll


def test_curve_reuses_the_means_saved_with_the_scores(tiny_dir, corpus, tmp_path, capsys):
    common = ["--model", str(tiny_dir), "--max-tokens", "300", "--seq-len", "32", "--batch-size", "4"]
    scores = tmp_path / "s.csv"
    assert main(["score", *common, "--quiet", "--data", str(corpus),
                 "--methods", "wo_fro,out_norm", "--out", str(scores)]) == 0
    assert beside(scores, MEANS).is_file()
    curve = ["curve", *common, "--data", str(corpus), "--score-data", str(corpus), "--scores", str(scores),
             "--methods", "wo_fro", "--compensate", "mean", "--fractions", "0,0.5", "--seeds", "1",
             "--bootstrap", "0"]
    capsys.readouterr()
    assert main([*curve, "--out", str(tmp_path / "reused.csv")]) == 0
    assert "head means: read from beside" in capsys.readouterr().out
    beside(scores, MEANS).unlink()
    assert main([*curve, "--out", str(tmp_path / "measured.csv")]) == 0
    assert "head means: read from beside" not in capsys.readouterr().out
    reused, measured = read_table(tmp_path / "reused.csv"), read_table(tmp_path / "measured.csv")
    assert (reused.compensation == "mean").any()
    assert reused.nll.to_numpy() == pytest.approx(measured.nll.to_numpy(), abs=1e-6)
