"""The long-documents stage of a run (issue 53, item 5): perplexity and the heads' ``taylor`` ranking at the run's
window length and ×4 longer ones up to :data:`LONGEST` tokens, on the same tokens of the long-document corpus (test
split; :mod:`headprune.data.long_docs`), for a model whose context holds at least
:data:`~headprune.context.MAX_SEQ_LEN` tokens; beside the run's own scores on its own corpus.

Tables (:data:`WINDOWS_FILE`, :data:`RANKS_FILE`, :data:`TAYLOR_FILE` in the run's folder):

- one row per length: scored targets, windows, NLL and perplexity with 95% intervals over resampled spans, and the
  NLL's change from the run's length, paired on the same spans;
- rank agreement of ``taylor`` between two lengths on the same text, and between the run's corpus and the long
  documents at the run's length: Spearman ρ with its interval over spans and heads resampled together, and the share
  of the top 10% in common with its interval over spans;
- each head's ``taylor`` at every length.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from headprune.context import MAX_SEQ_LEN
from headprune.errors import HeadpruneError
from headprune.io.work.progress import NoProgress, Progress
from headprune.report.window_length_section import RANKS_FILE, TAYLOR_FILE, WINDOWS_FILE
from headprune.stages.inputs import RunInputs

LONGEST = 2048  # the longest window measured (the model's context permitting)
SPANS = 8  # spans of the longest window: the bootstrap's units
CORPUS = "longdocs"
TOP = 0.1  # the top share whose overlap is counted
RUN_CORPUS = "the run's corpus"


def lengths_for(model, run_len: int) -> list[int]:
    """The lengths measured on ``model`` with the run's windows of ``run_len``: [] where its context is under
    :data:`MAX_SEQ_LEN` tokens or holds no window 4× the run's."""
    from headprune.scoring.window_length import window_lengths

    context = model.cfg.n_positions - (model.origin.bos_token_id is not None)
    if context < MAX_SEQ_LEN:
        return []
    lengths = window_lengths(run_len, context, LONGEST)
    return lengths if len(lengths) > 1 else []


def long_ids(tokenizer, span: int):
    """:data:`SPANS` spans of ``span`` tokens of the long documents' test split (whole spans; at least 2)."""
    from headprune.data.tokens import corpus_ids

    ids = corpus_ids(CORPUS, "test", tokenizer, SPANS * span)
    spans = len(ids) // span
    if spans < 2:
        raise HeadpruneError(f"the {CORPUS} corpus' test split holds {len(ids)} tokens: fewer than 2 windows of {span}")
    return ids[: spans * span]


def cost_line(model, lengths: list[int], tokens: int, pace) -> str:
    """What the stage will cost here: a forward and a backward (2 forward-equivalents) per length."""
    from headprune.cost import Estimate

    seconds = sum(pace.seconds(model, n, tokens, 2.0) for n in lengths)
    return Estimate(f"on {tokens:,} tokens at {len(lengths)} lengths", {"long documents": seconds}).line()


def planned(inputs: RunInputs, s, pace=None) -> tuple[list[int], str] | None:
    """The lengths the stage measures for this run and the line saying what that costs here (``pace``: measured
    where not given), or None where the model's context is too short or the run did not score taylor."""
    from headprune.cost import Pace

    lengths = lengths_for(inputs.model, inputs.windowing.seq_len)
    if not lengths or "taylor" not in s.methods:
        return None
    pace = pace or Pace.here(inputs.model, inputs.windowing.seq_len)
    return lengths, (f"lengths {', '.join(map(str, lengths))} on {SPANS} spans of {max(lengths):,} tokens of the "
                     f"{CORPUS} corpus (test split): " + cost_line(inputs.model, lengths, SPANS * max(lengths), pace))


