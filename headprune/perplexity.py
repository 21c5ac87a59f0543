"""Fixed-length sliding-window perplexity (Hugging Face's guide "Perplexity of fixed-length models").

Windows of ``seq_len`` tokens start at 0, s, 2s, ... (stride s) until one reaches the end of the corpus.
Window w = ids[b_w : e_w] scores only the tokens new to it, positions t in [e_{w-1}, e_w) with t > b_w,
each predicted from ids[b_w : t]. Then

    NLL = Σ_t −log p(x_t | context) / #scored tokens,        perplexity = exp(NLL).

Token-weighted exactly: the guide's loop weights each window's mean loss by (new tokens − 1), which is
the number of scored tokens only for the first window; we count the tokens that are really scored.

A model whose tokenizer puts a BOS token before every text (Gemma's ``<bos>``; ``model.origin.bos_token_id``)
sees every window as [bos] + ids[b_w : e_w]: its first token is then scored too, predicted from bos alone, so
windows without overlap score every corpus token. The window still holds ``seq_len`` corpus tokens; the forward
is one position longer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from tqdm.auto import tqdm

from headprune.errors import HeadpruneError, warn
from headprune.models.base import HeadModel
from headprune.models.nll import model_nll


@dataclass(frozen=True)
class Window:
    begin: int
    end: int
    first_scored: int  # first target position (absolute) this window scores


@dataclass
class Batch:
    tokens: Tensor  # (b, L) int64: the window, after the BOS token where the model has one (L = seq_len + 1)
    mask: Tensor  # (b, L-1) bool: which next-token predictions are scored

    def to(self, device: torch.device) -> Batch:
        return Batch(self.tokens.to(device), self.mask.to(device))


#: The default window of a model with a longer context (SmolLM2's 8192, Gemma 3's 32,768): windows of this length
#: fit a corpus of a few thousand tokens several times over, so the windows give a standard error and batches.
DEFAULT_MAX_SEQ_LEN = 1024


@dataclass(frozen=True)
class Windowing:
    """How a corpus is cut into windows and batched, checked against a model: build it with :meth:`for_model`
    (or :meth:`resolve` from the model's positions and BOS token)."""

    seq_len: int  # corpus tokens per window
    stride: int  # window start every `stride` tokens
    batch_size: int = 8  # windows per forward
    bos: int | None = None  # the token put before every window (the model's BOS), None: none

    @classmethod
    def resolve(cls, n_positions: int, seq_len: int | None = None, stride: int | None = None,
                batch_size: int = 8, bos: int | None = None) -> Windowing:
        """Defaults filled in (seq_len: the positions the BOS token leaves, up to :data:`DEFAULT_MAX_SEQ_LEN`;
        stride: seq_len) and every value checked."""
        seq_len = min(n_positions - (bos is not None), DEFAULT_MAX_SEQ_LEN) if seq_len is None else seq_len
        stride = seq_len if stride is None else stride
        check_window(seq_len, stride, n_positions, bos is not None)
        if batch_size < 1:
            raise HeadpruneError(f"batch_size {batch_size} must be at least 1", "batch_size")
        return cls(seq_len, stride, batch_size, bos)

    @classmethod
    def for_model(cls, model: HeadModel, seq_len: int | None = None, stride: int | None = None,
                  batch_size: int = 8) -> Windowing:
        """:meth:`resolve` for ``model``: its positions, and its tokenizer's BOS token before every window."""
        return cls.resolve(model.cfg.n_positions, seq_len, stride, batch_size, model.origin.bos_token_id)

    def batches(self, ids: Tensor) -> list[Batch]:
        """:func:`window_batches` of ``ids``."""
        return window_batches(ids, self.seq_len, self.stride, self.batch_size, self.bos)

    def settings(self) -> dict:
        """Every field, as a progress file's key records it."""
        return {"seq_len": self.seq_len, "stride": self.stride, "batch_size": self.batch_size, "bos": self.bos}

    @property
    def bos_note(self) -> str:
        """``, each after BOS id 2`` where windows start with a BOS token, else empty: for a line that names the
        windows."""
        return "" if self.bos is None else f", each after BOS id {self.bos}"


def bos_setting(windowing: Windowing) -> dict:
    """``{"bos_token_id": id}`` where the windows start with a BOS token, else empty (what a report's settings
    record: runs of models without one are unchanged)."""
    return {} if windowing.bos is None else {"bos_token_id": windowing.bos}


@dataclass
class Perplexity:
    tokens: int
    nll: float
    ppl: float
    windows: int = 0
    nll_se: float = math.nan  # standard error of nll over windows (see window_standard_error)

    @property
    def ppl_se(self) -> float:
        """Standard error of the perplexity by the delta method: d exp(x) = exp(x) dx."""
        return self.ppl * self.nll_se

    def as_dict(self) -> dict:
        return {"tokens": self.tokens, "nll": self.nll, "ppl": self.ppl}


def window_standard_error(sums: Tensor, counts: Tensor) -> float:
    """Standard error of the token-weighted NLL R = Σ_w s_w / Σ_w n_w over W windows (clusters of tokens).

    Windows, not tokens, are the independent draws (neighbouring tokens are correlated), so R is a ratio
    estimator and its linearised (delta-method) variance is

        Var(R) ≈ W / (W − 1) · Σ_w (s_w − R n_w)² / (Σ_w n_w)²

    (Cochran, *Sampling Techniques*, 1977, §6.4; the cluster-robust sandwich for a mean). NaN for one window.
    """
    sums, counts = sums.double(), counts.double()
    windows = len(sums)
    if windows < 2:
        return math.nan
    total = float(counts.sum())
    ratio = float(sums.sum()) / total
    return math.sqrt(windows / (windows - 1) * float(((sums - ratio * counts) ** 2).sum())) / total


def scored_bytes(tokenizer, ids: Tensor, windowing: Windowing) -> int:
    """UTF-8 bytes of the tokens the sliding windows score (each window's new tokens, decoded span by span):
    bits per byte = NLL sum / (ln 2 · bytes)."""
    spans = sliding_windows(len(ids), windowing.seq_len, windowing.stride, windowing.bos is not None)
    return sum(len(tokenizer.decode(ids[w.first_scored:w.end].tolist()).encode("utf-8")) for w in spans)


def check_window(seq_len: int, stride: int, n_positions: int, bos: bool = False) -> None:
    """A window of ``seq_len`` corpus tokens, after a BOS token where ``bos``, fits the model's positions."""
    room = n_positions - bos
    if seq_len < 2:
        raise HeadpruneError(f"seq_len {seq_len} is too short; use at least 2", "seq_len")
    if seq_len > room:
        after_bos = " less one for the BOS token" if bos else ""
        raise HeadpruneError(f"seq_len {seq_len} exceeds the model's n_positions {n_positions}{after_bos}; use "
                             f"<= {room}", "seq_len")
    if not 0 < stride <= seq_len:
        raise HeadpruneError(f"stride {stride} must be in 1..seq_len ({seq_len})", "stride")


def sliding_windows(n_tokens: int, seq_len: int, stride: int, bos: bool = False) -> list[Window]:
    """The guide's windows over a corpus of ``n_tokens`` tokens; after a BOS token (``bos``) a window scores its
    first token too."""
    if n_tokens < 2:
        raise HeadpruneError(f"the corpus has {n_tokens} token(s); at least 2 are needed to score anything")
    if n_tokens < seq_len:
        warn(f"the corpus has only {n_tokens} tokens, shorter than one window of {seq_len}; scoring what there is")
    windows, prev_end = [], 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + seq_len, n_tokens)
        windows.append(Window(begin, end, max(prev_end, begin + (not bos))))
        prev_end = end
        if end == n_tokens:
            break
    return windows


