"""The serving stage: the run's best ranking pruned at 0/25/50% and served where users run the model, in stock
transformers (the uniform prunes' hf exports, :mod:`headprune.pruning.serving`) and in llama.cpp (uniform and uneven
prunes as GGUF files, :mod:`headprune.pruning.serving_gguf`), measured side by side in one process.

Every export is written while the model is held; the model's weights are then freed (``model.to("meta")``) before
transformers and llama.cpp load the exports beside it, so the stage is the model's last use.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from torch import Tensor

from headprune.perplexity import Windowing


@dataclass
class ServingResult:
    """The transformers table (None for a family whose hf exports keep the original shapes: GPT-2, GPT-NeoX), the
    llama.cpp table (None where it cannot run here: ``settings["llama_cpp"]["skipped"]`` says why) and what was
    timed, for the report's settings."""

    transformers: pd.DataFrame | None = None
    llama_cpp: pd.DataFrame | None = None
    settings: dict = field(default_factory=dict)


def _best_ranking(curves: pd.DataFrame, scores: pd.DataFrame) -> str:
    """The best ranking among the curves whose method is a scores column (not the gates' head sets)."""
    from headprune.report.choice import best_method
    from headprune.schema import split_ranking

    return best_method(curves[curves["method"].map(lambda m: split_ranking(m)[0] in scores.columns)])


def serving_stage(model: Any, curves: pd.DataFrame, scores: pd.DataFrame, eval_ids: Tensor, windowing: Windowing,
                  *, free: Any = None) -> ServingResult:
    """Both serving tables of ``model`` (a :class:`~headprune.models.base.HeadModel`) pruned by the best ranking of
    ``curves``; ``free``: called after the model's weights are released (the caller returns the heap's blocks)."""
    from headprune.models.families import family_of
    from headprune.pruning.serving import SERVING_FRACTIONS, Workload, export_prunes, serve_prunes
    from headprune.pruning.serving_gguf import GgufWorkload, export_gguf_prunes, gguf_serving_blocker, serve_gguf_prunes
    from headprune.schema import split_ranking

    t0 = time.perf_counter()
    ranking = _best_ranking(curves, scores)
    method = split_ranking(ranking)[0]
    result = ServingResult()
    with tempfile.TemporaryDirectory(prefix="headprune-serving-") as tmp:
        hf = (export_prunes(model, scores, method, eval_ids, windowing, Path(tmp) / "hf")
              if family_of(model).compact_export else None)
        blocker = gguf_serving_blocker(model)
        gguf, refused = (export_gguf_prunes(model, scores, ranking, eval_ids, windowing, Path(tmp) / "gguf",
                                            fractions=SERVING_FRACTIONS) if blocker is None else ([], []))
        device = model.device
        model.to("meta")  # the run's last use of its model: its weights go before the exports are loaded beside it
        if free is not None:
            free()
        if hf is not None:
            work = Workload(batch=windowing.batch_size, seq_len=windowing.seq_len)
            result.transformers = serve_prunes(hf, work, device)
            result.settings["serving"] = {"method": method, "workload": asdict(work)}
        if gguf:
            gguf_work = GgufWorkload()
            result.llama_cpp = serve_gguf_prunes(gguf, eval_ids, windowing, gguf_work)
            result.settings["serving_llama_cpp"] = {"ranking": ranking, "uniform_method": method,
                                                    "workload": asdict(gguf_work), "refused": refused}
        elif blocker is not None and hf is not None:
            result.settings["serving_llama_cpp"] = {"skipped": blocker}
    if result.transformers is not None or result.llama_cpp is not None:
        result.settings["seconds_serving"] = round(time.perf_counter() - t0, 1)
    return result
