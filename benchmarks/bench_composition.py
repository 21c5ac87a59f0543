"""Composition scores from d_k×d_k cores against the dense d×d products, GPT-2-small and GPT-2-XL architectures,
random weights (only the attention weights are built, as tensors: no 1.5B-parameter model).

    python -m benchmarks.bench_composition [--arch small|xl|both] [--dense-pairs 12] [--device cpu] [--layers N]

The cores compute every pair; the dense products (‖W_OV^a W^b‖_F with the d×d matrices, as TransformerLens's
definition reads) are timed on a sample of pairs, checked against the cores there, and extrapolated to all pairs.
"""

import argparse
import resource
import time

import torch

from headprune.anatomy.composition import MODES, HeadWeights, composition_from_weights

ARCHS = {"small": (12, 12, 768), "xl": (48, 25, 1600)}  # layers, heads, d_model; d_head = 64


def random_weights(n_layers: int, n_heads: int, d_model: int, seed: int = 0) -> dict[int, HeadWeights]:
    g = torch.Generator().manual_seed(seed)
    k = d_model // n_heads

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.02

    return {layer: HeadWeights(w(n_heads, d_model, k), w(n_heads, d_model, k), w(n_heads, d_model, k),
                               w(n_heads, k, d_model), list(range(n_heads))) for layer in range(n_layers)}


def dense_pair(w: dict[int, HeadWeights], la: int, ha: int, lb: int, hb: int) -> list[float]:
    a, b = w[la], w[lb]
    ov_a = a.W_V[ha] @ a.W_O[ha]  # [d, d]
    qk_b = b.W_Q[hb] @ b.W_K[hb].T
    ov_b = b.W_V[hb] @ b.W_O[hb]
    return [float(torch.linalg.norm(ov_a @ m) / (torch.linalg.norm(ov_a) * torch.linalg.norm(m)))
            for m in (qk_b, qk_b.T, ov_b)]


def bench(arch: str, dense_pairs: int, device: str, layers: int | None = None) -> None:
    n_layers, n_heads, d = ARCHS[arch]
    n_layers = layers or n_layers
    weights = random_weights(n_layers, n_heads, d)
    t0 = time.perf_counter()
    table = composition_from_weights(weights, torch.float32, device)
    t_cores = time.perf_counter() - t0
    sample = table.sample(dense_pairs, random_state=0)
    t0 = time.perf_counter()
    dense = [dense_pair(weights, r.layer_a, r.head_a, r.layer_b, r.head_b) for r in sample.itertuples()]
    t_dense = (time.perf_counter() - t0) / dense_pairs * len(table)
    diff = (torch.tensor(dense, dtype=torch.float64) - torch.tensor(sample[list(MODES)].to_numpy())).abs().max()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"{arch}: {n_layers} layers x {n_heads} heads, d {d}: {len(table):,} pairs x 3 modes, "
          f"{torch.get_num_threads()} threads, {device}")
    print(f"  cores (all pairs): {t_cores:.1f} s   dense d x d (extrapolated from {dense_pairs} pairs): "
          f"{t_dense:,.0f} s   ratio dense/cores = {t_dense / t_cores:,.0f}")
    print(f"  max |cores - dense| on the sample: {diff:.1e}   peak RSS so far {rss:.2f} GB")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", choices=[*ARCHS, "both"], default="both")
    ap.add_argument("--dense-pairs", type=int, default=12)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--layers", type=int, default=None, help="only the first N layers (default: all)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for arch in ARCHS if args.arch == "both" else [args.arch]:
        bench(arch, args.dense_pairs, args.device, args.layers)


if __name__ == "__main__":
    main()
