"""Rank statistics' intervals that hold the data noise: heads resampled jointly with the scoring windows
(report.head_bootstrap with window replicates), checked against a slow loop with scipy and sklearn, and the
replicates' path from the scores to the report."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score

from headprune.errors import HeadpruneError
from headprune.io.work.replicates import read_replicates, replicates_path, row_heads, write_replicates
from headprune.report.head_bootstrap import WindowReplicates, head_bootstrap, within_layer
from headprune.report.plots.figures import rho_over
from headprune.report.predictiveness import predictiveness, top_rows
from headprune.report.tables import top_heads_mask
from headprune.report.views import pred_note

LAYERS, HEADS, B_W = 4, 5, 30


def noisy_scores(seed: int) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """A scores table whose abl_zero and out_norm each have window replicates around them (out_norm's noise
    correlated with abl_zero's), and a weight score wo_fro without any."""
    rng = np.random.default_rng(seed)
    n = LAYERS * HEADS
    scores = pd.DataFrame([{"layer": la, "head": h, "head_id": f"L{la}H{h}", "model_fingerprint": "0123456789"}
                           for la in range(LAYERS) for h in range(HEADS)])
    truth = rng.gamma(2.0, 0.05, n)
    noise = rng.normal(0, 0.04, (B_W, n))
    reps = {"abl_zero": truth + noise, "out_norm": truth + 0.5 * noise + rng.normal(0, 0.03, (B_W, n))}
    scores["abl_zero"], scores["out_norm"] = truth, reps["out_norm"].mean(0)
    scores["wo_fro"] = truth + rng.normal(0, 0.05, n)
    return scores, reps


def slow_loop(x, y, windows: WindowReplicates, replicates: int, seed: int) -> np.ndarray:
    """[B, 3] Spearman ρ, Kendall τ-b, ROC-AUC per joint replicate, one replicate at a time with scipy/sklearn:
    replicate b draws heads as head_bootstrap does and reads them off window replicate b mod B_w."""
    rng = np.random.default_rng(seed)
    out = []
    for b in range(replicates):
        draw = rng.integers(len(x), size=len(x))
        w = b % len(windows.y)
        xb = (x if windows.x is None else windows.x[w])[draw]
        yb, pos = windows.y[w][draw], windows.positive[w][draw]
        auc = roc_auc_score(pos, xb) if 0 < pos.sum() < len(pos) else np.nan
        out.append([stats.spearmanr(xb, yb).statistic, stats.kendalltau(xb, yb).statistic, auc])
    return np.array(out)


@pytest.mark.parametrize("data_x", [True, False], ids=["data score", "weight score"])
def test_joint_intervals_equal_a_slow_loop_over_the_same_draws(data_x):
    scores, reps = noisy_scores(1)
    x = scores["out_norm" if data_x else "wo_fro"].to_numpy()
    y = scores["abl_zero"].to_numpy()
    truth_rows = reps["abl_zero"]
    windows = WindowReplicates(reps["out_norm"] if data_x else None, truth_rows, top_rows(scores, truth_rows))
    ours = head_bootstrap(x, y, top_heads_mask(scores), replicates=70, seed=3, windows=windows)
    loop = np.nanpercentile(slow_loop(x, y, windows, 70, 3), [2.5, 97.5], axis=0)  # [2, 3]
    got = np.array([[ours[f"{s}_ci_lo"], ours[f"{s}_ci_hi"]] for s in ("spearman", "kendall", "roc_auc")]).T
    np.testing.assert_allclose(got, loop, rtol=0, atol=1e-12)


def test_without_data_noise_the_joint_interval_is_the_heads_alone():
    scores, _ = noisy_scores(2)
    x, y = scores["wo_fro"].to_numpy(), scores["abl_zero"].to_numpy()
    positive = top_heads_mask(scores)
    still = WindowReplicates(np.tile(x, (B_W, 1)), np.tile(y, (B_W, 1)), np.tile(positive, (B_W, 1)))
    assert head_bootstrap(x, y, positive, windows=still) == head_bootstrap(x, y, positive)
    layers = scores["layer"].to_numpy()
    assert within_layer(x, y, layers, windows=still) == within_layer(x, y, layers)


def test_joint_within_layer_interval_equals_a_loop():
    scores, reps = noisy_scores(3)
    x, y, layers = scores["out_norm"].to_numpy(), scores["abl_zero"].to_numpy(), scores["layer"].to_numpy()
    windows = WindowReplicates(reps["out_norm"], reps["abl_zero"], top_rows(scores, reps["abl_zero"]))
    point, lo, hi = within_layer(x, y, layers, replicates=60, seed=4, windows=windows)
    rng = np.random.default_rng(4)
    members = [np.flatnonzero(layers == la) for la in np.unique(layers)]
    rhos = []
    for b in range(60):  # the pooled ρ of within-layer ranks of the heads drawn, read off window replicate b
        draw = np.concatenate([rng.choice(m, size=len(m)) for m in members])
        xb, yb = reps["out_norm"][b % B_W][draw], reps["abl_zero"][b % B_W][draw]
        a = np.concatenate([stats.rankdata(xb[layers[draw] == la]) - (layers[draw] == la).sum() / 2 - 0.5
                            for la in np.unique(layers)])
        c = np.concatenate([stats.rankdata(yb[layers[draw] == la]) - (layers[draw] == la).sum() / 2 - 0.5
                            for la in np.unique(layers)])
        rhos.append((a * c).sum() / np.sqrt((a * a).sum() * (c * c).sum()))
    assert (lo, hi) == pytest.approx(tuple(np.percentile(rhos, [2.5, 97.5])), abs=1e-12)
    assert point == within_layer(x, y, layers)[0]


def test_top_rows_mark_each_replicate_as_the_table_marks_its_values():
    scores, reps = noisy_scores(4)
    rows = np.round(reps["abl_zero"], 2)  # ties at the cut: the smaller layer, head goes first
    rows[0, 3] = np.nan
    marked = top_rows(scores, rows)
    for row, values in zip(marked, rows, strict=True):
        assert (row == top_heads_mask(scores.assign(abl_zero=values))).all()


def test_predictiveness_says_which_intervals_hold_the_data_noise():
    scores, reps = noisy_scores(5)
    joint = predictiveness(scores, reps).set_index("method")
    alone = predictiveness(scores).set_index("method")
    assert joint["ci_resamples"].tolist() == ["windows and heads"] * 2 and set(alone["ci_resamples"]) == {"heads"}
    assert (joint["spearman_rho"] == alone["spearman_rho"]).all()  # the points are the table's
    assert (joint["spearman_ci_lo"] != alone["spearman_ci_lo"]).all()
    partial = predictiveness(scores, {"abl_zero": reps["abl_zero"]}).set_index("method")  # out_norm's are missing
    assert partial["ci_resamples"].to_dict() == {"out_norm": "heads", "wo_fro": "windows and heads"}
    assert "of the heads alone for the others" in pred_note(partial.reset_index())
    assert "scoring windows' noise is not in them" in pred_note(alone.reset_index())
    assert rho_over(joint.reset_index()) == "over the scoring windows and the heads together"  # the scatters' caption
    assert rho_over(alone.reset_index()) == "over heads" and "else over the heads" in rho_over(partial.reset_index())


def test_replicates_are_saved_beside_the_table_and_read_back_in_the_order_asked(tmp_path):
    scores, reps = noisy_scores(6)
    table, heads = tmp_path / "scores.parquet", row_heads(scores)
    write_replicates(table, reps, heads)
    back = read_replicates(table, heads)
    assert back is not None and set(back) == set(reps)
    assert all(np.array_equal(back[m], reps[m]) for m in reps)
    shuffled = np.random.default_rng(0).permutation(len(heads))  # a table whose rows come in another order
    again = read_replicates(table, [heads[i] for i in shuffled])
    assert again is not None and all(np.array_equal(again[m], reps[m][:, shuffled]) for m in reps)
    with pytest.raises(HeadpruneError, match="does not belong to its scores table"):
        read_replicates(table, heads[:-1])
    with pytest.raises(HeadpruneError, match="does not belong to its scores table"):
        read_replicates(table, [*heads[:-1], (LAYERS, 0)])
    replicates_path(table).write_bytes(b"not safetensors")
    with pytest.raises(HeadpruneError, match="cannot read"):
        read_replicates(table, heads)
    write_replicates(table, None, heads)  # a later save without replicates leaves none behind
    assert read_replicates(table, heads) is None


def test_predictiveness_reads_the_replicates_in_the_table_row_order():
    """A table whose rows are not in (layer, head) order, with its replicates in that same order, gives what the
    sorted table and replicates give; a width that is not the table's is one clear error."""
    scores, reps = noisy_scores(7)
    shuffled = np.random.default_rng(1).permutation(len(scores))
    mixed = predictiveness(scores.iloc[shuffled].reset_index(drop=True), {m: v[:, shuffled] for m, v in reps.items()})
    pd.testing.assert_frame_equal(mixed, predictiveness(scores, reps))
    with pytest.raises(HeadpruneError, match="not one column per head"):
        predictiveness(scores, {"abl_zero": reps["abl_zero"][:, :-1]})


def test_the_shipped_report_rebuilds_its_joint_intervals_from_its_replicates(tmp_path):
    """`headprune report` on the shipped run reads the replicates beside its scores and writes the committed
    predictiveness table again: every interval over windows and heads."""
    from pathlib import Path

    from headprune.report import rebuild_report

    run = Path(__file__).resolve().parents[2] / "reports" / "stdlib-gpt2-mini"
    rebuild_report(run / "scores.parquet", run / "curves.parquet", tmp_path / "again")
    again, committed = pd.read_csv(tmp_path / "again" / "predictiveness.csv"), pd.read_csv(run / "predictiveness.csv")
    assert set(committed["ci_resamples"]) == {"windows and heads"}
    pd.testing.assert_frame_equal(again, committed)
