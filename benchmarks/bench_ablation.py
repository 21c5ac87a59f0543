"""Zero-ablation of every head: headprune's cached, batched sweep against the naive loop and TransformerLens.

    python -m benchmarks.bench_ablation [--batch 4 --seq 256] [--tl] [--arch gpt2-small | smollm-135m]

GPT-2 small architecture (or ``--arch smollm-135m``: SmolLM-135M's Llama layout, 30 layers of 9 query / 3 KV heads
of 64, d 576, SwiGLU 1536, vocab 49152, tied), random weights, the same tokens for all. The naive loop runs one
full gated forward per head; TransformerLens (``--tl``; needs ``pip install "transformer-lens<4" torch==2.13.0``)
zeroes ``hook_z`` of one head per ``run_with_hooks`` call, with ``fold_value_biases`` off so the head's
value-bias share is removed as our gate removes it.

The exact sweep of a head of layer l must recompute layers l..L−1 and the LM head. With per-layer cost c
and LM-head cost u (in forward units f = embed + L·c + u), the sweep needs Σ_l h·((L−l)·c + u) of the naive
loop's h·L·f; the printed bound is that ratio, measured c and u taken from the model's FLOPs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import gpt2_small_checkpoint
from headprune.io.read.loading import load_model
from headprune.models.llama import LlamaLikeConfig
from headprune.perplexity import Windowing, evaluate, window_batches
from headprune.scoring import score_heads


def naive_loop(model, ids, seq_len, batch_size):
    windows = Windowing(seq_len, seq_len, batch_size)
    base = evaluate(model, ids, windows, progress=False).nll
    out = []
    for layer, head in model.head_ids:
        gates = model.ones_gates()
        gates[layer][head] = 0
        out.append(evaluate(model, ids, windows, progress=False, gates=gates).nll - base)
    return torch.tensor(out, dtype=torch.float64)


def transformer_lens_loop(folder, ids, seq_len, batch_size):
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(folder)
    c = hf.config
    cfg = HookedTransformerConfig(n_layers=c.n_layer, d_model=c.n_embd, n_ctx=c.n_positions,
                                  d_head=c.n_embd // c.n_head, n_heads=c.n_head, d_mlp=4 * c.n_embd,
                                  d_vocab=c.vocab_size, act_fn="gelu_new",
                                  normalization_type="LN", default_prepend_bos=False)
    tl = HookedTransformer(cfg)
    tl.load_and_process_state_dict(convert_gpt2_weights(hf, cfg), fold_ln=False, center_writing_weights=False,
                                   center_unembed=False, fold_value_biases=False)
    tl.eval()
    batches = window_batches(ids, seq_len, seq_len, batch_size)

    def nll(hooks):
        total, n = 0.0, 0
        for b in batches:
            loss = tl.run_with_hooks(b.tokens, return_type="loss", loss_per_token=True, fwd_hooks=hooks)
            total += loss.double().sum().item()
            n += loss.numel()
        return total / n

    with torch.no_grad():
        base = nll([])
        out = []
        for layer in range(c.n_layer):
            for head in range(c.n_head):
                def zero(z, hook, head=head):
                    z[:, :, head] = 0
                    return z
                out.append(nll([(f"blocks.{layer}.attn.hook_z", zero)]) - base)
    return torch.tensor(out, dtype=torch.float64)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


SMOLLM = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
          "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "tie_word_embeddings": True,
          "max_position_embeddings": 2048, "rope_theta": 10000.0}


def smollm_checkpoint(seed: int = 0) -> Path:
    """A random-init SmolLM-135M-shaped LlamaForCausalLM in Hugging Face format (built once per call)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = Path(tempfile.mkdtemp(prefix="smollm-135m-"))
    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig(**SMOLLM)).save_pretrained(folder)
    return folder


def bound(model, seq_len) -> float:
    """Fraction of the naive loop's work an exact per-head sweep cannot avoid (FLOP model)."""
    cfg = model.cfg
    d, L, V, T = cfg.d_model, cfg.n_layers, cfg.vocab_size, seq_len
    h, dk = cfg.n_heads, cfg.d_head
    h_kv = getattr(cfg, "n_kv_heads", h)
    mlp = (3 if isinstance(cfg, LlamaLikeConfig) else 2) * d * cfg.d_mlp  # SwiGLU: three matrices; GPT-2, NeoX: two
    layer = 2 * (2 * d * h * dk + 2 * d * h_kv * dk + mlp) + 4 * h * dk * T  # attention + MLP FLOPs per token
    head = 2 * d * V
    forward = L * layer + head
    work = sum((L - l) * layer + head for l in range(L)) / L
    return work / forward


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--tl", action="store_true", help="also time TransformerLens's hook_z loop")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--arch", default="gpt2-small", choices=["gpt2-small", "smollm-135m"])
    args = ap.parse_args()
    if args.tl and args.arch != "gpt2-small":
        ap.error("--tl converts GPT-2 weights only")
    folder = gpt2_small_checkpoint() if args.arch == "gpt2-small" else smollm_checkpoint()
    model = load_model(folder, device=args.device)
    H = len(model.head_ids)
    ids = torch.randint(0, model.cfg.vocab_size, (args.batch * args.seq,), generator=torch.Generator().manual_seed(0))
    print(f"{args.arch}, random weights, {args.batch} x {args.seq} tokens, {H} heads, "
          f"{torch.get_num_threads()} threads")
    t0 = time.perf_counter()
    ours = torch.tensor(score_heads(model, ids, "abl_zero", windowing=Windowing(args.seq, args.seq, args.batch),
                                    show_progress=False).table.abl_zero)
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    naive = naive_loop(model, ids, args.seq, args.batch)
    t_naive = time.perf_counter() - t0
    b = bound(model, args.seq)
    print(f"naive loop: {t_naive:.1f} s ({t_naive / H:.2f} s/head)   headprune sweep: {t_ours:.1f} s "
          f"({t_ours / H:.2f} s/head)   max |diff| {(ours - naive).abs().max():.1e}")
    print(f"speed-up over naive: {t_naive / t_ours:.2f}x (target >= 1.35x); FLOP bound {1 / b:.2f}x; "
          f"reached {(t_naive / t_ours) / (1 / b):.0%} of the bound")
    windows = Windowing(args.seq, args.seq, args.batch)
    t_fwd = min(_timed(lambda: evaluate(model, ids, windows, progress=False)) for _ in range(3))
    t_grad = min(_timed(lambda: score_heads(model, ids, "grad,taylor", windowing=windows, show_progress=False))
                 for _ in range(3))
    print(f"grad + taylor: {t_grad:.2f} s = {t_grad / t_fwd:.2f} forwards ({t_fwd:.2f} s each; target <= 3.5)")
    if args.tl:
        t0 = time.perf_counter()
        tl = transformer_lens_loop(folder, ids, args.seq, args.batch)
        t_tl = time.perf_counter() - t0
        print(f"TransformerLens hook_z loop: {t_tl:.1f} s ({t_tl / H:.2f} s/head), max |diff| vs ours "
              f"{(tl - ours).abs().max():.1e}; speed-up {t_tl / t_ours:.2f}x (target >= 1.5x)")


if __name__ == "__main__":
    main()
