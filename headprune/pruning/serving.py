"""How pruned exports serve in stock transformers: prefill and decode throughput and KV-cache bytes beside the
pruned model's perplexity (``headprune run`` on a non-GPT-2 model; ``benchmarks/bench_families.py``).

For each asked fraction f: the uniform prune nearest f by a ranking (:func:`~.uniform.uniform_heads`: the same
query and KV heads in every layer, so the hf export is compact wherever the family's config accepts the count),
written by ``export_hf`` and loaded by ``AutoModelForCausalLM.from_pretrained`` (its default attention, sdpa):

    prefill_tokens_per_s         B·T tokens / median seconds of a forward filling the KV cache (only the last logits)
    decode_b{b}_tokens_per_s     b / median seconds of one cached decoding step (``steps`` after a short prompt)
    RATE_min, RATE_max           the spread of each rate above: tokens / the slowest and the fastest timed repeat
    kv_bytes_per_token           the cache's key and value bytes over every layer, per token held
    max_abs_logit_diff           transformers' logits against headprune's pruned model on the same tokens
    ppl                          headprune's perplexity of the pruned model on the evaluation data

Times are wall-clock on this machine in this process: compare rows of one table, not tables of two machines.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from headprune.perplexity import Windowing, evaluate

SERVING_FRACTIONS = (0.0, 0.25, 0.5)
RATES = ("prefill_tokens_per_s", "decode_b1_tokens_per_s", "decode_b32_tokens_per_s")
SERVING_COLUMNS = ("fraction", "removed", "query_heads", "kv_heads", "layout", "parameters", "ppl", *RATES,
                   "kv_bytes_per_token", "max_abs_logit_diff", *(f"{r}_{end}" for r in RATES for end in ("min", "max")))


def rate_spread(name: str, tokens: int, seconds: list[float]) -> dict[str, float]:
    """``name``: tokens / the median of ``seconds``; ``name_min`` / ``name_max``: tokens / the slowest / fastest."""
    return {name: tokens / statistics.median(seconds), f"{name}_min": tokens / max(seconds),
            f"{name}_max": tokens / min(seconds)}


@dataclass(frozen=True)
class Workload:
    """What is timed: a prefill of ``batch`` × ``seq_len`` tokens (the median of ``prefills``); ``steps`` decoding
    steps at each batch size in ``decode_batches`` after a ``prompt``-token prompt."""

    batch: int = 8
    seq_len: int = 512
    steps: int = 16
    prompt: int = 16
    decode_batches: tuple[int, ...] = (1, 32)
    prefills: int = 5  # the median of several: one sample on a shared machine varied 7-25x
    seed: int = 0


@torch.no_grad()
def measure_serving(folder: str | Path, work: Workload = Workload(), check: dict | None = None,
                    device: str | torch.device = "cpu") -> dict:
    """Load ``folder`` in stock transformers on ``device`` and time ``work`` on random tokens (see the module
    docstring). ``check``: {"tokens": (B,T), "logits": (B,T,V)} of headprune's model, compared with transformers'."""
    import inspect

    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # transformers' "Loading weights" bar, once per export
    try:
        hf: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    hf = hf.to(device).eval()
    # the KV cache's argument and output field: ``cache`` in transformers 5.2x, ``past_key_values`` before
    cache = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    cfg = hf.config
    gen = torch.Generator().manual_seed(work.seed)
    tokens = lambda *shape: torch.randint(0, cfg.vocab_size, shape, generator=gen).to(device)
    result: dict = {"query_heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
                    "parameters": sum(p.numel() for p in hf.parameters())}
    if check is not None:
        logits = hf(check["tokens"].to(device)).logits.float().cpu()
        result["max_abs_logit_diff"] = float((logits - check["logits"]).abs().max())
    hf(tokens(1, min(32, work.seq_len)), logits_to_keep=1)  # warm-up
    x = tokens(work.batch, work.seq_len)
    seconds = []
    for _ in range(work.prefills):
        t0 = time.perf_counter()
        hf(x, use_cache=True, logits_to_keep=1)
        seconds.append(time.perf_counter() - t0)
    result |= rate_spread("prefill_tokens_per_s", x.numel(), seconds)
    for b in work.decode_batches:
        out = hf(tokens(b, work.prompt), use_cache=True, logits_to_keep=1)
        past, seconds = getattr(out, cache), []
        for _ in range(work.steps):
            nxt = out.logits[:, -1:].argmax(-1)
            t0 = time.perf_counter()
            out = hf(nxt, use_cache=True, **{cache: past})
            seconds.append(time.perf_counter() - t0)
            past = getattr(out, cache)
        result |= rate_spread(f"decode_b{b}_tokens_per_s", b, seconds)
        held = b * (work.prompt + work.steps)
        result["kv_bytes_per_token"] = sum(t.nbytes for layer in past.layers for t in (layer.keys, layer.values)) / held
    return result


@dataclass(frozen=True)
class ServedPrune:
    """headprune's side of one served prune: the heads it removed, its hf export, its perplexity, and its logits
    on the check tokens (``{"tokens": (B,T), "logits": (B,T,V)}``) that transformers' are compared with."""

    removed: int
    layout: str  # "compact", or "zeroed" where the family's config cannot take the pruned head counts
    ppl: float
    folder: Path
    check: dict


