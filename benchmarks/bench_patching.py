"""Exact patching of every head's z: headprune's batched sweep against per-head loops (TransformerLens style).

    python -m benchmarks.bench_patching [--pairs 4 --half 8 --repeats 1] [--own-loop]

GPT-2 small architecture, random weights, induction pairs (same length). The loops run one full forward per
head on the batch of pairs, as TransformerLens's ``get_act_patch_attn_head_out_all_pos`` does: ``hf`` on
Hugging Face's GPT2LMHeadModel with a ``c_proj`` pre-hook overwriting the head's slice with the clean z;
``own_loop`` (``--own-loop``) on headprune's GPT2 with that head's gate 0 and the clean z as its per-position
fill. Each is timed ``--repeats`` times, interleaved, median kept; the first timed call's results are compared.
The sweep reruns only layers l..L−1 for a head of layer l, several patched copies a forward, and unembeds only
each pair's last position. All three agree (max difference printed); target: sweep ≥ 1.3x the HF loop.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import GPT2LMHeadModel

from benchmarks.common import gpt2_small_checkpoint
from headprune.io.read.loading import load_model
from headprune.models.hooks import Capture
from headprune.patching import patch_z
from headprune.patching.tasks import induction


@torch.no_grad()
def hf_loop(hf, pairs) -> torch.Tensor:
    """[P, H] logit differences, one HF forward per head."""
    cfg = hf.config
    dk = cfg.n_embd // cfg.n_head
    found = {}
    handles = [blk.attn.c_proj.register_forward_pre_hook(lambda m, a, l=l: found.__setitem__(l, a[0].clone()))
               for l, blk in enumerate(hf.transformer.h)]
    hf(pairs.clean)
    for h in handles:
        h.remove()
    rows = torch.arange(len(pairs))
    out = torch.empty(len(pairs), cfg.n_layer * cfg.n_head)
    for layer in range(cfg.n_layer):
        for head in range(cfg.n_head):
            cols = slice(head * dk, (head + 1) * dk)

            def hook(m, a, cols=cols, z=found[layer]):
                x = a[0].clone()
                x[:, :, cols] = z[:, :, cols]
                return (x,)
            handle = hf.transformer.h[layer].attn.c_proj.register_forward_pre_hook(hook)
            logits = hf(pairs.corrupt).logits[rows, pairs.last]
            handle.remove()
            out[:, layer * cfg.n_head + head] = logits[rows, pairs.answer] - logits[rows, pairs.wrong]
    return out


@torch.no_grad()
def ours_loop(model, pairs) -> torch.Tensor:
    """[P, H] logit differences, one full headprune forward per head (gate 0, the clean z as the fill)."""
    capture = Capture()
    model(pairs.clean, capture=capture)
    rows = torch.arange(len(pairs))
    out = []
    for layer, head in model.head_ids:
        gates, fills = model.ones_gates(), [None] * model.cfg.n_layers
        gates[layer][head] = 0
        fills[layer] = capture.z[layer]
        logits = model(pairs.corrupt, gates=gates, fills=fills)[rows, pairs.last]
        out.append(logits[rows, pairs.answer] - logits[rows, pairs.wrong])
    return torch.stack(out, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--half", type=int, default=8)
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--own-loop", action="store_true", help="also time headprune's own per-head loop")
    args = ap.parse_args()
    folder = gpt2_small_checkpoint()
    model, hf = load_model(folder), GPT2LMHeadModel.from_pretrained(folder).eval()
    pairs = induction(model.cfg.vocab_size, args.pairs, args.half, seed=0)
    fns = {"sweep": lambda: patch_z(model, pairs, rows=args.rows).values.float(), "hf_loop": lambda: hf_loop(hf, pairs)}
    if args.own_loop:
        fns["own_loop"] = lambda: ours_loop(model, pairs)
    times: dict[str, list[float]] = {name: [] for name in fns}
    first: dict[str, torch.Tensor] = {}
    for _ in range(args.repeats):  # interleaved, so machine noise hits all alike
        for name, fn in fns.items():
            t0 = time.perf_counter()
            out = fn()
            times[name].append(time.perf_counter() - t0)
            first.setdefault(name, out)
            print(f"  {name}: {times[name][-1]:.1f} s", flush=True)
    P, T = pairs.clean.shape
    print(f"GPT-2 small (random weights), {len(model.head_ids)} heads, {P} pairs x {T} tokens, "
          f"threads {torch.get_num_threads()}, median of {args.repeats}")
    median = {name: statistics.median(ts) for name, ts in times.items()}
    for name, seconds in median.items():
        diff = (first[name] - first["sweep"]).abs().max().item()
        print(f"  {name:10s} {seconds:7.2f} s" + (f"   max |diff| vs sweep {diff:.1e}" if name != "sweep" else ""))
    print(f"  speed-up: the sweep is {median['hf_loop'] / median['sweep']:.2f}x the HF per-head loop"
          + (f", {median['own_loop'] / median['sweep']:.2f}x headprune's own per-head loop" if args.own_loop else ""))


if __name__ == "__main__":
    main()
