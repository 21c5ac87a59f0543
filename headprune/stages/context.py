"""The context stage: which KV heads need the whole context, and how much of the KV cache can stream.

1. The context scores (:mod:`headprune.scoring.context`: ctx_stream exact, ctx_gate, ctx_retrieval) on windows of
   ``seq_len`` tokens of the long documents' *validation* split.
2. The streaming curve (:mod:`headprune.context.curve`) on the long documents' *test* split and on the task's
   prompts: each score's order and random orders, KV heads made streaming least need first.
3. Per ranking, the largest share within 1% and 5% of the full model, with intervals; the exported pattern chosen
   on one half of the test windows and prompts and measured on the other (:mod:`headprune.context.choice`).

Everything is saved to and loaded from one folder (:meth:`ContextResult.save`, :func:`load_context`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import ClassVar

import pandas as pd

from headprune.context import DEFAULT_SHARES, MAX_SEQ_LEN
from headprune.context.choice import TOLERANCES, choose, cross_fit, curve_table, largest_shares, with_measure
from headprune.context.curve import LongProbe, check_shares, random_order, streaming_curve, streaming_order
from headprune.context.pattern import KVPattern, read_pattern, write_pattern
from headprune.context.summary import summary_lines
from headprune.errors import HeadpruneError
from headprune.io.read.fingerprint import model_fingerprint
from headprune.io.work.files import atomic_dir, read_table, write_json, write_table, write_text
from headprune.io.work.progress import NoProgress, Progress
from headprune.models.base import HeadModel
from headprune.models.kv_cache import kv_heads
from headprune.models.streaming import DEFAULT_RECENT, DEFAULT_SINK, check_streaming
from headprune.schema import CONTEXT_METHODS

TASKS = ("recall", "multikey", "passkey", "none")
MULTIKEY_KEYS = 4


@dataclass(frozen=True)
class ContextSettings:
    """What the stage measures; ``None`` fields are filled from the model by :meth:`resolve`."""

    seq_len: int | None = None  # tokens per long window (default: the model's context, up to 1,024)
    score_windows: int = 2  # validation windows the scores are computed on
    curve_windows: int = 4  # test windows each curve point is measured on
    tail: int | None = None  # last tokens of each curve window scored (default: seq_len / 4)
    sink: int = DEFAULT_SINK
    recent: int | None = None  # a streaming head's recent tokens (default: 256, at most seq_len / 8)
    methods: tuple[str, ...] = CONTEXT_METHODS
    shares: tuple[float, ...] = DEFAULT_SHARES
    random_seeds: int = 3
    task: str = "recall"  # measured beside the tail NLL: recall, multikey, passkey or none
    prompts: int = 3  # the task's prompts at each length (seq_len / 2 and seq_len)
    tolerance: float = 0.01  # the exported pattern: the largest share within this of the full model
    bootstrap: int = 200
    seed: int = 0

    def resolve(self, model: HeadModel) -> ContextSettings:
        """Defaults from ``model`` and every value checked (one HeadpruneError line)."""
        seq_len = self.seq_len or min(MAX_SEQ_LEN, model.cfg.n_positions)
        if seq_len > model.cfg.n_positions:
            raise HeadpruneError(f"--seq-len {seq_len} is longer than the model's context of {model.cfg.n_positions} "
                                 "tokens", "seq_len")
        recent = self.recent or min(DEFAULT_RECENT, seq_len // 8)
        tail = self.tail or seq_len // 4
        check_streaming(self.sink, recent, seq_len)
        if not 0 < tail <= seq_len - self.sink - recent - 1:
            raise HeadpruneError(f"--tail {tail} must leave the first sink + window + 1 = {self.sink + recent + 1} "
                                 f"tokens of each {seq_len}-token window unscored (else streaming changes nothing "
                                 "it scores)", "tail")
        if self.score_windows < 1 or self.curve_windows < 2:
            raise HeadpruneError("the context stage needs at least 1 scoring window and 2 curve windows", "windows")
        bad = [m for m in self.methods if m not in CONTEXT_METHODS]
        if bad or not self.methods:
            raise HeadpruneError(f"context methods are {', '.join(CONTEXT_METHODS)}, got {list(self.methods)}",
                                 "methods")
        if self.bootstrap < 40:
            raise HeadpruneError(f"bootstrap {self.bootstrap}: the context stage states intervals, give at least 40 "
                                 "replicates", "bootstrap")
        check_shares(self.shares)
        if self.random_seeds < 0:
            raise HeadpruneError(f"random_seeds {self.random_seeds} must be 0 or more", "random_seeds")
        if self.task not in TASKS:
            raise HeadpruneError(f"task {self.task!r}: give one of {', '.join(TASKS)}", "task")
        if self.prompts < 2 and self.task != "none":
            raise HeadpruneError(f"prompts {self.prompts}: at least 2 per length (the held-out check halves them)",
                                 "prompts")
        if not 0 < self.tolerance < 1:
            raise HeadpruneError(f"tolerance {self.tolerance} must lie in (0, 1)", "tolerance")
        return replace(self, seq_len=seq_len, recent=recent, tail=tail)


@dataclass
class ContextResult:
    """The stage's tables: ``scores`` (one row per query head, the ctx_* columns and intervals), ``curve`` (one row
    per ranking and share: ΔNLL, accuracy, KV bytes), ``shares`` (largest share within each tolerance per
    ranking), ``cross_fit`` (the choice on one half, measured on the other), the exported ``pattern``, the
    per-window ``points`` and the resolved ``settings``."""

    scores: pd.DataFrame
    curve: pd.DataFrame
    shares: pd.DataFrame
    cross_fit: pd.DataFrame
    pattern: KVPattern
    points: dict[str, dict[str, list]]
    settings: dict = field(default_factory=dict)

    FILES: ClassVar[dict[str, str]] = {"scores": "context_scores.csv", "curve": "streaming_curve.csv",
                                       "shares": "streaming_shares.csv", "cross_fit": "cross_fit.csv"}

    def summary(self) -> list[str]:
        """The study's sentences (markdown lines), from its tables."""
        return summary_lines(self.scores, self.curve, self.shares, self.cross_fit, self.pattern, self.settings)

    def save(self, folder: str | os.PathLike, model: HeadModel) -> Path:
        """Every table, the points, the settings and the pattern (headprune's and kvpress') into ``folder``."""
        with atomic_dir(folder) as tmp:
            self.save_tables(tmp)
            write_json(Path(tmp) / "points.json", self.points)
            write_json(Path(tmp) / "settings.json", self.settings)
            write_pattern(self.pattern, model, Path(tmp) / "pattern")
        return Path(folder)

    def save_tables(self, folder: str | os.PathLike) -> None:
        """The tables and summary.md (each file written atomically) into the existing ``folder``."""
        for name, file in self.FILES.items():
            write_table(getattr(self, name), Path(folder) / file)
        write_text(Path(folder) / "summary.md", "\n".join(self.summary()) + "\n")