def export_prunes(model: Any, scores: pd.DataFrame, method: str, eval_ids: Tensor, windowing: Windowing,
                  folder: Path, fractions: tuple[float, ...] = SERVING_FRACTIONS, seed: int = 0
                  ) -> dict[float, ServedPrune]:
    """For each fraction, the uniform prune by ``method`` nearest it, exported under ``folder`` and evaluated by
    headprune; fractions whose nearest prune is the same share one export. ``model``: a
    :class:`~headprune.models.base.HeadModel` of a Llama-like family (left unchanged)."""
    from headprune.io.write.export import export_hf, is_compact
    from headprune.models.prune import prune_heads
    from headprune.pruning.uniform import uniform_heads

    check_tokens = torch.randint(0, model.cfg.vocab_size, (2, min(32, model.cfg.n_positions)),
                                 generator=torch.Generator().manual_seed(seed))
    prunes: dict[float, ServedPrune] = {}
    by_heads: dict[frozenset, ServedPrune] = {}
    for fraction in fractions:
        heads = uniform_heads(model, scores, method, fraction) if fraction > 0 else []
        key = frozenset(heads)
        if key not in by_heads:
            # the pruned model shares the tensors pruning leaves unchanged (embeddings, MLPs) with ``model``
            pruned: Any = prune_heads(model, heads, share=True) if heads else model
            with torch.no_grad():
                logits = pruned(check_tokens.to(model.device)).float().cpu()
            by_heads[key] = ServedPrune(
                removed=len(heads), layout="compact" if is_compact(pruned) or not heads else "zeroed",
                ppl=evaluate(pruned, eval_ids, windowing, progress=False).ppl,
                folder=export_hf(pruned, folder / f"f{fraction}", overwrite=True),
                check={"tokens": check_tokens, "logits": logits})
            del pruned
        prunes[fraction] = by_heads[key]
    return prunes


def serve_prunes(prunes: dict[float, ServedPrune], work: Workload = Workload(),
                 device: str | torch.device = "cpu") -> pd.DataFrame:
    """One row per fraction (:data:`SERVING_COLUMNS`): :func:`measure_serving` of its export (each export once),
    beside headprune's perplexity of the prune."""
    measured: dict[Path, dict] = {}
    rows = []
    for fraction, prune in prunes.items():
        if prune.folder not in measured:
            measured[prune.folder] = measure_serving(prune.folder, work, prune.check, device)
        rows.append({"fraction": fraction, "removed": prune.removed, "ppl": prune.ppl, "layout": prune.layout,
                     **measured[prune.folder]})
    return pd.DataFrame(rows, columns=list(SERVING_COLUMNS))


def serving_table(model: Any, scores: pd.DataFrame, method: str, eval_ids: Tensor, windowing: Windowing,
                  fractions: tuple[float, ...] = SERVING_FRACTIONS, work: Workload = Workload()) -> pd.DataFrame:
    """One row per fraction (:data:`SERVING_COLUMNS`): the uniform prune by ``method`` nearest it, exported and
    served in stock transformers, with headprune's perplexity of it on ``eval_ids`` (each distinct prune once):
    :func:`export_prunes`, then :func:`serve_prunes`. ``model``: a :class:`~headprune.models.base.HeadModel` of a
    Llama-like family."""
    with tempfile.TemporaryDirectory(prefix="headprune-serving-") as tmp:
        prunes = export_prunes(model, scores, method, eval_ids, windowing, Path(tmp), fractions, work.seed)
        return serve_prunes(prunes, work, model.device)
