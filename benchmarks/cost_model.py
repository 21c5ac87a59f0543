"""A cost model of every scoring method for GPT-2 small/medium/large/XL, checked against measurements.

    python -m benchmarks.cost_model [--tokens 100000] [--measured reports/bench_xl.json]

Counts FLOPs per token of one forward, F = L·c + u, with c = 24·d² + 4·T·d per block (Q/K/V/O and MLP weights,
then QKᵀ and A·V over a window of T tokens) and u = 2·d·V for the LM head; expresses each method in
forward-equivalents (fe) on N tokens; and converts to time with a FLOP rate: this CPU's, measured (the GPT-2 XL
forward of ``bench_xl``, in FLOPs per CPU-second, and the 2-core wall-clock rate of ``bench_forward``), and one
modern GPU's, *stated* from its datasheet at an assumed utilisation (not measured: no GPU was lent).

Forward-equivalents on N tokens:

  weights  wo_fro, wo_spec, ov_fro, ov_spec         W / (N·F): per parameter, not per token: a QR and an SVD
                                                       per head, measured as seconds (WEIGHT_NORM_CPU_S), free
                                                       on 100,000 tokens (≤ 0.01 fe) but 1.0 fe on 512 at XL
  data     out_norm, fluct, entropy                 1 (one shared forward that captures z)
  grads    grad, taylor                             2 (a forward and a backward to the gates and activations,
                                                       no weight gradients; measured 2.07 on GPT-2 small)
  abl_*    each of abl_zero, abl_mean               A = Σ_l h·((L−l)·c + u) / F  (+1 baseline forward,
           (and the opt-in abl_zero_folded)            shared): a head of layer l reruns layers l..L−1 and the
                                                       LM head from the cached residual stream
  curves   one point (method × fraction)            ≤ 1 (a forward of the pruned model)

With k processes every family's units are shared (the ablation's by cost,
:func:`headprune.io.work.distributed.assign_units`), and each process also runs the cached forward of every batch it
touches: t_k ≈ t_1/k + one forward (+ the load).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from headprune.cost import duration

ARCHS = {"small": (12, 12, 768), "medium": (24, 16, 1024), "large": (36, 20, 1280), "xl": (48, 25, 1600)}
V, T = 50257, 1024
#: H100 SXM datasheet dense bf16 tensor-core peak (FLOP/s) and the utilisation we assume: stated, not measured.
GPU_PEAK, GPU_UTIL = 989e12, 0.4
#: bench_forward (reports/benchmarks.md): GPT-2 small, 4 × 512 tokens, 3.616 s wall on 2 threads.
SMALL_FORWARD = (4 * 512, 512, 3.616)
#: The four weight norms of one layer at XL width (25 heads × 1600, d_k 64), CPU-seconds, profiled on the idle
#: machine (reports/benchmarks.md: 3.3 CPU-s for 6 layers); the QR and SVD per head cost ∝ d·d_k², d_k = 64 in
#: every GPT-2, so a layer of h heads of width d costs this × (h/25)·(d/1600).
WEIGHT_NORM_CPU_S = 3.3 / 6


def block_flops(d: int, t: int) -> float:
    return 24 * d * d + 4 * t * d


def forward_flops(arch: str, t: int = T) -> float:
    """FLOPs per token of one forward (F = L·c + u)."""
    L, _, d = ARCHS[arch]
    return L * block_flops(d, t) + 2 * d * V


def ablation_fe(arch: str, t: int = T, layers: list[int] | None = None) -> float:
    """Forward-equivalents of one ablation method's sweep (all layers, or only ``layers``)."""
    L, h, d = ARCHS[arch]
    c, u = block_flops(d, t), 2 * d * V
    return sum(h * ((L - l) * c + u) for l in (range(L) if layers is None else layers)) / forward_flops(arch, t)


def weight_norm_cpu_s(arch: str) -> float:
    """CPU-seconds of the four weight norms of every head (independent of the tokens)."""
    L, h, d = ARCHS[arch]
    return L * WEIGHT_NORM_CPU_S * (h / 25) * (d / 1600)


