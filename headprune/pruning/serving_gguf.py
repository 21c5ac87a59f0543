"""How pruned exports serve in llama.cpp (the ``gguf`` extra): the run's prunes written as GGUF files at the default
tensor type and run by llama.cpp itself, beside the transformers table of :mod:`.serving` (measured in the same run).

For each asked fraction f > 0, two prunes by the run's best ranking: **uniform**, the nearest prune with the same
query and KV heads in every layer (:func:`~.uniform.uniform_heads`, the same one the transformers table serves: a
file of the source architecture), and **uneven**, the ranking's own k = round(f·N) heads (a ``deci`` file with
per-layer head counts, :mod:`headprune.io.write.gguf_layout`); at f = 0 the unpruned model. Per row:

    file_bytes                 the .gguf's size (matrices in ``gguf_type``, norms in f32)
    kv_bytes_per_token         Σ_l 2 · n_head_kv(l) · d_k · 2: llama.cpp's default f16 KV cache, per token held
    padded_heads               zero-weight query heads that complete uneven KV groups (query compute, no cache)
    ppl                        llama.cpp's perplexity on the run's evaluation windows (the tokens headprune scores)
    headprune_ppl              headprune's (float32) perplexity of the same prune on the same tokens
    prefill_tokens_per_s       ``prompt`` random tokens / the median seconds of the timed repeats (after a warm-up)
    decode_tokens_per_s        ``steps`` single-token steps after that prompt / their median seconds
    RATE_min, RATE_max         the rate of the slowest and of the fastest repeat (the spread)

llama.cpp runs one sequence at a time on every core; times are wall-clock on this machine: compare rows of one table.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from torch import Tensor

from headprune.errors import HeadpruneError
from headprune.perplexity import Windowing, evaluate

GGUF_RATES = ("prefill_tokens_per_s", "decode_tokens_per_s")
GGUF_SERVING_COLUMNS = ("fraction", "shape", "removed", "query_heads", "arch", "padded_heads", "gguf_type",
                        "file_bytes", "kv_bytes_per_token", "ppl", "headprune_ppl", *GGUF_RATES,
                        *(f"{r}_{end}" for r in GGUF_RATES for end in ("min", "max")))


@dataclass(frozen=True)
class GgufWorkload:
    """What llama.cpp is timed on: a prefill of ``prompt`` random tokens then ``steps`` single-token decoding steps,
    ``repeats`` times after one untimed warm-up, with llama.cpp's default f16 KV cache."""

    prompt: int = 512
    steps: int = 32
    repeats: int = 5
    seed: int = 0


@dataclass(frozen=True)
class GgufPrune:
    """One prune written as a GGUF file, with headprune's perplexity of it."""

    fraction: float
    shape: str  # "unpruned", "uniform" or "uneven"
    removed: int
    query_heads: int
    arch: str
    padded_heads: int
    path: Path
    headprune_ppl: float


def gguf_serving_blocker(model: Any) -> str | None:
    """Why ``model``'s prunes cannot be served in llama.cpp here (no binding, no GGUF form, no llama.cpp tokenizer),
    or None."""
    from headprune.io.write.gguf import source_gguf
    from headprune.models.families import family_of, model_type
    from headprune.pruning.llama_cpp import require_llama_cpp

    if family_of(model).gguf is None:
        return f"{model_type(model)} has no GGUF form"
    try:
        require_llama_cpp()
        source_gguf(model)
    except HeadpruneError as err:
        return str(err)
    return None


