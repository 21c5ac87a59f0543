"""GPT-2's hyper-parameters (Hugging Face's ``GPT2Config`` fields headprune uses) on the shared
:class:`~.head_config.HeadConfig`, and the heads each layer keeps after pruning; read from and written to
``config.json``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from headprune.models.head_config import HeadConfig, check_eps

#: The fields a GPT-2 config.json determines; n_kv_heads (= n_heads), d_head (= d_model / n_heads) and o_bias
#: (always) follow from them.
_OWN_FIELDS = ("vocab_size", "n_positions", "d_model", "n_layers", "n_heads", "d_mlp", "layer_norm_eps",
               "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "tie_word_embeddings", "kept_heads")


GPT2_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")  # GELU's tanh approximation, as models.gpt2.MLP computes it


@dataclass
class GPT2Config(HeadConfig):
    """GPT-2 hyper-parameters: multi-head attention (n_kv_heads = n_heads), d_head = d_model / n_heads, biases on
    every projection (c_proj's is b_O), plus the heads each layer keeps (original indices) after pruning."""

    vocab_size: int = 50257
    n_positions: int = 1024
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12  # heads per layer before pruning
    n_kv_heads: int = 0  # = n_heads (set in __post_init__)
    d_head: int = 0  # = d_model / n_heads (set in __post_init__)
    d_mlp: int = 3072
    tie_word_embeddings: bool = True
    o_bias: bool = True
    kept_heads: list[list[int]] = field(default_factory=list)
    layer_norm_eps: float = 1e-5
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False

    def __post_init__(self) -> None:
        check_eps(self, "layer_norm_eps")
        for name in ("scale_attn_weights", "scale_attn_by_inverse_layer_idx", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.kept_heads, list) or not all(
            isinstance(k, list) and all(isinstance(h, int) and not isinstance(h, bool) for h in k)
            for k in self.kept_heads
        ):
            raise ValueError(f"kept_heads must be a list of lists of head indices, got {self.kept_heads!r}")
        for name in ("d_model", "n_heads"):  # checked again with the rest below; needed for the division first
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        self.n_kv_heads, self.d_head, self.o_bias = self.n_heads, self.d_model // self.n_heads, True
        super().__post_init__()

    @classmethod
    def from_hf(cls, hf: dict) -> GPT2Config:
        """Build from a Hugging Face GPT-2 ``config.json`` dict (plus headprune's ``kept_heads`` if any)."""
        if hf.get("activation_function", "gelu_new") not in GPT2_ACTIVATIONS:
            raise ValueError(f"activation_function {hf['activation_function']!r}: headprune's GPT-2 computes GELU's "
                             f"tanh approximation ({', '.join(GPT2_ACTIVATIONS)})")
        d_model = hf["n_embd"]
        return cls(
            vocab_size=hf["vocab_size"],
            n_positions=hf.get("n_positions", 1024),  # GPT2Config's default
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
        """The fields config.json determines (the derived ones left out)."""
        return {k: v for k, v in asdict(self).items() if k in _OWN_FIELDS}
