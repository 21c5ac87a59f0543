"""What ``headprune run`` puts in the report's head-anatomy section: every anatomy measure on a small probe and a
few scoring windows, the induction score of uniform attention and of an ideal induction head on the same probe,
and the attention thumbnails (strongest head of each role, top heads by importance)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pandas as pd
import torch
from torch import Tensor

from headprune.anatomy import corpus_rows, head_anatomy, head_patterns, repeated_random_tokens
from headprune.anatomy.roles import induction_pattern
from headprune.models.base import HeadModel
from headprune.models.heads import parse_head_spec
from headprune.perplexity import Windowing
from headprune.report.anatomy import AnatomyReport, Thumbnail, one_line, strongest
from headprune.schema import TRUTH

PROBE_LENGTH, PROBE_COUNT, CORPUS_ROWS, EXAMPLE_TOKENS, TOP_THUMBNAILS = 24, 4, 1, 32, 6


def induction_baselines(probe: Tensor) -> tuple[float, float]:
    """(uniform, ideal) induction scores on ``probe`` (B,T): a head attending uniformly to all keys j <= i, and an
    ideal head spreading each query's attention over its induction targets (queries without one score nothing)."""
    P = induction_pattern(probe)  # (B,T,T)
    T = probe.shape[1]
    ones = P.sum(-1)  # (B,T) targets per query
    uniform = (ones / torch.arange(1, T + 1)).sum(-1) / T
    ideal = (ones > 0).double().sum(-1) / T
    return float(uniform.mean()), float(ideal.mean())


def anatomy_report(model: HeadModel, score_ids: Tensor, windowing: Windowing, scores: pd.DataFrame,
                   decode: Callable[[list[int]], str] | None = None, seed: int = 0) -> AnatomyReport:
    """The report's anatomy inputs, on ``PROBE_COUNT`` random sequences of ``PROBE_LENGTH`` tokens repeated twice
    and the first ``CORPUS_ROWS`` windows of the scoring tokens."""
    t0 = time.perf_counter()
    bos = windowing.bos
    length = min(PROBE_LENGTH, (model.cfg.n_positions - (bos is not None)) // 2)
    probe = repeated_random_tokens(model.cfg.vocab_size, length, PROBE_COUNT, seed, bos)
    corpus = corpus_rows(score_ids, windowing.seq_len, CORPUS_ROWS, bos)
    a = head_anatomy(model, probe, corpus, batch_size=windowing.batch_size)
    uniform, ideal = induction_baselines(probe)
    example = corpus_rows(score_ids, min(EXAMPLE_TOKENS, model.cfg.n_positions - (bos is not None)), 1, bos)[0]
    picks: list[tuple[str, str, str]] = []  # (head_id, label, example)
    for role, where in (("induction", "probe"), ("duplicate_token", "probe"), ("previous_token_corpus", "corpus")):
        best = str(a.heads["head_id"].iloc[strongest(a.heads, role)])
        picks.append((best, f"strongest {role.replace('_corpus', '')}", where))
    if TRUTH in scores.columns:
        ranked = scores.dropna(subset=[TRUTH]).sort_values([TRUTH, "layer", "head"], ascending=[False, True, True])
        picks += [(h, f"#{i + 1} by {TRUTH}", "corpus") for i, h in enumerate(ranked["head_id"].head(TOP_THUMBNAILS))]
    thumbs = []
    for where, tokens in (("probe", probe[0]), ("corpus", example)):
        heads = [(h, label) for h, label, w in picks if w == where]
        patterns = head_patterns(model, tokens, parse_head_spec(",".join(h for h, _ in heads), model)) if heads else {}
        by_id = {f"L{layer}H{head}": p for (layer, head), p in patterns.items()}
        thumbs += [Thumbnail(h, label, where, by_id[h].double().round(decimals=4).tolist()) for h, label in heads]
    order = {label: i for i, (_, label, _) in enumerate(picks)}
    thumbs.sort(key=lambda t: order[t.label])
    text = decode(example.tolist()) if decode is not None else None
    info = {"probe": f"{PROBE_COUNT} random sequences of {length} tokens repeated twice (seed {seed})",
            "probe_text": f"the first of the {PROBE_COUNT} random sequences of {length} tokens, repeated",
            "corpus": f"the first {corpus.shape[0]} scoring windows of {corpus.shape[1]} tokens",
            "corpus_text": f"the first {len(example)} scoring tokens"
                           + (f": \u201c{one_line(text)[:120]}\u201d" if text else ""),
            "induction_uniform": uniform, "induction_ideal": ideal,
            "mean_correct_logit": a.attribution.logit, "seconds": round(time.perf_counter() - t0, 2)}
    return AnatomyReport(a.heads, a.composition, thumbs, info)