def method_fe(arch: str, weights_fe: float = 0.0) -> dict[str, float]:
    """Forward-equivalents per family; ``weights_fe``: the weight norms' seconds in forwards of the tokens scored.
    "all": the 11 methods of ``--methods all`` (two ablation sweeps: abl_zero, abl_mean)."""
    a = ablation_fe(arch)
    return {"weights (4)": weights_fe, "data (3)": 1.0, "grad+taylor": 2.0, "one abl_*": a,
            "all": weights_fe + 1 + 2 + 1 + 2 * a}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=100_000)
    p.add_argument("--measured", type=Path, default=Path("reports/bench_xl.json"))
    p.add_argument("--processes", type=int, default=8)
    args = p.parse_args()
    n, k = args.tokens, args.processes
    m = json.loads(args.measured.read_text())

    # this CPU: FLOPs per CPU-second from the XL forward (512 tokens, one window), and the 2-core wall rate
    xl_fwd = json.loads(m["ablate layer 47 (abl_zero)"]["stdout"])
    cpu_rate = forward_flops("xl", 512) * 512 / xl_fwd["forward_cpu_s"]
    tokens, t, secs = SMALL_FORWARD
    wall_rate = forward_flops("small", t) * tokens / secs
    gpu_rate = GPU_PEAK * GPU_UTIL
    print(f"CPU: {cpu_rate / 1e9:.0f} GFLOP per CPU-second (XL forward), {wall_rate / 1e9:.0f} GFLOP/s wall on 2 "
          f"cores (GPT-2 small forward); GPU (stated): {gpu_rate / 1e12:.0f} TFLOP/s\n")

    def weights_fe(arch: str, tokens: int) -> float:  # the weight norms' CPU-seconds in forwards of ``tokens``
        return weight_norm_cpu_s(arch) * cpu_rate / (tokens * forward_flops(arch))

    print(f"| model | F (GFLOP/token) | abl_* fe | `all` (11 methods) fe | `all` on {n:,} tokens: CPU 2 cores | "
          f"same, {k} CPU processes (2 cores each) | same, 1 GPU (stated) |")
    print("|---|---|---|---|---|---|---|")
    for arch in ARCHS:
        fe = method_fe(arch, weights_fe(arch, n))
        work = fe["all"] * n * forward_flops(arch)
        a = fe["one abl_*"]
        shared = (fe["all"] / k + 1) / fe["all"]  # every family's units shared; + one cached forward each
        print(f"| {arch} | {forward_flops(arch) / 1e9:.2f} | {a:.1f} | {fe['all']:.1f} | "
              f"{duration(work / wall_rate)} | {duration(work * shared / wall_rate)} | {duration(work / gpu_rate)} |")

    print("\nPer method (forward-equivalents on N tokens; seconds on 100,000 tokens, CPU 2 cores / GPU stated):\n")
    print("| model | weights | data | grad+taylor | one abl_* |")
    print("|---|---|---|---|---|")
    for arch in ARCHS:
        f = n * forward_flops(arch)
        fe = method_fe(arch, weights_fe(arch, n))
        cells = [f"{fe[c]:.3g} fe, {duration(fe[c] * f / wall_rate)} / {duration(fe[c] * f / gpu_rate)}"
                 for c in ("weights (4)", "data (3)", "grad+taylor", "one abl_*")]
        print(f"| {arch} | " + " | ".join(cells) + " |")

    print("\nChecked against the GPT-2 XL measurements (512 tokens, one window; CPU-seconds):\n")
    print("| measurement | predicted fe | predicted CPU-s | measured CPU-s | ratio |")
    print("|---|---|---|---|---|")
    per_fe = forward_flops("xl", 512) * 512 / cpu_rate
    load = json.loads(m["load fp32"]["stdout"])["load_cpu_s"]
    checks = [
        ("forward (cache_batch): calibrates the rate", 1.0, xl_fwd["forward_cpu_s"]),
        ("ablation of layer 47, 25 heads (ablate_layer)", ablation_fe("xl", 512, [47]), xl_fwd["ablate_cpu_s"]),
        ("`eval --max-tokens 512` minus the load", 1.0, m["eval --max-tokens 512"]["cpu_seconds"] - load),
        ("`score wo_fro,ov_fro,fluct,grad` minus the load (weight norms + fluct 1 + grad 2)",
         weights_fe("xl", 512) + 3.0,
         m["score wo_fro,ov_fro,fluct,grad"]["cpu_seconds"] - load),
    ]
    if "ablate layer 0 (abl_zero)" in m:
        abl0 = json.loads(m["ablate layer 0 (abl_zero)"]["stdout"])
        checks.append(("ablation of layer 0, 25 heads", ablation_fe("xl", 512, [0]), abl0["ablate_cpu_s"]))
    for name, fe, measured in checks:
        print(f"| {name} | {fe:.2f} | {fe * per_fe:.0f} | {measured:.0f} | {measured / (fe * per_fe):.2f} |")


if __name__ == "__main__":
    main()
