"""The pruning curves of ``headprune run`` on the shipped model, measured side by side: one evaluation with
glibc's default allocator settings against :func:`headprune.runtime.reuse_freed_memory` (what the CLI sets), then
the run's curves three ways: every point evaluated from the embeddings; from the unpruned model's residual stream
entering the first pruned layer; and from the deepest stream any model evaluated before shares (what headprune
does: :class:`headprune.pruning.curves.Evaluator`). Bit-identical numbers in every variant (checked); prints
seconds, layers run and ratios.

    python -m benchmarks.bench_curves [--max-tokens 4096]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import headprune.pruning.curves as curves_module
from headprune.data.tokens import corpus_ids
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import model_tokenizer
from headprune.perplexity import Windowing, evaluate
from headprune.pruning.options import CurveOptions
from headprune.runtime import reuse_freed_memory
from headprune.schema import ACTIVATION_METHODS, IMPORTANCE_METHODS, LAYER_NORMALIZED, RANDOM, WEIGHT_METHODS
from headprune.scoring import ScoringOptions, score_heads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--seeds", type=int, default=10)
    args = ap.parse_args()
    model = load_model()
    tokenizer = model_tokenizer(model)
    w = Windowing.for_model(model)
    score_ids = corpus_ids("default", "validation", tokenizer, args.max_tokens)
    eval_ids = corpus_ids("default", "test", tokenizer, args.max_tokens)

    def evaluation() -> tuple[float, float]:
        evaluate(model, eval_ids, w, progress=False)  # warm-up
        t0 = time.perf_counter()
        nll = [evaluate(model, eval_ids, w, progress=False).nll for _ in range(3)]
        return (time.perf_counter() - t0) / 3, nll[0]

    t_default, nll_default = evaluation()
    applied = reuse_freed_memory()
    t_reuse, nll_reuse = evaluation()
    assert nll_default == nll_reuse
    print(f"one evaluation of {len(eval_ids):,} tokens: glibc defaults {t_default:.3f} s, freed memory reused "
          f"{t_reuse:.3f} s ({'applied' if applied else 'not available here'}): {t_default / t_reuse:.2f}x")
    methods = [m for m in IMPORTANCE_METHODS if m in WEIGHT_METHODS + ACTIVATION_METHODS + ("grad", "taylor")]
    scores = score_heads(model, score_ids, methods, windowing=w, options=ScoringOptions(bootstrap=0),
                         show_progress=False).table
    rankings = [*methods, *(m + LAYER_NORMALIZED for m in methods if m in WEIGHT_METHODS + ACTIVATION_METHODS), RANDOM]
    variants = [(m, "none") for m in rankings]
    fractions = [round(0.1 * i, 1) for i in range(10)]

    def run(unpruned: bool, shared: bool) -> tuple[float, np.ndarray, int]:
        curves_module.CACHE_BYTES = (2 << 30) if unpruned else 0
        curves_module.PREFIX_CACHE_BYTES = (1 << 30) if shared else 0
        layers = []

        def counting(pruned, batches, start=0, streams=None, keep=None):
            layers.append(pruned.cfg.n_layers - start)
            return work(pruned, batches, start, streams, keep)

        curves_module.pruned_window_sums = counting
        t0 = time.perf_counter()
        options = CurveOptions(tuple(fractions), args.seeds, bootstrap=0, windowing=w)
        df = curves_module.pruning_curves(model, eval_ids, scores, variants, options=options, show_progress=False)
        curves_module.pruned_window_sums = work
        return time.perf_counter() - t0, df["nll"].to_numpy(), sum(layers)

    work = curves_module.pruned_window_sums
    runs = {"from the embeddings": run(False, False), "from the unpruned stream": run(True, False),
            "from the deepest stream seen": run(True, True)}
    t_full, nll_full, _ = runs["from the embeddings"]
    for _, nll, _ in runs.values():
        assert np.array_equal(nll, nll_full), "where an evaluation starts changed a value"
    points = len(variants) * len(fractions) + (args.seeds - 1) * len(fractions)
    print(f"shipped model, {len(eval_ids):,} evaluation tokens, {len(rankings) - 1} rankings + random "
          f"({args.seeds} seeds) x {len(fractions)} fractions = {points} points")
    for name, (seconds, _, layers) in runs.items():
        print(f"  {name:30s} {seconds:7.1f} s  {layers:5d} layers  {t_full / seconds:.2f}x")
    print("  values bit-identical in all three")

if __name__ == "__main__":
    main()
