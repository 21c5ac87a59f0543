"""Clean/corrupt prompt pairs: the input of activation patching, from a JSONL file or a built-in task.

A pair is two prompts of the same length in tokens that differ where the behaviour is decided, and two
one-token continuations: ``answer`` (what the clean prompt should be continued with) and ``wrong`` (the
alternative the corrupt prompt favours). Pairs of different lengths are stored right-padded:

    clean, corrupt (P, T): pair p's tokens at positions 0..n_p−1, ``PAD`` after;  lengths (P,): n_p

Right padding is exact under causal attention: position t < n_p attends to positions ≤ t only, and position
embeddings start at 0, so every real position computes what the unpadded prompt computes. Metrics are read
at each pair's own last position n_p − 1 (:meth:`PromptPairs.last`).

A pair file holds one JSON object a line, either token ids
``{"clean_ids": [...], "corrupt_ids": [...], "answer_id": n, "wrong_id": m}`` or text
``{"clean": "...", "corrupt": "...", "answer": " Mary", "wrong": " John"}`` (tokenized with the model's tokenizer).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from headprune.errors import HeadpruneError

PAD = 0  # the id right padding uses (never read: padded positions come after every real one)
ID_KEYS = ("clean_ids", "corrupt_ids", "answer_id", "wrong_id")
TEXT_KEYS = ("clean", "corrupt", "answer", "wrong")


@dataclass
class PromptPairs:
    """P prompt pairs, right-padded: clean/corrupt (P, T) int64, lengths/answer/wrong (P,) int64."""

    clean: Tensor
    corrupt: Tensor
    lengths: Tensor
    answer: Tensor
    wrong: Tensor
    name: str = "pairs"

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def last(self) -> Tensor:
        """(P,) each pair's last real position, where its metric is read."""
        return self.lengths - 1

    @property
    def same_length(self) -> bool:
        return bool((self.lengths == self.lengths[0]).all())

    def select(self, index: Tensor | Sequence[int]) -> PromptPairs:
        """The pairs at ``index``, trimmed to their longest prompt."""
        index = torch.as_tensor(index, dtype=torch.long)
        T = int(self.lengths[index].max())
        return PromptPairs(self.clean[index, :T], self.corrupt[index, :T], self.lengths[index], self.answer[index],
                           self.wrong[index], self.name)

    def to(self, device: torch.device) -> PromptPairs:
        return PromptPairs(self.clean.to(device), self.corrupt.to(device), self.lengths.to(device),
                           self.answer.to(device), self.wrong.to(device), self.name)

    @classmethod
    def from_lists(cls, clean: Sequence[Sequence[int]], corrupt: Sequence[Sequence[int]], answer: Sequence[int],
                   wrong: Sequence[int], name: str = "pairs") -> PromptPairs:
        """Pairs from token-id lists (clean[p] and corrupt[p] of one length), right-padded with :data:`PAD`."""
        if not clean:
            raise HeadpruneError(f"{name}: no prompt pairs")
        lengths = [len(c) for c in clean]
        for p, (c, r) in enumerate(zip(clean, corrupt)):
            if len(c) != len(r) or not c:
                raise HeadpruneError(f"{name}: pair {p} has clean and corrupt prompts of {len(c)} and {len(r)} "
                                     "tokens; they must be equally long and not empty")
        T = max(lengths)
        pad = lambda rows: torch.tensor([list(r) + [PAD] * (T - len(r)) for r in rows], dtype=torch.long)
        return cls(pad(clean), pad(corrupt), torch.tensor(lengths), torch.tensor(list(answer)),
                   torch.tensor(list(wrong)), name)

    def check_shapes(self) -> PromptPairs:
        """Refuse pairs built by hand that do not hold together: clean and corrupt (P, T) integer tensors of one
        shape, P ≥ 1, lengths / answer / wrong (P,) integers, every length in 1..T."""
        if not all(isinstance(t, Tensor) for t in (self.clean, self.corrupt, self.lengths, self.answer, self.wrong)):
            raise HeadpruneError(f"{self.name}: clean, corrupt, lengths, answer and wrong must be tensors")
        if self.clean.dim() != 2 or self.clean.shape != self.corrupt.shape:
            raise HeadpruneError(f"{self.name}: clean {tuple(self.clean.shape)} and corrupt "
                                 f"{tuple(self.corrupt.shape)} must be (pairs, tokens) tensors of one shape")
        P, T = self.clean.shape
        if P == 0:
            raise HeadpruneError(f"{self.name}: no prompt pairs")
        for what, t in (("lengths", self.lengths), ("answer", self.answer), ("wrong", self.wrong)):
            if tuple(t.shape) != (P,):
                raise HeadpruneError(f"{self.name}: {what} has shape {tuple(t.shape)}; it must hold one entry for "
                                     f"each of the {P} pairs")
        for what, t in (("clean", self.clean), ("corrupt", self.corrupt), ("lengths", self.lengths),
                        ("answer", self.answer), ("wrong", self.wrong)):
            if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
                raise HeadpruneError(f"{self.name}: {what} must hold integers, got {t.dtype}")
        if bool((self.lengths < 1).any() or (self.lengths > T).any()):
            raise HeadpruneError(f"{self.name}: a pair's length {int(self.lengths.min())}..{int(self.lengths.max())} "
                                 f"lies outside 1..{T}, the prompts' {T} token columns")
        return self

    def check(self, vocab_size: int, n_positions: int) -> PromptPairs:
        """Refuse pairs whose tensors do not hold together (:meth:`check_shapes`), ids outside the vocabulary and
        prompts longer than the model's context."""
        self.check_shapes()
        for what, t in (("a token", torch.cat([self.clean, self.corrupt], 1)), ("an answer", self.answer),
                        ("a wrong", self.wrong)):
            if t.numel() and (t.min() < 0 or t.max() >= vocab_size):
                raise HeadpruneError(f"{self.name}: {what} id lies outside the model's vocabulary 0..{vocab_size - 1}")
        if self.clean.shape[1] > n_positions:
            raise HeadpruneError(f"{self.name}: a prompt has {self.clean.shape[1]} tokens, more than the model's "
                                 f"{n_positions} positions")
        return self


