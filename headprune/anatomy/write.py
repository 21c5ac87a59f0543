"""The ``anatomy`` command's folder: heads.csv, composition.csv, singular_values.csv, wo_pairs.csv,
attribution.csv, settings.json and anatomy.png (per-head maps of the role scores, DLA and copying), written
atomically (a new folder appears complete or not at all)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from headprune.anatomy import Anatomy, corpus_rows, head_anatomy, repeated_random_tokens
from headprune.data.tokens import token_digest
from headprune.io.read.fingerprint import model_fingerprint
from headprune.io.work.files import atomic_dir, write_bytes, write_json, write_table
from headprune.models.base import HeadModel
from headprune.perplexity import Windowing
from headprune.report.anatomy import plot_anatomy_summary


def write_anatomy(out: Path, anatomy: Anatomy) -> None:
    """The tables of ``anatomy`` into the folder ``out``."""
    write_table(anatomy.heads, out / "heads.csv")
    write_table(anatomy.composition, out / "composition.csv")
    write_table(anatomy.singular_values, out / "singular_values.csv")
    write_table(anatomy.pairs, out / "wo_pairs.csv")
    components = anatomy.attribution.components
    write_table(components, out / "attribution.csv")
    write_bytes(out / "anatomy.png", plot_anatomy_summary(anatomy.heads))


@dataclass(frozen=True)
class AnatomyInputs:
    """What :func:`run_anatomy` measures on: the induction probe, ``probe_count`` random sequences of
    ``probe_length`` tokens repeated twice (drawn with ``seed``), and the first ``rows`` corpus windows."""

    probe_length: int
    probe_count: int
    seed: int
    rows: int


def run_anatomy(model: HeadModel, ids: torch.Tensor, windowing: Windowing, inputs: AnatomyInputs,
                out: str | os.PathLike, settings: dict) -> tuple[Path, Anatomy]:
    """Probe, measure and write: the induction probe and ``inputs.rows`` windows of ``windowing.seq_len`` tokens of
    ``ids`` (:class:`AnatomyInputs`)."""
    probe_length, probe_count, seed, rows = inputs.probe_length, inputs.probe_count, inputs.seed, inputs.rows
    t0 = time.perf_counter()
    probe = repeated_random_tokens(model.cfg.vocab_size, probe_length, probe_count, seed, windowing.bos)
    corpus = corpus_rows(ids, windowing.seq_len, rows, windowing.bos)
    anatomy = head_anatomy(model, probe, corpus, batch_size=windowing.batch_size)
    record = settings | {"model_fingerprint": model_fingerprint(model), "tokens": token_digest(ids),
                         "probe_length": probe_length, "probe_count": probe_count, "seed": seed,
                         "corpus_rows": int(corpus.shape[0]), "corpus_row_tokens": int(corpus.shape[1]),
                         "mean_correct_logit": anatomy.attribution.logit, "seconds": round(time.perf_counter() - t0, 2)}
    with atomic_dir(out) as folder:
        write_anatomy(folder, anatomy)
        write_json(folder / "settings.json", record)
    return Path(out), anatomy
