#!/usr/bin/env python
"""Train the shipped default model ``headprune/zoo/stdlib-gpt2-mini`` on the default corpus.

Reproducible: the tokenizer is trained on the default corpus' train split, the model is a
seeded GPT-2 (6 layers x 8 heads, d=256, 256 positions, vocab 8192), and batch ``k`` is drawn
from a generator seeded with ``(seed, k)``, so a run resumed from a checkpoint sees the same
data. The weights of the step with the lowest validation loss are shipped in fp16, with
``MODEL_CARD.md`` and ``metrics.json`` (sliding-window perplexities).

    python scripts/train_zoo_model.py                   # train, save, evaluate
    python scripts/train_zoo_model.py --resume          # continue from the last checkpoint
    python scripts/train_zoo_model.py --benchmark 10    # time 10 steps, then stop
    python scripts/train_zoo_model.py --card-only       # re-evaluate the saved model, rewrite the card
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

import torch
import transformers
from tqdm import tqdm

from headprune.data.sources import load_texts
from headprune.data.stdlib_docs import default_documents, split_of
from headprune.data.tokens import tokenize_corpus

ROOT = Path(__file__).resolve().parents[1]
EOS = "<|endoftext|>"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "headprune/zoo/stdlib-gpt2-mini")
    p.add_argument("--work", type=Path, default=ROOT / "out/zoo-train", help="checkpoints and tokenizer (gitignored)")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--benchmark", type=int, default=0, metavar="N", help="time N steps and exit")
    p.add_argument("--card-only", action="store_true")
    return p.parse_args(argv)


def train_tokenizer(folder: Path) -> transformers.PreTrainedTokenizerBase:
    """Byte-level BPE (GPT-2 style, no prefix space) on the train split; saved as vocab.json + merges.txt."""
    from tokenizers import ByteLevelBPETokenizer

    if not (folder / "vocab.json").exists():
        texts = [t for n, t in default_documents() if split_of(n) == "train"]
        tok = ByteLevelBPETokenizer(add_prefix_space=False)
        tok.train_from_iterator(texts, vocab_size=8192, min_frequency=2, special_tokens=[EOS], show_progress=False)
        folder.mkdir(parents=True, exist_ok=True)
        tok.save_model(str(folder))
        config = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False,
                  "bos_token": EOS, "eos_token": EOS, "unk_token": EOS}
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer = transformers.GPT2TokenizerFast.from_pretrained(folder)
    assert len(tokenizer) == 8192 and tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id) == EOS, "bad tokenizer"
    return tokenizer


def make_config(tokenizer, args) -> transformers.GPT2Config:
    eos = tokenizer.eos_token_id
    return transformers.GPT2Config(
        vocab_size=len(tokenizer), n_positions=args.seq_len, n_embd=256, n_layer=6, n_head=8,
        activation_function="gelu_new", resid_pdrop=args.dropout, embd_pdrop=args.dropout,
        attn_pdrop=args.dropout, bos_token_id=eos, eos_token_id=eos, tie_word_embeddings=True,
    )


def batch_at(ids: torch.Tensor, step: int, args) -> torch.Tensor:
    """Batch ``step``: ``args.batch`` random windows of ``seq_len`` tokens, seeded by (seed, step)."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    starts = torch.randint(0, len(ids) - args.seq_len + 1, (args.batch,), generator=g)
    return torch.stack([ids[s:s + args.seq_len] for s in starts.tolist()])