def _one_token(tokenizer, text: str, what: str, where: str) -> int:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise HeadpruneError(f"{where}: {what} {text!r} is {len(ids)} tokens for this tokenizer; it must be one token")
    return ids[0]


def _ids(value, what: str, where: str, vocab_size: int | None) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(i, int) and not isinstance(i, bool)
                                                           for i in value):
        raise HeadpruneError(f"{where}: {what} must be a non-empty list of token ids")
    if vocab_size is not None and any(not 0 <= i < vocab_size for i in value):
        raise HeadpruneError(f"{where}: {what} holds a token id outside the vocabulary 0..{vocab_size - 1}")
    return value


def parse_pair(line: str, where: str, tokenizer=None, vocab_size: int | None = None) -> tuple[list[int], list[int],
                                                                                              int, int]:
    """(clean ids, corrupt ids, answer id, wrong id) of one JSONL line; ``where`` names it in errors."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        raise HeadpruneError(f"{where}: not valid JSON ({err.msg})") from None
    if not isinstance(obj, dict):
        raise HeadpruneError(f"{where}: expected a JSON object with {', '.join(ID_KEYS)} or {', '.join(TEXT_KEYS)}")
    if all(k in obj for k in ID_KEYS):
        clean = _ids(obj["clean_ids"], "clean_ids", where, vocab_size)
        corrupt = _ids(obj["corrupt_ids"], "corrupt_ids", where, vocab_size)
        answer, wrong = (_ids([obj[k]], k, where, vocab_size)[0] for k in ("answer_id", "wrong_id"))
    elif all(k in obj for k in TEXT_KEYS):
        if not all(isinstance(obj[k], str) and obj[k] for k in TEXT_KEYS):
            raise HeadpruneError(f"{where}: {', '.join(TEXT_KEYS)} must be non-empty strings")
        if tokenizer is None:
            raise HeadpruneError(f"{where}: a text pair needs the model's tokenizer")
        clean, corrupt = (tokenizer(obj[k])["input_ids"] for k in ("clean", "corrupt"))
        answer, wrong = (_one_token(tokenizer, obj[k], k, where) for k in ("answer", "wrong"))
        if vocab_size is not None:
            _ids(clean + corrupt + [answer, wrong], "the tokenized pair", where, vocab_size)
    else:
        raise HeadpruneError(f"{where}: expected the keys {', '.join(ID_KEYS)} or {', '.join(TEXT_KEYS)}; "
                             f"got {', '.join(map(str, obj)) or 'none'}")
    if len(clean) != len(corrupt):
        raise HeadpruneError(f"{where}: the clean prompt is {len(clean)} tokens and the corrupt one {len(corrupt)}; "
                             "they must be equally long")
    return clean, corrupt, answer, wrong


def read_pairs(path: str | Path, tokenizer=None, vocab_size: int | None = None) -> PromptPairs:
    """Prompt pairs from a JSONL file (blank lines skipped); a bad line is refused naming its line number."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise HeadpruneError(f"cannot read the pair file {path}: {err}") from None
    numbered = [(n, parse_pair(line, f"{path} line {n}", tokenizer, vocab_size))
                for n, line in enumerate(lines, 1) if line.strip()]
    if not numbered:
        raise HeadpruneError(f"{path} holds no prompt pairs; write one JSON object a line")
    first: dict[str, int] = {}
    for n, row in numbered:  # the same pair twice would count twice and narrow the intervals over pairs
        if (seen := first.setdefault(json.dumps(row), n)) != n:
            raise HeadpruneError(f"{path} lines {seen} and {n} hold the same pair (the same token ids); give each "
                                 "pair once")
    rows = [row for _, row in numbered]
    clean, corrupt, answer, wrong = (list(col) for col in zip(*rows))
    return PromptPairs.from_lists(clean, corrupt, answer, wrong, path.stem)