def long_stage(inputs: RunInputs, s, run_taylor: np.ndarray, run_replicates: np.ndarray | None,
               progress: Progress | NoProgress, quiet: bool = False) -> dict[str, pd.DataFrame]:
    """The three tables, by file name, of the run with settings ``s`` and ``inputs``; ``run_taylor`` [H] the run's own
    taylor in the model's head order and ``run_replicates`` [B, H] its values on resampled windows (None: heads
    resampled only; :func:`run_taylor_of`). Resumable units under ``window_length/<L>/`` in ``progress``."""
    from headprune.scoring.window_length import span_pass

    model, w = inputs.model, inputs.windowing
    lengths = lengths_for(model, w.seq_len)
    if not lengths:
        raise HeadpruneError(f"the model's context ({model.cfg.n_positions} positions) holds no windows of "
                             f"{4 * w.seq_len} tokens of at least {MAX_SEQ_LEN}: nothing to compare")
    ids = long_ids(inputs.tokenizer, max(lengths))
    passes = [span_pass(model, ids, n, lengths, max(1, w.batch_size * w.seq_len // n), w.bos, progress,
                        show_progress=not quiet) for n in lengths]
    counts = span_counts(len(passes[0].n), s.bootstrap, s.seed)
    heads = [f"L{layer}H{h}" for layer, h in model.head_ids]
    return {WINDOWS_FILE: length_table(passes, counts),
            RANKS_FILE: rank_table(passes, counts, run_taylor, run_replicates, s.seed),
            TAYLOR_FILE: pd.DataFrame({"head_id": heads, **{f"taylor_{p.seq_len}": p.taylor.sum(0) / p.n.sum()
                                                            for p in passes}})}


def span_counts(n_spans: int, replicates: int, seed: int) -> np.ndarray:
    """[B, S]: how often each span is drawn in each replicate (at least 200, whatever the run's bootstrap)."""
    from headprune.bootstrap import window_counts

    return window_counts(n_spans, max(replicates, 200), seed).numpy()


def length_table(passes, counts: np.ndarray) -> pd.DataFrame:
    """One row per length: NLL and perplexity with their intervals, and the change from the first (the run's)
    length paired on the same spans."""
    from headprune.bootstrap import interval

    n = passes[0].n
    if any(not np.array_equal(p.n, n) for p in passes):
        raise HeadpruneError("the lengths scored different targets; the comparison would not be paired")
    reps = [counts @ p.nll / (counts @ n) for p in passes]  # [B] each
    rows = []
    for p, rep in zip(passes, reps, strict=True):
        nll, (lo, hi), (dlo, dhi) = p.nll.sum() / n.sum(), interval(rep), interval(rep - reps[0])
        rows.append({"seq_len": p.seq_len, "tokens": int(n.sum()), "spans": len(n),
                     "windows": len(n) * (passes[-1].seq_len // p.seq_len), "nll": nll, "ppl": math.exp(nll),
                     "ppl_ci_lo": math.exp(lo), "ppl_ci_hi": math.exp(hi),
                     "delta_nll": nll - passes[0].nll.sum() / n.sum(), "delta_ci_lo": float(dlo),
                     "delta_ci_hi": float(dhi)})
    return pd.DataFrame(rows)


def _top(values: np.ndarray, k: int) -> np.ndarray:
    """[..., H] -> [..., H] bool: the k largest of each row."""
    order = np.argsort(-values, axis=-1, kind="stable")[..., :k]
    out = np.zeros(values.shape, dtype=bool)
    np.put_along_axis(out, order, True, axis=-1)
    return out


def agreement(x: np.ndarray, y: np.ndarray, x_reps: np.ndarray | None, y_reps: np.ndarray, seed: int) -> dict:
    """Spearman ρ of x, y [H] with its interval over heads and data resampled together
    (:func:`headprune.report.head_bootstrap.head_bootstrap`), and the share of the top :data:`TOP` in common with its
    interval over the data's replicates [B, H]."""
    from scipy.stats import spearmanr

    from headprune.bootstrap import interval
    from headprune.report.head_bootstrap import WindowReplicates, head_bootstrap

    k = max(1, math.ceil(TOP * len(x)))
    top_y = _top(y_reps, k)
    rho = head_bootstrap(x, y, _top(y, k), seed=seed, windows=WindowReplicates(x_reps, y_reps, top_y))
    xr = x_reps[np.arange(len(y_reps)) % len(x_reps)] if x_reps is not None else np.broadcast_to(x, y_reps.shape)
    shared = (_top(xr, k) & top_y).sum(1) / k
    lo, hi = interval(shared)
    return {"spearman_rho": float(spearmanr(x, y).statistic), "spearman_ci_lo": rho["spearman_ci_lo"],
            "spearman_ci_hi": rho["spearman_ci_hi"], "top": k, "top_shared": float((_top(x, k) & _top(y, k)).sum() / k),
            "top_shared_ci_lo": float(lo), "top_shared_ci_hi": float(hi)}


def rank_table(passes, counts: np.ndarray, run_taylor: np.ndarray, run_replicates: np.ndarray | None,
               seed: int) -> pd.DataFrame:
    """Each longer length against the run's on the same text, then the run's corpus against the long documents at
    the run's length."""
    n = passes[0].n
    taylor = {p.seq_len: (p.taylor.sum(0) / n.sum(), counts @ p.taylor / (counts @ n)[:, None]) for p in passes}
    first = passes[0].seq_len
    x, x_reps = taylor[first]
    rows = [{"x": f"{CORPUS}, {first}", "y": f"{CORPUS}, {p.seq_len}", "x_len": first, "y_len": p.seq_len,
             **agreement(x, taylor[p.seq_len][0], x_reps, taylor[p.seq_len][1], seed)} for p in passes[1:]]
    rows.append({"x": f"{RUN_CORPUS}, {first}", "y": f"{CORPUS}, {first}", "x_len": first, "y_len": first,
                 **agreement(run_taylor, x, run_replicates, x_reps, seed)})
    return pd.DataFrame(rows)


def run_taylor_of(scores: pd.DataFrame, replicates: Mapping[str, np.ndarray] | None, head_ids
                  ) -> tuple[np.ndarray, np.ndarray | None]:
    """The run's taylor [H] and its window replicates [B, H] in the model's head order (``head_ids``), from a
    scores table in any row order and its replicates (columns in the table's row order)."""
    if "taylor" not in scores.columns:
        raise HeadpruneError("the run has no taylor scores to compare with; score taylor (it is in the default "
                             "methods)")
    where = {(int(la), int(h)): i for i, (la, h) in enumerate(zip(scores["layer"], scores["head"], strict=True))}
    order = [where[head] for head in head_ids]
    reps = None if not replicates or "taylor" not in replicates else np.asarray(replicates["taylor"])[:, order]
    return scores["taylor"].to_numpy(dtype=float)[order], reps