def export_gguf_prunes(model: Any, scores: pd.DataFrame, ranking: str, eval_ids: Tensor, windowing: Windowing,
                       folder: Path, *, fractions: tuple[float, ...], gguf_type: str | None = None
                       ) -> tuple[list[GgufPrune], list[str]]:
    """(the prunes written as GGUF files under ``folder``, the shapes llama.cpp cannot run and why): for each
    fraction the uniform prune by ``ranking``'s score and the uneven prune by ``ranking`` (module docstring);
    ``model`` (a :class:`~headprune.models.base.HeadModel` read from a GGUF file) is left unchanged."""
    from headprune.io.write.gguf import export_gguf, gguf_plan
    from headprune.io.write.gguf_types import DEFAULT_GGUF_TYPE
    from headprune.models.prune import prune_heads
    from headprune.pruning.selection import ranking_heads
    from headprune.pruning.uniform import uniform_heads
    from headprune.schema import split_ranking

    gguf_type = gguf_type or DEFAULT_GGUF_TYPE
    shapes: list[tuple[float, str, list]] = [(0.0, "unpruned", [])]
    for f in (f for f in fractions if f > 0):
        shapes += [(f, "uniform", uniform_heads(model, scores, split_ranking(ranking)[0], f)),
                   (f, "uneven", ranking_heads(scores, ranking, f))]
    prunes: list[GgufPrune] = []
    refused: dict[str, list[str]] = {}  # why -> the prunes refused for it
    for fraction, shape, heads in shapes:
        pruned: Any = prune_heads(model, heads, share=True) if heads else model
        try:
            plan = gguf_plan(pruned)
        except HeadpruneError as err:
            refused.setdefault(str(err), []).append(f"{shape} at {fraction:.0%}")
            continue
        path = export_gguf(pruned, folder / f"{shape}-{fraction}.gguf", gguf_type=gguf_type)
        ppl = evaluate(pruned, eval_ids, windowing, progress=False).ppl
        prunes.append(GgufPrune(fraction, shape, len(heads), len(pruned.head_ids), plan.arch, plan.padded, path,
                                ppl))
        del pruned
    return prunes, [f"{' and '.join(which)}: {why}" for why, which in refused.items()]


def gguf_perplexity(path: str | os.PathLike, eval_ids: Tensor, windowing: Windowing) -> float:
    """llama.cpp's perplexity of the GGUF ``path`` on ``windowing``'s windows of ``eval_ids``: exp of the mean NLL
    over exactly the tokens :func:`headprune.perplexity.evaluate` scores (the same windows, BOS and masks)."""
    from headprune.pruning.llama_cpp import gguf_nll, open_gguf

    llm = open_gguf(path, windowing.seq_len + (windowing.bos is not None))
    total, count = 0.0, 0
    for batch in windowing.batches(eval_ids):
        for tokens, mask in zip(batch.tokens.tolist(), batch.mask.tolist(), strict=True):
            nll, scored = gguf_nll(llm, [tokens], masks=[mask])
            total, count = total + nll, count + scored
    if not count:
        raise HeadpruneError("no evaluation tokens to measure llama.cpp's perplexity on")
    return math.exp(total / count)


def serve_gguf_prunes(prunes: list[GgufPrune], eval_ids: Tensor, windowing: Windowing,
                      work: GgufWorkload = GgufWorkload(), gguf_type: str | None = None) -> pd.DataFrame:
    """One row per prune (:data:`GGUF_SERVING_COLUMNS`): the file's size and KV bytes, llama.cpp's perplexity on
    the evaluation windows, and its prefill and decode rates on ``work``."""
    from headprune.io.write.gguf_types import DEFAULT_GGUF_TYPE
    from headprune.pruning.llama_cpp import kv_bytes_per_token, time_gguf
    from headprune.pruning.serving import rate_spread

    rows = []
    for p in prunes:
        times = time_gguf(p.path, prompt=work.prompt, steps=work.steps, repeats=work.repeats, seed=work.seed)
        rows.append({"fraction": p.fraction, "shape": p.shape, "removed": p.removed, "query_heads": p.query_heads,
                     "arch": p.arch, "padded_heads": p.padded_heads, "gguf_type": gguf_type or DEFAULT_GGUF_TYPE,
                     "file_bytes": p.path.stat().st_size, "kv_bytes_per_token": kv_bytes_per_token(p.path),
                     "ppl": gguf_perplexity(p.path, eval_ids, windowing), "headprune_ppl": p.headprune_ppl,
                     **rate_spread("prefill_tokens_per_s", work.prompt, times["prefill"]),
                     **rate_spread("decode_tokens_per_s", work.steps, times["decode"])})
    return pd.DataFrame(rows, columns=list(GGUF_SERVING_COLUMNS))
