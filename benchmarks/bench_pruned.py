"""Speed of a physically pruned GPT-2 small (random weights) against the unpruned one.

    python -m benchmarks.bench_pruned [--batch 4 --seq 512 --repeats 5 --prune-per-layer 6 --threads N]

Prunes the same number of heads in every layer (random choice, seeded), exports the pruned model natively
and reloads it, then times on the same tokens, interleaved:
  * the whole forward of both models (the 50257-way LM head is a large, unchanged part of it);
  * the blocks alone: run_blocks(embed(tokens)), i.e. without the final norm and LM head;
  * the attention sublayers alone: Σ_l blk_l.attn(ln_1(resid_l)) on each model's own layer inputs.
Prints the attention share of forward time and how much attention time dropped (ideal: the FLOP ratio,
close to half when half the heads go).
"""

import argparse
import tempfile

import pandas as pd
import torch

from benchmarks.common import gpt2_small_checkpoint, time_interleaved
from headprune.io.read.loading import load_model
from headprune.io.write.export import export_native
from headprune.models.gpt2 import GPT2
from headprune.models.heads import format_heads
from headprune.models.hooks import Capture
from headprune.models.ledger import pruning_stats
from headprune.pruning.options import Selection
from headprune.pruning.prune import prune_model
from headprune.pruning.selection import select_heads


def attention_inputs(model: GPT2, tokens: torch.Tensor) -> list[torch.Tensor]:
    """ln_1 output entering each layer's attention: (B,T,d) per layer."""
    capture = Capture()
    model(tokens, capture=capture)
    return [blk.ln_1(capture.resid_pre[layer]) for layer, blk in enumerate(model.h)]


def attention_only(model: GPT2, xs: list[torch.Tensor]):
    return lambda: [blk.attn(x) for blk, x in zip(model.h, xs)]


def blocks_only(model: GPT2, tokens: torch.Tensor):
    return lambda: model.run_blocks(model.embed(tokens))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prune-per-layer", type=int, default=6)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    full = load_model(gpt2_small_checkpoint(), device=args.device)
    table = pd.DataFrame([{"layer": l, "head": h} for l, h in full.head_ids])
    heads = select_heads(table, "random", count=args.prune_per_layer, selection=Selection(per_layer=True, seed=0))
    with tempfile.TemporaryDirectory() as tmp:
        pruned = load_model(export_native(prune_model(full, heads), f"{tmp}/pruned"), device=args.device)
    tokens = torch.randint(0, 50257, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(args.device)
    stats = pruning_stats(full, pruned, args.seq)

    with torch.inference_mode():
        fwd = time_interleaved({"full": lambda: full(tokens), "pruned": lambda: pruned(tokens)}, args.repeats)
        body = time_interleaved({"full": blocks_only(full, tokens), "pruned": blocks_only(pruned, tokens)},
                                args.repeats)
        xs_full, xs_pruned = attention_inputs(full, tokens), attention_inputs(pruned, tokens)
        att = time_interleaved({"full": attention_only(full, xs_full), "pruned": attention_only(pruned, xs_pruned)},
                               args.repeats)

    ms = lambda s: f"{s * 1e3:7.0f} ms"
    flops_ratio = stats["attention_flops_per_token_after"] / stats["attention_flops_per_token_before"]
    print(f"GPT-2 small, random weights, {args.batch} x {args.seq} tokens, {torch.get_num_threads()} threads, "
          f"{args.device}")
    print(f"pruned {stats['heads_removed']}/{stats['heads_before']} heads ({args.prune_per_layer} per layer), "
          f"e.g. {format_heads(heads[:4])}, ...; params {stats['params_before']:,} -> {stats['params_after']:,}")
    print(f"forward          full {ms(fwd['full'])}   pruned {ms(fwd['pruned'])}   "
          f"ratio pruned/full = {fwd['pruned'] / fwd['full']:.3f}")
    print(f"blocks only      full {ms(body['full'])}   pruned {ms(body['pruned'])}   "
          f"ratio pruned/full = {body['pruned'] / body['full']:.3f}")
    print(f"attention only   full {ms(att['full'])}   pruned {ms(att['pruned'])}   "
          f"ratio pruned/full = {att['pruned'] / att['full']:.3f} (attention FLOP ratio {flops_ratio:.3f})")
    print(f"attention share of forward time: full {att['full'] / fwd['full']:.1%}, "
          f"pruned {att['pruned'] / fwd['pruned']:.1%}; of block time: full {att['full'] / body['full']:.1%}, "
          f"pruned {att['pruned'] / body['pruned']:.1%}")
    print(f"time saved: forward {fwd['full'] - fwd['pruned']:.3f} s, blocks {body['full'] - body['pruned']:.3f} s, "
          f"attention {att['full'] - att['pruned']:.3f} s")


if __name__ == "__main__":
    main()