def lr_at(step: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def sliding_window_nll(model, ids: torch.Tensor, max_length: int = 256, stride: int = 256):
    """Hugging Face's "Perplexity of fixed-length models" loop; returns (nll_sum, n_tokens, scored targets)."""
    model.eval()
    ids = ids.unsqueeze(0)
    seq_len = ids.size(1)
    nll_sum, n_tokens, prev_end, targets = 0.0, 0, 0, []
    for begin in range(0, seq_len, stride):
        end = min(begin + max_length, seq_len)
        trg_len = end - prev_end
        input_ids = ids[:, begin:end]
        labels = input_ids.clone()
        labels[:, :-trg_len] = -100
        num_loss_tokens = int((labels != -100).sum()) - labels.size(0)
        if num_loss_tokens > 0:  # a final window of one token has nothing to predict (its loss is NaN)
            loss = model(input_ids, labels=labels).loss
            nll_sum += loss.item() * num_loss_tokens
            n_tokens += num_loss_tokens
            shifted = labels[0, 1:]
            targets.append(shifted[shifted != -100])
        prev_end = end
        if end == seq_len:
            break
    return nll_sum, n_tokens, torch.cat(targets)


def unigram_ppl(train_ids: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> float:
    """Perplexity of add-one-smoothed train-split unigram frequencies on the given target tokens."""
    counts = torch.bincount(train_ids, minlength=vocab_size).double()
    logp = torch.log((counts + 1) / (counts.sum() + vocab_size))
    return math.exp(-logp[targets].mean().item())


def quick_val_loss(model, val_ids: torch.Tensor, args) -> float:
    nll, n, _ = sliding_window_nll(model, val_ids, args.seq_len, args.seq_len)
    model.train()
    return nll / n


def train(args, tokenizer, train_ids, val_ids) -> dict:
    ckpt = args.work / "checkpoint.pt"
    torch.manual_seed(args.seed)
    model = transformers.GPT2LMHeadModel(make_config(tokenizer, args))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    state = {"step": 0, "elapsed": 0.0, "best_val": float("inf"), "best_step": -1, "best_model": None, "log": []}
    if args.resume and ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        torch.set_rng_state(saved["rng"])
        state = saved["state"]
        print(f"resumed at step {state['step']}", flush=True)
    model.train()
    n_steps = args.benchmark or args.steps
    bar = tqdm(range(state["step"], n_steps), initial=state["step"], total=n_steps, mininterval=10)
    t0, t_last = time.time(), state["elapsed"]
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        batch = batch_at(train_ids, step, args)
        loss = model(batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state["step"] = step + 1
        elapsed = t_last + time.time() - t0
        bar.set_postfix(loss=f"{loss.item():.3f}",
                        tok_s=f"{(step + 1 - bar.initial) * args.batch * args.seq_len / (time.time() - t0):.0f}")
        if args.benchmark:
            continue
        if state["step"] % args.eval_every == 0 or state["step"] == args.steps:
            val = quick_val_loss(model, val_ids, args)
            state["log"].append({"step": state["step"], "train_loss": loss.item(), "val_loss": val,
                                 "elapsed_s": elapsed})
            tqdm.write(f"step {state['step']} train {loss.item():.3f} val {val:.3f} (ppl {math.exp(val):.1f}) "
                       f"{elapsed:.0f}s")
            if val < state["best_val"]:
                state.update(best_val=val, best_step=state["step"],
                             best_model={k: v.detach().clone() for k, v in model.state_dict().items()})
        if state["step"] % args.ckpt_every == 0 or state["step"] == args.steps:
            state["elapsed"] = elapsed
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "rng": torch.get_rng_state(),
                        "state": state}, tmp)
            os.replace(tmp, ckpt)
    state["elapsed"] = t_last + time.time() - t0
    if args.benchmark:
        tok_s = args.benchmark * args.batch * args.seq_len / (time.time() - t0)
        print(f"benchmark: {tok_s:.0f} tokens/s, {(time.time() - t0) / args.benchmark:.2f} s/step")
        sys.exit(0)
    model.load_state_dict(state["best_model"])
    state["model"] = model
    return state


def save(model, tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.config.resid_pdrop = model.config.embd_pdrop = model.config.attn_pdrop = 0.0
    model.half().save_pretrained(out, safe_serialization=True)
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(Path(tokenizer.name_or_path) / name, out / name)


def evaluate(out: Path, train_ids: torch.Tensor) -> dict:
    """Sliding-window perplexity of the shipped (fp16) model reloaded as fp32, plus a unigram baseline."""
    tokenizer = transformers.GPT2TokenizerFast.from_pretrained(out)
    model = transformers.GPT2LMHeadModel.from_pretrained(out, dtype=torch.float32)
    metrics = {"seq_len": 256, "stride": 256}
    for split in ("validation", "test"):
        ids = tokenize_corpus(load_texts("default", split), tokenizer)
        nll, n, targets = sliding_window_nll(model, ids, 256, 256)
        metrics[f"{split}_ppl"] = round(math.exp(nll / n), 3)
        metrics[f"{split}_tokens"] = len(ids)
        metrics[f"{split}_scored_tokens"] = n
        if split == "test":
            metrics["unigram_test_ppl"] = round(unigram_ppl(train_ids, targets, len(tokenizer)), 3)
    return metrics


CARD = """# stdlib-gpt2-mini

A tiny GPT-2 (exact `transformers` GPT-2 architecture) trained from scratch on the English text
of the Python {py} standard library's documentation: headprune's default model, small enough to
ship and to prune on a laptop CPU.

## Architecture

`GPT2LMHeadModel`, {n_layer} layers x {n_head} heads = {heads} attention heads, d_model {n_embd},
{n_positions} positions, vocab {vocab}, `gelu_new`, tied LM head, {params:,} parameters,
weights stored in fp16 (`model.safetensors`). Dropout was {dropout} while training; 0 in the shipped config.

## Tokenizer

Byte-level BPE (GPT-2 pre-tokenization, no prefix space) trained with `tokenizers` on the train
split, vocab 8192, min frequency 2; `<|endoftext|>` is id {eos} (bos = eos = unk).
Load with `transformers.GPT2TokenizerFast.from_pretrained(folder)`.

## Data

`headprune.data.stdlib_docs.default_documents()`: one document per `pydoc_data.topics` entry and one per
stdlib module (module, class and function docstrings in source order, `inspect.cleandoc`-ed,
docstrings under 40 characters skipped; test directories and site-packages excluded).
Split by document name: the first 8 bytes of sha256(name), big-endian, mod 100:
< 90 train, < 95 validation, else test (`headprune.data.stdlib_docs.split_of`).
Documents are joined with `<|endoftext|>`. Train: {train_docs} documents, {train_tokens:,} tokens;
validation: {validation_docs} documents, {validation_tokens:,} tokens; \
test: {test_docs} documents, {test_tokens:,} tokens.

## Training

Seed {seed}; {steps} steps of {batch} random {seq_len}-token windows of the train token stream
(window starts of step k drawn from a generator seeded with seed*1000003+k); AdamW
(betas 0.9/0.95, weight decay {weight_decay} on matrices, grad clip 1.0), peak lr {lr}, linear warmup
{warmup} steps then cosine decay to {min_lr}; fp32 on {threads} CPU threads.
Validation loss every {eval_every} steps; the weights of the best step ({best_step}) are shipped.
Training wall time: {minutes:.1f} minutes ({tok_s:,.0f} tokens/s; validation passes included, and it
depends on other load on the machine), torch {torch}, transformers {transformers}.

    {command}

## Evaluation

Fixed-length sliding-window perplexity as in Hugging Face's guide "Perplexity of fixed-length
models" (max_length = 256, stride = 256, every token of the split; per window nll weighted by
its number of predicted tokens, i.e. scored labels minus one), fp16 weights loaded as fp32:

| split | perplexity | scored tokens |
|---|---|---|
| validation | {validation_ppl} | {validation_scored_tokens:,} |
| test | {test_ppl} | {test_scored_tokens:,} |
| test, unigram baseline | {unigram_test_ppl} | {test_scored_tokens:,} |

The unigram baseline is add-one-smoothed token frequencies of the train split (over all 8192
ids), scored on the same test targets. The validation split also picked the shipped step, so its
perplexity is slightly optimistic; test was not used for any choice.
These numbers are also in `metrics.json`. Since the corpus is read from the installed Python,
another Python version yields a different corpus and different numbers.
"""


def write_card(out: Path, args, metrics: dict, info: dict) -> None:
    config = transformers.GPT2Config.from_pretrained(out)
    tokenizer = transformers.GPT2TokenizerFast.from_pretrained(out)
    docs = default_documents()
    counts = Counter(split_of(n) for n, _ in docs)
    params = sum(p.numel() for p in transformers.GPT2LMHeadModel(config).parameters())
    fields = dict(vars(args), **metrics, **info)
    fields.update(
        py=".".join(map(str, sys.version_info[:3])), n_layer=config.n_layer, n_head=config.n_head,
        heads=config.n_layer * config.n_head, n_embd=config.n_embd, n_positions=config.n_positions,
        vocab=config.vocab_size, params=params, eos=tokenizer.eos_token_id,
        min_lr=args.lr * args.min_lr_ratio, torch=torch.__version__, transformers=transformers.__version__,
        **{f"{s}_docs": counts[s] for s in ("train", "validation", "test")},
    )
    (out / "MODEL_CARD.md").write_text(CARD.format(**fields))
    keys = ("test_ppl", "validation_ppl", "unigram_test_ppl", "seq_len", "stride")
    (out / "metrics.json").write_text(json.dumps({k: metrics[k] for k in keys}, indent=2) + "\n")


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(args.work / "tokenizer")
    train_ids = tokenize_corpus(load_texts("default", "train"), tokenizer)
    info_file = args.work / "train_info.json"
    if not args.card_only:
        val_ids = tokenize_corpus(load_texts("default", "validation"), tokenizer)
        print(f"train {len(train_ids):,} tokens, validation {len(val_ids):,} tokens", flush=True)
        state = train(args, tokenizer, train_ids, val_ids)
        save(state["model"], tokenizer, args.out)
        info = {"best_step": state["best_step"], "minutes": state["elapsed"] / 60,
                "tok_s": args.steps * args.batch * args.seq_len / state["elapsed"], "log": state["log"],
                "args": {k: str(v) for k, v in vars(args).items()},
                "command": " ".join(["python scripts/train_zoo_model.py",
                                     *[a for a in (sys.argv[1:] if argv is None else argv) if a != "--resume"]])}
        info_file.write_text(json.dumps(info, indent=2))
    info = json.loads(info_file.read_text())
    info["train_tokens"] = len(train_ids)
    metrics = evaluate(args.out, train_ids)
    print(json.dumps(metrics, indent=2))
    train_args = parse_args(info["command"].split()[2:])  # the card describes the training run
    write_card(args.out, train_args, metrics, info)


if __name__ == "__main__":
    main()
