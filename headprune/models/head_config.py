"""The hyper-parameters every model family shares, the query heads each layer keeps, and where the weights came
from."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Origin:
    """Where a model's weights came from: what the user asked to load, the folder read, and the token its
    tokenizer puts before every text (Gemma's ``<bos>``), which every window of a corpus then starts with."""

    source: str | None = None
    folder: Path | None = None
    bos_token_id: int | None = None  # None: the tokenizer puts no token before a text (GPT-2, SmolLM2)


Head = tuple[int, int]  # (layer, original query head index)


@dataclass
class HeadConfig:
    """Hyper-parameters every family has, and the query heads each layer keeps (original indices)."""

    vocab_size: int = 256
    n_positions: int = 2048  # max_position_embeddings
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4  # query heads per layer before pruning
    n_kv_heads: int = 4  # key/value heads per layer before pruning (n_heads for multi-head attention)
    d_head: int = 16  # may differ from d_model / n_heads (Qwen3, Mistral's head_dim)
    d_mlp: int = 256
    tie_word_embeddings: bool = False
    o_bias: bool = False  # whether the checkpoint stores an o_proj bias (the model always has b_O, zero if not)
    kept_heads: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_sizes(self, ("vocab_size", "n_positions", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_head",
                           "d_mlp"))
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        self.kept_heads = checked_kept_heads(self.kept_heads, self.n_heads, self.n_layers)

    @property
    def group_size(self) -> int:
        """Query heads per KV head before pruning (1: multi-head attention)."""
        return self.n_heads // self.n_kv_heads

    def kv_head(self, head: int) -> int:
        """The original KV head that original query head ``head`` reads: ⌊head / group_size⌋."""
        return head // self.group_size

    def kept_kv_heads(self, layer: int) -> list[int]:
        """Original indices of the KV heads layer ``layer`` keeps: those serving one of its kept query heads."""
        return sorted({self.kv_head(h) for h in self.kept_heads[layer]})

    @property
    def is_pruned(self) -> bool:
        return any(len(k) != self.n_heads for k in self.kept_heads)

    def as_dict(self) -> dict:
        return asdict(self)


def check_eps(config: object, name: str) -> None:
    """``config.name`` is a norm's ε: a number in (0, 1) (a negative ε makes the norm's root NaN)."""
    eps = getattr(config, name)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0 < eps < 1:
        raise ValueError(f"{name} must be a number in (0, 1), got {eps!r}")


def check_sizes(config: object, names: tuple[str, ...]) -> None:
    """Each of ``names`` on ``config`` is a positive integer (a damaged config.json fails here, not as a
    ZeroDivisionError or a 100 GB allocation)."""
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def checked_kept_heads(kept_heads: list[list[int]], n_heads: int, n_layers: int) -> list[list[int]]:
    """``kept_heads`` (every head of every layer when empty), checked: per layer, sorted distinct original indices
    below ``n_heads``."""
    kept = kept_heads or [list(range(n_heads)) for _ in range(n_layers)]
    if len(kept) != n_layers or any(
        not isinstance(k, list) or k != sorted(set(k)) or any(not isinstance(h, int) or not 0 <= h < n_heads
                                                              for h in k) for k in kept
    ):
        raise ValueError(f"kept_heads must list sorted distinct head indices below {n_heads} for each of "
                         f"{n_layers} layers; got {kept}")
    return kept
