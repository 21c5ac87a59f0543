"""Optimal ablation's cost on the shipped model, against mean ablation, in forward-equivalents and seconds.

    python -m benchmarks.bench_optimal [--max-tokens 2048] [--steps 16]

On the scoring split (the validation split of the default corpus), timed one after the other on the same data:
a plain forward over the windows (the unit: one forward-equivalent), the abl_mean sweep (every head), the fit
of every head's optimal constant (:mod:`headprune.scoring.optimal`, ``--steps`` BFGS passes per layer), and the
abl_opt evaluation (the same sweep as abl_mean, with the fitted constants). The optimal-compensated curve of
`headprune run` adds one pruned-model evaluation per fraction > 0 (at most one forward-equivalent of the
evaluation split each; :data:`DEFAULT_FRACTIONS` has 9). Cost grows linearly with the tokens, so the seconds
`headprune run` would add at its 8,192 scoring tokens are the forward-equivalents times its forward time.
"""

from __future__ import annotations

import argparse
import time

import torch

from headprune.data.tokens import corpus_ids
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import model_tokenizer
from headprune.perplexity import Windowing, evaluate
from headprune.schema import DEFAULT_FRACTIONS, DEFAULT_MODEL
from headprune.scoring import score_heads
from headprune.scoring.ablation import AblationScores
from headprune.scoring.base import ScoringContext
from headprune.scoring.optimal import STEPS, OptimalFit


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--run-tokens", type=int, default=8192, help="scoring tokens of the run to extrapolate to")
    args = ap.parse_args()
    model = load_model(args.model, device="cpu")
    ids = corpus_ids("default", "validation", model_tokenizer(model), args.max_tokens)
    w = Windowing.for_model(model)
    print(f"{args.model}: {len(model.head_ids)} heads, {len(ids):,} scoring tokens, {args.steps} BFGS passes, "
          f"{torch.get_num_threads()} threads")
    evaluate(model, ids, w, progress=False)  # warm-up
    _, t_fwd = _timed(lambda: evaluate(model, ids, w, progress=False))
    means = score_heads(model, ids, "abl_mean", windowing=w, show_progress=False)  # mean_z (and abl_mean) once
    ctx = ScoringContext(model, w.batches(ids), ["abl_mean", "abl_opt"], 8, optimal_steps=args.steps)
    ctx.side.mean_z = torch.stack([means.means[h] for h in model.head_ids]).double()
    fit = OptimalFit()
    results, t_fit = _timed(lambda: {k: fn() for k, fn in fit.units(ctx)})
    ctx.side.update(fit.combine(ctx, results).side)
    ablation = AblationScores()
    units = dict(ablation.units(ctx))

    def sweep(method: str) -> dict:
        return {k: fn() for k, fn in units.items() if k.startswith((f"{method}/", "base/"))}

    mean_results, t_mean = _timed(lambda: sweep("abl_mean"))
    opt_results, t_opt = _timed(lambda: sweep("abl_opt"))
    scores = ablation.combine(ctx, mean_results | opt_results).scores
    gain = scores["abl_mean"] - scores["abl_opt"]
    fe = lambda t: t / t_fwd
    print(f"forward over the scoring windows: {t_fwd:.2f} s (= 1 forward-equivalent)")
    print(f"abl_mean sweep: {t_mean:.1f} s = {fe(t_mean):.1f} forward-equivalents")
    print(f"optimal fit ({args.steps} passes): {t_fit:.1f} s = {fe(t_fit):.1f} forward-equivalents "
          f"= {t_fit / t_mean:.1f} abl_mean sweeps ({fe(t_fit) / (args.steps + 1):.1f} per pass)")
    print(f"abl_opt evaluation: {t_opt:.1f} s = {fe(t_opt):.1f} forward-equivalents")
    print(f"abl_mean - abl_opt over heads: min {gain.min():.2e}, median {gain.median():.2e}, max {gain.max():.2e} "
          "nats/token (on the fit data)")
    curve_fe = sum(1 for f in DEFAULT_FRACTIONS if f > 0)
    scale = args.run_tokens / len(ids)
    total = (t_fit + t_opt) * scale + curve_fe * t_fwd * scale
    print(f"headprune run at {args.run_tokens:,} tokens per split would add about {(t_fit + t_opt) * scale:.0f} s "
          f"(fit and abl_opt) + at most {curve_fe * t_fwd * scale:.0f} s (optimal curve, {curve_fe} evaluations) "
          f"= {total:.0f} s on this machine")


if __name__ == "__main__":
    main()
