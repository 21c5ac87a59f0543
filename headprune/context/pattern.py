"""A streaming pattern users take away: which KV heads stream (first ``sink`` + last ``recent`` positions) and which
keep the whole context, in headprune's own file (read back by :func:`read_pattern`, e.g. ``eval --pattern``) and
in DuoAttention's format as kvpress loads it (``DuoAttentionPress(pattern_dir=...)``-style folders):

- ``config.json``: ``sink_size``, ``recent_size`` (and where the pattern came from);
- ``full_attention_heads.tsv``: n_layers rows × n_kv_heads columns of scores in [0, 1], tab-separated, 1 = needs
  full attention. kvpress streams the ⌊ratio·L·G⌉ lowest scores; DuoAttention the scores below 0.5. Both give
  this pattern's heads: the s streaming heads get 0.5·(k + ½)/s (k = their rank, least need first), the other
  n − s get 0.5 + 0.5·(k + ½)/(n − s), so the scores keep the ranking and the cut falls at 0.5.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from headprune.errors import HeadpruneError
from headprune.io.read.fingerprint import model_fingerprint
from headprune.io.work.files import atomic_dir, write_json
from headprune.models.base import HeadModel
from headprune.models.kv_cache import KVHead, kv_heads
from headprune.models.streaming import Streaming, check_streaming

FORMAT = "headprune.kv_pattern"
VERSION = 1


@dataclass(frozen=True)
class KVPattern:
    """``order``: every KV head (layer, original index), the least need first; the first ``n_streaming`` stream."""

    model_fingerprint: str
    sink: int
    recent: int
    order: list[KVHead]
    n_streaming: int
    ranking: str = ""
    notes: dict = field(default_factory=dict)

    @property
    def streaming_heads(self) -> list[KVHead]:
        return sorted(self.order[:self.n_streaming])

    def layers(self, model: HeadModel) -> dict[int, Streaming]:
        """The pattern as :func:`~headprune.models.streaming.streaming`'s layers for ``model`` (checked to be the
        model it was made for)."""
        from headprune.context.curve import streaming_layers

        check_for_model(self, model)
        return streaming_layers(model, self.streaming_heads, self.sink, self.recent)

    def full_attention_scores(self, model: HeadModel) -> np.ndarray:
        """[n_layers, n_kv_heads] DuoAttention scores (module docstring), for a model with every KV head."""
        n, s = len(self.order), self.n_streaming
        scores = np.zeros((model.cfg.n_layers, model.cfg.n_kv_heads))
        for rank, (layer, g) in enumerate(self.order):
            scores[layer, g] = 0.5 * (rank + 0.5) / s if rank < s else 0.5 + 0.5 * (rank - s + 0.5) / (n - s)
        return scores


def check_for_model(pattern: KVPattern, model: HeadModel) -> None:
    """HeadpruneError unless ``pattern`` was made for ``model`` (its fingerprint and its KV heads)."""
    if pattern.model_fingerprint != model_fingerprint(model):
        raise HeadpruneError(f"the pattern was made for another model (fingerprint {pattern.model_fingerprint}, this "
                             f"model's is {model_fingerprint(model)})", "pattern")
    if sorted(pattern.order) != kv_heads(model):
        raise HeadpruneError("the pattern does not list this model's KV heads", "pattern")


def write_pattern(pattern: KVPattern, model: HeadModel, folder: str | os.PathLike) -> list[Path]:
    """``kv_pattern.json`` (headprune's), and kvpress' ``config.json`` and ``full_attention_heads.tsv`` where the
    model keeps every KV head, into ``folder`` (written whole or not at all). Returns the files written."""
    check_for_model(pattern, model)
    complete = len(pattern.order) == model.cfg.n_layers * model.cfg.n_kv_heads
    names = ["kv_pattern.json"] + (["config.json", "full_attention_heads.tsv"] if complete else [])
    with atomic_dir(folder) as tmp:
        tmp = Path(tmp)
        record = {"format": FORMAT, "version": VERSION, **asdict(pattern)}
        record["order"] = [list(k) for k in pattern.order]
        write_json(tmp / "kv_pattern.json", record)
        if complete:
            write_json(tmp / "config.json", {"sink_size": pattern.sink, "recent_size": pattern.recent,
                                             "source": "headprune", "ranking": pattern.ranking,
                                             "streaming_share": pattern.n_streaming / len(pattern.order)})
            np.savetxt(tmp / "full_attention_heads.tsv", pattern.full_attention_scores(model), delimiter="\t",
                       fmt="%.6f")
    return [Path(folder) / n for n in names]


def read_pattern(path: str | os.PathLike) -> KVPattern:
    """The pattern of ``kv_pattern.json`` (or a folder holding it); one HeadpruneError line for a file that is not
    one."""
    path = Path(path)
    if path.is_dir():
        path = path / "kv_pattern.json"
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise HeadpruneError(f"no streaming pattern at {path}", "pattern") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HeadpruneError(f"cannot read the streaming pattern {path} ({type(err).__name__})", "pattern") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT or record.get("version") != VERSION:
        raise HeadpruneError(f"{path} is not a headprune streaming pattern (format {FORMAT}, version {VERSION})",
                             "pattern")
    try:
        order = [(int(layer), int(g)) for layer, g in record["order"]]
        pattern = KVPattern(str(record["model_fingerprint"]), int(record["sink"]), int(record["recent"]), order,
                            int(record["n_streaming"]), str(record.get("ranking", "")), dict(record.get("notes", {})))
    except (KeyError, TypeError, ValueError):
        raise HeadpruneError(f"{path} is a damaged streaming pattern (a field missing or of the wrong kind)",
                             "pattern") from None
    check_streaming(pattern.sink, pattern.recent)
    if not 0 <= pattern.n_streaming <= len(order) or len(set(order)) != len(order):
        raise HeadpruneError(f"{path}: n_streaming {pattern.n_streaming} or its KV heads are inconsistent", "pattern")
    return pattern