def load_context(folder: str | os.PathLike) -> ContextResult:
    """A saved :class:`ContextResult` (one HeadpruneError line where a file is missing)."""
    folder = Path(folder)
    try:
        tables = {name: read_table(folder / file) for name, file in ContextResult.FILES.items()}
        points = json.loads((folder / "points.json").read_text())
        settings = json.loads((folder / "settings.json").read_text())
    except FileNotFoundError as err:
        raise HeadpruneError(f"{folder} is not a saved context study ({Path(err.filename).name} missing)") from None
    tables["shares"] = with_measure(tables["shares"])
    return ContextResult(**tables, pattern=read_pattern(folder / "pattern"), points=points, settings=settings)


def context_probe(model: HeadModel, s: ContextSettings) -> LongProbe:
    """The curve's windows (long documents' test split) and the task's prompts, ``s.prompts`` at each of the
    lengths seq_len/2 and seq_len (recall, passkey: needles at evenly spaced depths; multikey: 4 keys)."""
    from headprune.io.read.tokenizer import model_tokenizer
    from headprune.patching.long_tasks import long_windows, multikey_task, passkey_task, recall_task
    from headprune.perplexity import Windowing

    assert s.seq_len and s.tail and s.recent
    tokenizer, bos = model_tokenizer(model), Windowing.for_model(model, s.seq_len).bos
    windows = long_windows(tokenizer, length=s.seq_len, n_windows=s.curve_windows, split="test", bos=bos)
    lengths = (s.seq_len // 2, s.seq_len)
    if s.task in ("passkey", "recall"):
        depths = [(i + 0.5) / s.prompts for i in range(s.prompts)]
        build = passkey_task if s.task == "passkey" else recall_task
        prompts = build(tokenizer, lengths=lengths, depths=depths, per_cell=1, seed=s.seed, bos=bos).prompts
    elif s.task == "multikey":
        prompts = [p for n in lengths for p in multikey_task(tokenizer, length=n, keys=MULTIKEY_KEYS,
                                                             n_prompts=s.prompts, seed=s.seed + n, bos=bos).prompts]
    else:
        prompts = []
    return LongProbe(windows, s.tail, prompts, s.sink, s.recent)


def context_scores(model: HeadModel, s: ContextSettings, progress: Progress | NoProgress, quiet: bool):
    """The ctx_* scores on ``s.score_windows`` windows of the long documents' validation split."""
    from headprune.data.tokens import tokens
    from headprune.perplexity import Windowing
    from headprune.scoring import ScoringOptions, score_heads

    assert s.seq_len and s.recent
    w = Windowing.for_model(model, s.seq_len, batch_size=1)
    ids = tokens("longdocs", "validation", model, s.score_windows * w.seq_len)
    options = ScoringOptions(bootstrap=s.bootstrap, seed=s.seed, stream_sink=s.sink, stream_recent=s.recent)
    return score_heads(model, ids, list(s.methods), windowing=w, options=options, progress=progress,
                       show_progress=not quiet)


def context_stage(model: HeadModel, settings: ContextSettings = ContextSettings(),
                  progress: Progress | NoProgress | None = None, quiet: bool = False) -> ContextResult:
    """Score, measure the curve and choose the pattern (resumable through ``progress``)."""
    from headprune.context.curve import measure_point, point_key
    from headprune.patching.long_tasks import TaskResult, check_performs

    s = settings.resolve(model)
    progress = progress or NoProgress()
    probe = context_probe(model, s)
    full = progress.get_or_compute(point_key([]), lambda: measure_point(model, probe, []))
    task_note = None
    if s.task != "none":  # a task the model does not perform is left out before the sweep spends anything on it
        try:
            check_performs(TaskResult(s.task, [bool(r) for r in full["right"]]))
        except HeadpruneError as err:
            task_note = f"{err}; the curve measures the long-window NLL alone"
            probe, full = replace(probe, prompts=[]), {**full, "right": []}
    scored = context_scores(model, s, progress, quiet)
    table = scored.table
    orders = {m: streaming_order(model, dict(zip(zip(table["layer"], table["head"]), table[m]))) for m in s.methods}
    orders |= {f"random/{seed}": random_order(model, seed) for seed in range(s.random_seeds)}
    curve, points = streaming_curve(model, probe, orders, s.shares, progress, not quiet, {point_key([]): full})
    ranking, share = choose(curve, points, list(s.methods), s.tolerance)
    n_streaming = round(share * len(kv_heads(model)))
    order = orders[s.methods[0] if ranking == "none" else ranking]  # "none": no head streams within the tolerance
    pattern = KVPattern(model_fingerprint(model), s.sink, int(s.recent or 0), order, n_streaming, ranking,
                        {"tolerance": s.tolerance, "seq_len": s.seq_len})
    settings_record = asdict(s) | {"model_fingerprint": model_fingerprint(model), "n_kv_heads": len(kv_heads(model)),
                                   "n_prompts": len(probe.prompts), "task_note": task_note}
    return derive(ContextResult(table, curve, pd.DataFrame(), pd.DataFrame(), pattern, points, settings_record))


def derive(result: ContextResult) -> ContextResult:
    """``result`` with the tables computed from its measured points (the curve's ΔNLL and accuracy with
    intervals, the largest shares, the held-out choice): what ``context --render-only`` recomputes."""
    s, points = result.settings, result.points
    curve = result.curve[["ranking", "n_streaming", "share", "point",
                          *[c for c in map(str, result.curve) if c.startswith("kv_bytes_")]]]
    folds = pd.concat([cross_fit(curve, points, list(s["methods"]), tol) for tol in TOLERANCES], ignore_index=True)
    return replace(result, curve=curve_table(curve, points, s["bootstrap"], s["seed"]),
                   shares=largest_shares(curve, points, TOLERANCES, s["bootstrap"], s["seed"]), cross_fit=folds)