def window_batches(ids: Tensor, seq_len: int, stride: int, batch_size: int, bos: int | None = None) -> list[Batch]:
    """Windows grouped into batches of equal length (only the corpus' last window can be shorter), each after the
    token ``bos`` where one is given."""
    windows = sliding_windows(len(ids), seq_len, stride, bos is not None)
    prefix = ids.new_tensor([] if bos is None else [bos])
    batches: list[Batch] = []
    groups: dict[int, list[Window]] = {}
    for w in windows:
        groups.setdefault(w.end - w.begin, []).append(w)
    for length, group in groups.items():
        for i in range(0, len(group), batch_size):
            chunk = group[i : i + batch_size]
            tokens = torch.stack([torch.cat([prefix, ids[w.begin : w.end]]) for w in chunk])
            target_pos = torch.arange(1 - len(prefix), length)  # window-relative position of each target
            mask = torch.stack([target_pos >= w.first_scored - w.begin for w in chunk])
            batches.append(Batch(tokens, mask))
    return batches


def window_sums(nll: Tensor, mask: Tensor) -> list[float]:
    """Σ of the scored NLLs of each window: nll and mask (b, L-1) -> [b] (float64 sums, as a list)."""
    return (nll.double() * mask).sum(1).tolist()


def batch_nll_sum(model: HeadModel, batch: Batch, **forward_kwargs) -> tuple[Tensor, int]:
    """Sum of scored next-token NLLs (fp64 scalar) and their count for one batch."""
    batch = batch.to(model.device)
    nll = model_nll(model, batch.tokens, **forward_kwargs)  # (b, L-1)
    return (nll.double() * batch.mask).sum(), int(batch.mask.sum())


@torch.no_grad()
def evaluate(
    model: HeadModel,
    ids: Tensor,
    windowing: Windowing | None = None,
    *,
    progress: bool = True,
    **forward_kwargs,
) -> Perplexity:
    """Token-weighted NLL and perplexity of ``model`` on ``ids`` (1-D) with sliding windows (default:
    :meth:`Windowing.for_model`)."""
    windowing = windowing or Windowing.for_model(model)
    check_window(windowing.seq_len, windowing.stride, model.cfg.n_positions, windowing.bos is not None)
    total, count = 0.0, 0
    sums, counts = [], []  # per window, for the standard error
    for batch in tqdm(windowing.batches(ids), desc="perplexity", disable=not progress, leave=False):
        batch = batch.to(model.device)
        nll = model_nll(model, batch.tokens, **forward_kwargs).double() * batch.mask  # (b, L-1)
        total += nll.sum().item()
        count += int(batch.mask.sum())
        sums.append(nll.sum(dim=1).cpu())
        counts.append(batch.mask.sum(dim=1).cpu())
    mean = total / count
    se = window_standard_error(torch.cat(sums), torch.cat(counts))
    return Perplexity(count, mean, math.exp(mean), len(torch.cat(counts)), se)
