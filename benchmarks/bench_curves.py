"""The pruning curves of ``headprune run``, before and after, on the shipped model, measured side by side:
one evaluation with glibc's default allocator settings against :func:`headprune.runtime.reuse_freed_memory`
(what the CLI sets), then the run's curves with every point evaluated from the embeddings (as before 0.14)
against evaluation from the cached residual stream at the first pruned layer. Same numbers in every variant
(checked); prints seconds and ratios.

    python -m benchmarks.bench_curves [--max-tokens 4096]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import headprune.pruning.curves as curves_module
from headprune.data.tokens import corpus_ids
from headprune.io.loading import load_model
from headprune.io.tokenizer import model_tokenizer
from headprune.perplexity import Windowing, evaluate
from headprune.pruning.options import CurveOptions
from headprune.runtime import reuse_freed_memory
from headprune.schema import ACTIVATION_METHODS, IMPORTANCE_METHODS, LAYER_NORMALIZED, RANDOM, WEIGHT_METHODS
from headprune.scoring import score_heads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--seeds", type=int, default=10)
    args = ap.parse_args()
    model = load_model()
    tokenizer = model_tokenizer(model)
    w = Windowing.resolve(model.cfg.n_positions)
    score_ids = corpus_ids("default", "validation", tokenizer, args.max_tokens)
    eval_ids = corpus_ids("default", "test", tokenizer, args.max_tokens)

    def evaluation() -> tuple[float, float]:
        evaluate(model, eval_ids, w.seq_len, w.stride, w.batch_size, progress=False)  # warm-up
        t0 = time.perf_counter()
        nll = [evaluate(model, eval_ids, w.seq_len, w.stride, w.batch_size, progress=False).nll for _ in range(3)]
        return (time.perf_counter() - t0) / 3, nll[0]

    t_default, nll_default = evaluation()
    applied = reuse_freed_memory()
    t_reuse, nll_reuse = evaluation()
    assert nll_default == nll_reuse
    print(f"one evaluation of {len(eval_ids):,} tokens: glibc defaults {t_default:.3f} s, freed memory reused "
          f"{t_reuse:.3f} s ({'applied' if applied else 'not available here'}): {t_default / t_reuse:.2f}x")
    methods = [m for m in IMPORTANCE_METHODS if m in WEIGHT_METHODS + ACTIVATION_METHODS + ("grad", "taylor")]
    scores = score_heads(model, score_ids, methods, w, show_progress=False, bootstrap=0).table
    rankings = [*methods, *(m + LAYER_NORMALIZED for m in methods if m in WEIGHT_METHODS + ACTIVATION_METHODS), RANDOM]
    variants = [(m, "none") for m in rankings]
    fractions = [round(0.1 * i, 1) for i in range(10)]

    def run(cache: bool) -> tuple[float, np.ndarray]:
        curves_module.CACHE_BYTES = (2 << 30) if cache else 0
        t0 = time.perf_counter()
        options = CurveOptions(tuple(fractions), args.seeds, bootstrap=0, windowing=w)
        df = curves_module.pruning_curves(model, eval_ids, scores, variants, options, show_progress=False)
        return time.perf_counter() - t0, df["nll"].to_numpy()

    runs = {"from the embeddings": run(False), "from the cached residual stream": run(True)}
    (t_full, nll_full), (t_cached, nll_cached) = runs.values()
    assert np.allclose(nll_full, nll_cached, rtol=0, atol=1e-9), "the cached start changed a value"
    points = len(variants) * len(fractions) + (args.seeds - 1) * len(fractions)
    print(f"shipped model, {len(eval_ids):,} evaluation tokens, {len(rankings) - 1} rankings + random "
          f"({args.seeds} seeds) x {len(fractions)} fractions = {points} points")
    for name, (seconds, _) in runs.items():
        print(f"  {name:34s} {seconds:7.1f} s")
    print(f"  speed-up of the cached start: {t_full / t_cached:.2f}x (values equal to 1e-9)")


if __name__ == "__main__":
    main()
