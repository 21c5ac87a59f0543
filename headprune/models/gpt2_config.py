"""GPT-2's hyper-parameters (Hugging Face's ``GPT2Config`` fields headprune uses) and the heads each layer keeps
after pruning; read from and written to ``config.json``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from headprune.models.head_config import check_sizes, checked_kept_heads


@dataclass
class ModelConfig:
    """GPT-2 hyper-parameters, plus the heads each layer keeps (original indices) after pruning."""

    vocab_size: int = 50257
    n_positions: int = 1024
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12  # heads per layer before pruning
    d_mlp: int = 3072
    layer_norm_eps: float = 1e-5
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    tie_word_embeddings: bool = True
    kept_heads: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_sizes(self, ("vocab_size", "n_positions", "d_model", "n_layers", "n_heads", "d_mlp"))
        eps = self.layer_norm_eps
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0 < eps < 1:
            raise ValueError(f"layer_norm_eps must be a number in (0, 1), got {eps!r}")
        for name in ("scale_attn_weights", "scale_attn_by_inverse_layer_idx", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.kept_heads, list) or not all(
            isinstance(k, list) and all(isinstance(h, int) and not isinstance(h, bool) for h in k)
            for k in self.kept_heads
        ):
            raise ValueError(f"kept_heads must be a list of lists of head indices, got {self.kept_heads!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        self.kept_heads = checked_kept_heads(self.kept_heads, self.n_heads, self.n_layers)

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def is_pruned(self) -> bool:
        return any(len(k) != self.n_heads for k in self.kept_heads)

    @classmethod
    def from_hf(cls, hf: dict) -> ModelConfig:
        """Build from a Hugging Face GPT-2 ``config.json`` dict (plus headprune's ``kept_heads`` if any)."""
        d_model = hf["n_embd"]
        return cls(
            vocab_size=hf["vocab_size"],
            n_positions=hf["n_positions"],
            d_model=d_model,
            n_layers=hf["n_layer"],
            n_heads=hf["n_head"],
            d_mlp=hf.get("n_inner") or 4 * d_model,
            layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
            scale_attn_weights=hf.get("scale_attn_weights", True),
            scale_attn_by_inverse_layer_idx=hf.get("scale_attn_by_inverse_layer_idx", False),
            tie_word_embeddings=hf.get("tie_word_embeddings", True),
            kept_heads=[list(k) if isinstance(k, list) else k for k in hf.get("headprune_kept_heads", [])],
        )

    def to_hf(self) -> dict:
        """The Hugging Face GPT-2 config dict for this model (``headprune_kept_heads`` when pruned)."""
        hf = {
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            "vocab_size": self.vocab_size,
            "n_positions": self.n_positions,
            "n_ctx": self.n_positions,
            "n_embd": self.d_model,
            "n_layer": self.n_layers,
            "n_head": self.n_heads,
            "n_inner": self.d_mlp,
            "activation_function": "gelu_new",
            "layer_norm_epsilon": self.layer_norm_eps,
            "scale_attn_weights": self.scale_attn_weights,
            "scale_attn_by_inverse_layer_idx": self.scale_attn_by_inverse_layer_idx,
            "tie_word_embeddings": self.tie_word_embeddings,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        }
        if self.is_pruned:
            hf["headprune_kept_heads"] = self.kept_heads
        return hf

    def as_dict(self) -> dict:
        return asdict(self)
