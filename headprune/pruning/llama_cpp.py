"""A GGUF export run in llama.cpp itself (through its Python binding ``llama_cpp``, the ``gguf`` extra): its logits,
its next-token NLL on the same windows headprune scores, its prefill and decode throughput, and the KV-cache bytes
per token its per-layer head counts give.

The KV cache is kept in F32 where logits are compared (llama.cpp's default F16 cache alone moves SmolLM2's logits
by 0.02), and in llama.cpp's default F16 where it is timed, as users run it.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from headprune.errors import HeadpruneError

GGML_F32, GGML_F16 = 0, 1  # ggml_type ids of the KV cache


def require_llama_cpp() -> Any:
    """The ``llama_cpp`` module, or HeadpruneError naming the extra that installs it."""
    try:
        import llama_cpp
    except ImportError:
        raise HeadpruneError("llama.cpp's Python binding is not installed: pip install 'headprune[gguf]' (builds "
                             "llama-cpp-python from source; .ci/run gives the CMake flags)") from None
    return llama_cpp


def open_gguf(path: str | os.PathLike, n_ctx: int, *, exact: bool = True, threads: int | None = None) -> Any:
    """A ``llama_cpp.Llama`` of ``path`` keeping every position's logits; ``exact``: an F32 KV cache."""
    llama_cpp = require_llama_cpp()
    cache = GGML_F32 if exact else GGML_F16
    with open(os.devnull, "w") as null, contextlib.redirect_stderr(null):
        return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
                               n_threads=threads or os.cpu_count(), type_k=cache, type_v=cache, verbose=False)


def gguf_logits(llm: Any, ids: list[int]) -> np.ndarray:
    """[T, vocab] float32: llama.cpp's logits at every position of ``ids``, from an empty cache."""
    llm.reset()  # the next eval overwrites the cache from position 0
    llm.eval(ids)
    return np.array(llm.scores[:len(ids)], dtype=np.float32)


def gguf_nll(llm: Any, windows: list[list[int]], masks: list[list[bool]] | None = None) -> tuple[float, int]:
    """(Σ −log p(x_{t+1} | x_≤t), number of predicted tokens) over the ``windows``, each from an empty cache;
    ``masks``: per window, which of its len − 1 predictions count (default: all)."""
    total, count = 0.0, 0
    for i, ids in enumerate(windows):
        logits = gguf_logits(llm, ids).astype(np.float64)
        top = logits.max(-1, keepdims=True)
        logz = np.log(np.exp(logits - top).sum(-1)) + top[:, 0]
        nll = logz[:-1] - logits[np.arange(len(ids) - 1), np.asarray(ids[1:])]
        scored = np.ones(len(ids) - 1, bool) if masks is None else np.asarray(masks[i], bool)
        total += float(nll[scored].sum())
        count += int(scored.sum())
    return total, count


def kv_bytes_per_token(path: str | os.PathLike, bytes_per_value: int = 2) -> int:
    """Key and value bytes per cached token over every layer of a GGUF: Σ_l 2 · n_head_kv(l) · d_k ·
    ``bytes_per_value`` (llama.cpp's default F16 cache: 2)."""
    from gguf import GGUFReader

    reader = GGUFReader(Path(path))
    arch = str(reader.fields["general.architecture"].contents())

    def value(key: str) -> Any:
        field = reader.fields.get(f"{arch}.{key}")
        return None if field is None else field.contents()

    n_layers = int(value("block_count"))
    kv = value("attention.head_count_kv")
    kv = kv if isinstance(kv, list) else [int(kv if kv is not None else value("attention.head_count"))] * n_layers
    d_k = int(value("attention.key_length") or int(value("embedding_length")) // int(value("attention.head_count")))
    return sum(2 * int(n) * d_k * bytes_per_value for n in kv)


def time_gguf(path: str | os.PathLike, *, prompt: int = 256, steps: int = 32, repeats: int = 5,
              seed: int = 0) -> dict[str, list[float]]:
    """Seconds of each timed repeat (after one warm-up): ``prefill`` of ``prompt`` random tokens, and ``decode`` of
    ``steps`` single-token steps after it, with llama.cpp's default F16 KV cache."""
    llm = open_gguf(path, prompt + steps, exact=False)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, llm.n_vocab(), prompt + steps).tolist()
    out: dict[str, list[float]] = {"prefill": [], "decode": []}
    for repeat in range(repeats + 1):
        llm.reset()
        start = time.perf_counter()
        llm.eval(ids[:prompt])
        prefilled = time.perf_counter()
        for token in ids[prompt:]:
            llm.eval([token])
        done = time.perf_counter()
        if repeat:  # the first is the warm-up
            out["prefill"].append(prefilled - start)
            out["decode"].append(done - prefilled)
    return out


def median_rate(tokens: int, seconds: list[float]) -> tuple[float, float, float]:
    """(tokens / median, tokens / slowest, tokens / fastest) seconds."""
    return tokens / statistics.median(seconds), tokens / max(seconds), tokens / min(seconds)
