"""Long-context tasks built offline from the long-document corpus (:mod:`headprune.data.long_docs`), each first
measuring whether the model performs it, and run with or without streaming heads (:mod:`headprune.models.streaming`).

- **passkey** (Mohtashami & Jaggi 2023, on a real haystack): a window of prose of ``length`` tokens with the needle
  "The pass key is NNNNN. Remember it. NNNNN is the pass key." inserted at a relative ``depth``, then "What is the
  pass key? The pass key is" and the answer " NNNNN". Right = every answer token is the model's top-1 given
  the tokens before it (greedy decoding of the answer, from one forward).
- **recall**: the passkey task in completion form, as a base model is asked: the needle "The pass key is NNNNN."
  and the prompt ending "The pass key is", answered " NNNNN" (copying from the needle at any distance: what a
  retrieval head does). Small models that fail the question form perform this one.
- **multikey**: ``keys`` needles "The pass key of the {colour} box is NNNNN." spread through the haystack, the
  question asks for one of them.
- **long-window perplexity** (:func:`long_window_nll`): the NLL of the last ``tail`` tokens of windows of
  ``length`` tokens cut from long documents, with the whole window as context and with only the ``short`` tokens
  before the tail: where the gain (short − long) is not positive the model does not use the long context.

A task the model fails (share right below ``min_share``) is refused with one line (:func:`check_performs`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import Tensor

from headprune.data.long_docs import prose_documents
from headprune.errors import HeadpruneError
from headprune.models.base import HeadModel
from headprune.models.streaming import Streaming, streaming

COLOURS = ("red", "blue", "green", "black", "white", "yellow", "purple", "orange")
MIN_SHARE = 0.5  # a task the model gets right less often than this is refused


@dataclass(frozen=True)
class LongPrompt:
    """One prompt: ``tokens`` (T,) end with the answer, which spans ``tokens[answer_start:]``."""

    tokens: Tensor
    answer_start: int
    length: int  # the prompt's tokens
    depth: float  # where the (asked) needle sits, 0..1 of the haystack


@dataclass(frozen=True)
class LongTask:
    name: str
    prompts: list[LongPrompt]


@dataclass
class TaskResult:
    """Share of prompts right, overall and per (length, depth) cell, and the seconds it took."""

    name: str
    right: list[bool]
    cells: dict[tuple[int, float], float] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def share(self) -> float:
        return sum(self.right) / len(self.right)


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def haystack(tokenizer, n_tokens: int, rng: random.Random) -> list[int]:
    """``n_tokens`` consecutive tokens of a prose document of the long corpus, from a random place in it."""
    docs = [text for _, text in prose_documents() if len(text) > 6 * n_tokens]
    if not docs:
        raise HeadpruneError(f"no long document holds a haystack of {n_tokens} tokens; use shorter prompts")
    text = rng.choice(docs)
    start = rng.randrange(0, len(text) - 6 * n_tokens)
    ids = _encode(tokenizer, text[start:start + 8 * n_tokens])[1:]  # the first token may be cut mid-word
    if len(ids) < n_tokens:
        raise HeadpruneError(f"a haystack of {n_tokens} tokens needs longer documents than the corpus holds")
    return ids[:n_tokens]


def _prompt(tokenizer, needles: Sequence[tuple[float, str]], question: str, answer: str, length: int,
            rng: random.Random, bos: int | None, asked_depth: float) -> LongPrompt:
    """Haystack tokens with each needle (depth, text) inserted, then the question and the answer; ``length`` in all."""
    pieces = [(depth, _encode(tokenizer, text)) for depth, text in needles]
    tail, ans = _encode(tokenizer, question), _encode(tokenizer, answer)
    n_hay = length - sum(len(p) for _, p in pieces) - len(tail) - len(ans) - (bos is not None)
    if n_hay < 16:
        raise HeadpruneError(f"prompts of {length} tokens leave no room for a haystack; use longer prompts")
    hay = haystack(tokenizer, n_hay, rng)
    ids: list[int] = [] if bos is None else [bos]
    last = 0
    for depth, piece in sorted(pieces):
        cut = round(depth * n_hay)
        ids += hay[last:cut] + piece
        last = cut
    ids += hay[last:] + tail
    return LongPrompt(torch.tensor(ids + ans), len(ids), len(ids) + len(ans), asked_depth)


#: The single-key tasks: (needle, with ``{key}`` for the pass key; what the prompt ends with before the answer).
KEY_FORMS = {"passkey": (" The pass key is {key}. Remember it. {key} is the pass key.",
                         " What is the pass key? The pass key is"),
             "recall": (" The pass key is {key}.", " The pass key is")}


def _key_task(name: str, tokenizer, lengths: Sequence[int], depths: Sequence[float], per_cell: int, seed: int,
              bos: int | None) -> LongTask:
    """``per_cell`` prompts at each length (tokens) and depth, each with one pass key (drawn with ``seed``) in the
    form :data:`KEY_FORMS` [``name``] gives, answered " NNNNN"."""
    needle, question = KEY_FORMS[name]
    rng = random.Random(seed)
    prompts = []
    for length in lengths:
        for depth in depths:
            for _ in range(per_cell):
                key = str(rng.randrange(10_000, 100_000))
                prompts.append(_prompt(tokenizer, [(depth, needle.format(key=key))], question, f" {key}", length,
                                       rng, bos, depth))
    return LongTask(name, prompts)


def passkey_task(tokenizer, *, lengths: Sequence[int] = (512, 1024, 2048), depths: Sequence[float] = (0.1, 0.5, 0.9),
                 per_cell: int = 2, seed: int = 0, bos: int | None = None) -> LongTask:
    """Passkey prompts, asked as a question: ``per_cell`` at each length (tokens) and depth."""
    return _key_task("passkey", tokenizer, lengths, depths, per_cell, seed, bos)


def recall_task(tokenizer, *, lengths: Sequence[int] = (512, 1024, 2048), depths: Sequence[float] = (0.1, 0.5, 0.9),
                per_cell: int = 2, seed: int = 0, bos: int | None = None) -> LongTask:
    """Passkey prompts in completion form ("The pass key is NNNNN." … "The pass key is"): ``per_cell`` at each
    length (tokens) and depth."""
    return _key_task("recall", tokenizer, lengths, depths, per_cell, seed, bos)


def multikey_task(tokenizer, *, length: int = 1024, keys: int = 4, n_prompts: int = 8, seed: int = 0,
                  bos: int | None = None) -> LongTask:
    """``n_prompts`` prompts of ``length`` tokens, each with ``keys`` needles (one pass key per coloured box,
    spread evenly through the haystack) and a question about one of them."""
    if not 2 <= keys <= len(COLOURS):
        raise HeadpruneError(f"multikey needs 2 to {len(COLOURS)} keys, got {keys}", "keys")
    rng = random.Random(seed)
    prompts = []
    for _ in range(n_prompts):
        colours = rng.sample(COLOURS, keys)
        values = [str(rng.randrange(10_000, 100_000)) for _ in colours]
        depths = [(j + 0.5) / keys for j in range(keys)]
        asked = rng.randrange(keys)
        needles = [(d, f" The pass key of the {c} box is {v}.") for d, c, v in zip(depths, colours, values)]
        prompts.append(_prompt(tokenizer, needles, f" What is the pass key of the {colours[asked]} box? The pass "
                               f"key of the {colours[asked]} box is", f" {values[asked]}", length, rng, bos,
                               depths[asked]))
    return LongTask("multikey", prompts)


@torch.no_grad()
def answer_predictions(model: HeadModel, prompts: Sequence[LongPrompt]) -> list[Tensor]:
    """The model's top-1 token at each position predicting a prompt's answer, teacher-forced (prompts of one
    length, one forward)."""
    tokens = torch.stack([p.tokens for p in prompts]).to(model.device)  # (b, T)
    model.check_length(tokens.shape[1])
    resid = model.run_blocks(model.embed(tokens))
    return [model.unembed(resid[row:row + 1, p.answer_start - 1:tokens.shape[1] - 1]).argmax(-1)[0].cpu()
            for row, p in enumerate(prompts)]


def prompt_right(model: HeadModel, prompts: Sequence[LongPrompt]) -> list[bool]:
    """Whether each prompt's answer tokens are all the model's top-1 predictions (greedy decoding gives them)."""
    predicted = answer_predictions(model, prompts)
    return [bool((top == p.tokens[p.answer_start:]).all()) for top, p in zip(predicted, prompts)]


def run_task(model: HeadModel, task: LongTask, layers: Mapping[int, Streaming] | None = None) -> TaskResult:
    """The task's share right, with ``layers``' streaming heads where given (prompts batched by length)."""
    t0 = time.perf_counter()
    right: dict[int, bool] = {}
    by_length: dict[int, list[int]] = {}
    for i, p in enumerate(task.prompts):
        by_length.setdefault(int(p.tokens.shape[0]), []).append(i)
    with streaming(model, layers) if layers else nullcontext():
        for index in by_length.values():
            right |= dict(zip(index, prompt_right(model, [task.prompts[i] for i in index])))
    flags = [right[i] for i in range(len(task.prompts))]
    cells: dict[tuple[int, float], list[bool]] = {}
    for p, ok in zip(task.prompts, flags):
        cells.setdefault((p.length, p.depth), []).append(ok)
    return TaskResult(task.name, flags, {c: sum(v) / len(v) for c, v in cells.items()}, time.perf_counter() - t0)


def check_performs(result: TaskResult, min_share: float = MIN_SHARE) -> TaskResult:
    """``result`` where the model performs the task; otherwise one HeadpruneError line."""
    if result.share < min_share:
        raise HeadpruneError(f"the model gets {result.name} right on {result.share:.0%} of {len(result.right)} "
                             f"prompts (needs {min_share:.0%}): it does not perform the task, so which heads it "
                             "needs cannot be measured on it", "task")
    return result


def long_windows(tokenizer, *, length: int, n_windows: int, split: str = "test", bos: int | None = None) -> Tensor:
    """(n_windows, length) token windows, consecutive and non-overlapping within each long document of ``split``
    (documents in name order, each window after ``bos`` where given)."""
    from headprune.data.long_docs import long_documents
    from headprune.data.stdlib_docs import split_of

    out: list[list[int]] = []
    width = length - (bos is not None)
    for name, text in long_documents():
        if split_of(name) != split:
            continue
        ids = _encode(tokenizer, text)
        out += [([] if bos is None else [bos]) + ids[a:a + width] for a in range(0, len(ids) - width + 1, width)]
        if len(out) >= n_windows:
            return torch.tensor(out[:n_windows])
    raise HeadpruneError(f"the long documents of the {split} split hold {len(out)} windows of {length} tokens, "
                         f"not {n_windows}; ask for fewer or shorter windows", "windows")


@torch.no_grad()
def tail_nll_rows(model: HeadModel, windows: Tensor, tail: int, layers: Mapping[int, Streaming] | None = None,
                  batch: int = 2) -> Tensor:
    """[b] float64: each window's mean NLL (nats/token) of its last ``tail`` tokens given the whole window, with
    ``layers``' streaming heads where given (``batch`` windows per forward)."""
    rows = []
    with streaming(model, layers) if layers else nullcontext():
        for part in windows.to(model.device).split(batch):
            resid = model.run_blocks(model.embed(part))
            logits = model.unembed(resid[:, -tail - 1:-1]).float()  # predicting the last `tail` tokens
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), part[:, -tail:], reduction="none")
            rows.append(nll.double().mean(1).cpu())
    return torch.cat(rows)


@torch.no_grad()
def long_window_nll(model: HeadModel, windows: Tensor, *, tail: int, short: int,
                    layers: Mapping[int, Streaming] | None = None, bos: int | None = None) -> dict[str, float]:
    """Mean NLL (nats/token) of the last ``tail`` tokens of ``windows`` (b, T) given the whole window ("long")
    and given only the ``short`` tokens before the tail, after ``bos`` where given ("short"), and the gain
    short − long."""
    T = windows.shape[1]
    if not (0 < tail and tail + short < T):
        raise HeadpruneError(f"tail {tail} + short {short} must be less than the window of {T} tokens", "tail")
    cut = windows[:, -(tail + short):]
    if bos is not None:
        cut = torch.cat([torch.full_like(cut[:, :1], bos), cut], dim=1)
    long = float(tail_nll_rows(model, windows, tail, layers).mean())
    short_nll = float(tail_nll_rows(model, cut, tail, layers).mean())
    return {"long": long, "short": short_nll, "gain": short_nll - long}
