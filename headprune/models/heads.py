"""Head identifiers: a head is (layer, ORIGINAL head index), written ``L{layer}H{head}``.

The original index survives pruning: after removing L0H1 from a 4-head layer, that layer holds heads
0, 2, 3 (``cfg.kept_heads[0] == [0, 2, 3]``) and L0H2 still names the same weights.

A head spec is a comma-separated list of ids, e.g. ``"L0H1, l3h2"``: whitespace and the case of the
letters do not matter, duplicates are dropped, the result is sorted by (layer, head).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from headprune.errors import HeadpruneError

if TYPE_CHECKING:  # torch-free at import: the report ranks heads without a model
    from headprune.models.base import HeadModel
    from headprune.models.head_config import HeadConfig

# One id: L <int> H <int>, signs allowed so that "L0H-1" gets a precise message instead of "garbage".
_ID = re.compile(r"\s*[lL]\s*([+-]?[0-9]+)\s*[hH]\s*([+-]?[0-9]+)\s*", re.ASCII)
_SHOW = 40  # characters of a bad item quoted in a message


def head_id(layer: int, head: int) -> str:
    """(layer, original head index) -> ``"L{layer}H{head}"``."""
    return f"L{int(layer)}H{int(head)}"


def group_id(layer: int, kv_head: int) -> str:
    """(layer, original KV head index) -> ``"L{layer}G{kv_head}"``: a KV group of a grouped-query model."""
    return f"L{int(layer)}G{int(kv_head)}"


def format_heads(heads: Iterable[tuple[int, int]]) -> str:
    """The head spec of ``heads``, e.g. ``"L0H1,L3H2"`` (inverse of :func:`parse_head_spec`)."""
    return ",".join(head_id(layer, head) for layer, head in heads)


def _config(model_or_cfg: HeadModel | HeadConfig) -> HeadConfig:
    import torch

    # a model of any family is an nn.Module holding its config as .cfg
    return model_or_cfg.cfg if isinstance(model_or_cfg, torch.nn.Module) else model_or_cfg


def _quote(item: str) -> str:
    return repr(item if len(item) <= _SHOW else item[:_SHOW] + "...")  # repr keeps the message on one line


def parse_head_id(item: str) -> tuple[int, int]:
    """``"L3H2"`` (any case, inner whitespace allowed) -> (3, 2); no range check."""
    m = _ID.fullmatch(item)
    if m is None:
        raise HeadpruneError(f"bad head id {_quote(item)}; write heads as L<layer>H<head>, e.g. L0H1,L3H2")
    return int(m.group(1)), int(m.group(2))


def check_head(model_or_cfg: HeadModel | HeadConfig, layer: int, head: int) -> None:
    """HeadpruneError unless the model holds head (layer, head): layer in range, head in range and kept."""
    cfg = _config(model_or_cfg)
    name = head_id(layer, head)
    if not 0 <= layer < cfg.n_layers:
        raise HeadpruneError(f"head {name}: the model has no layer {layer} (layers 0..{cfg.n_layers - 1})")
    if not 0 <= head < cfg.n_heads:
        raise HeadpruneError(f"head {name}: the model has no head {head} (heads 0..{cfg.n_heads - 1} per layer)")
    if head not in cfg.kept_heads[layer]:
        raise HeadpruneError(
            f"head {name} was already pruned from this model; layer {layer} keeps heads {cfg.kept_heads[layer]}"
        )


def check_heads(model_or_cfg: HeadModel | HeadConfig, heads: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Validate (layer, head) pairs against the model; return them deduplicated and sorted. Each index must be a
    whole number (an int, or a numpy/torch integer): 1.5 or True is refused, never rounded."""
    import numbers

    def index(x) -> int:
        if isinstance(x, bool) or not isinstance(x, numbers.Integral) and not (
                hasattr(x, "dtype") and getattr(x, "ndim", 1) == 0 and "int" in str(x.dtype)):
            raise HeadpruneError(f"head index {x!r} must be a whole number (layer, head), e.g. (0, 1)")
        return int(x)

    try:
        pairs = [(index(layer), index(head)) for layer, head in heads]
    except (TypeError, ValueError):
        raise HeadpruneError("heads must be (layer, head) pairs of whole numbers, e.g. [(0, 1), (2, 3)]") from None
    out = sorted(set(pairs))
    for layer, head in out:
        check_head(model_or_cfg, layer, head)
    return out


def parse_head_spec(spec: str, model_or_cfg: HeadModel | HeadConfig) -> list[tuple[int, int]]:
    """``"L0H1, L3H2"`` -> [(0, 1), (3, 2)]: sorted, deduplicated, every head present in the model.

    Empty items (``"L0H1,,L1H0,"``) are skipped; a spec naming no head at all is an error.
    """
    if not isinstance(spec, str):
        raise HeadpruneError(f"head spec must be a string like L0H1,L3H2, not {type(spec).__name__}")
    items = [item for item in spec.split(",") if item.strip()]
    if not items:
        raise HeadpruneError(f"head spec {_quote(spec)} names no head; write heads as L<layer>H<head>, e.g. L0H1,L3H2")
    return check_heads(model_or_cfg, (parse_head_id(item) for item in items))
