"""A transformers model already in memory, read as a headprune model (:func:`from_hf`; the way back is
:func:`headprune.io.write.in_memory.to_hf`).

``from_hf`` reads the model the way :func:`headprune.io.read.loading.load_model` reads its saved copy: the config
through its family's ``read_config`` on ``config.to_dict()``, the weights renamed by the family's ``our_key``, so
scoring the two gives the same numbers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor

from headprune.errors import HeadpruneError, config_error
from headprune.io.read.loading import zero_filled
from headprune.io.read.tokenizer import model_bos
from headprune.models.base import HeadModel
from headprune.models.families import REGISTRY, ModelFamily
from headprune.models.head_config import Origin
from headprune.models.meta import on_meta

if TYPE_CHECKING:
    from transformers import PreTrainedModel

#: The transformers classes :func:`from_hf` takes.
FROM_HF_CLASSES = tuple(f.architecture for f in REGISTRY.values())


def from_hf(hf_model: PreTrainedModel) -> HeadModel:
    """headprune's model with the weights of an in-memory transformers model (copies, on its device and dtype,
    in eval mode): a transformers model of :data:`FROM_HF_CLASSES` gives its family's :class:`HeadModel`.

    An LM head that does not share the embedding's tensor is kept as its own weight, whatever the config says
    (``tie_word_embeddings``), so a model fine-tuned in memory computes what it computed there."""
    import transformers

    config = hf_model.config.to_dict() if isinstance(hf_model, transformers.PreTrainedModel) else {}
    if (family := REGISTRY.get(config.get("model_type", ""))) is not None and isinstance(
            hf_model, getattr(transformers, family.architecture)):
        model = _from_family(hf_model, family, config)
    else:
        raise HeadpruneError(f"from_hf takes a transformers {', '.join(FROM_HF_CLASSES)}; got "
                             f"{type(hf_model).__name__}")
    name = config.get("_name_or_path") or ""
    folder = Path(name).expanduser() if name and Path(name).expanduser().is_dir() else None  # its tokenizer
    model.origin = Origin(f"in-memory {type(hf_model).__name__}" + (f" from {name}" if name else ""), folder)
    model.origin = dataclasses.replace(model.origin, bos_token_id=model_bos(model))
    return model.eval().requires_grad_(False)


def _tied(hf_model: PreTrainedModel) -> bool:
    """Whether the LM head is the embedding's tensor (not merely configured to be)."""
    out, emb = hf_model.get_output_embeddings(), hf_model.get_input_embeddings()
    return out is not None and cast(Tensor, out.weight).data_ptr() == cast(Tensor, emb.weight).data_ptr()


def _from_family(hf_model: PreTrainedModel, family: ModelFamily, config: dict) -> HeadModel:
    try:
        cfg = family.read_config({**config, "tie_word_embeddings": _tied(hf_model)})
    except (KeyError, ValueError, TypeError) as err:
        raise config_error("the model's config", config["model_type"], err) from None
    state = dict(hf_model.state_dict())
    head = next(name for name, module in hf_model.named_modules() if module is hf_model.get_output_embeddings())
    if head != family.lm_head:  # transformers 5 names GPT-NeoX's embed_out lm_head in memory (embed_out on disk)
        state[f"{family.lm_head}.weight"] = state.pop(f"{head}.weight")
    state = {our: v for k, v in state.items() if (our := family.our_key(k)) is not None}
    if cfg.tie_word_embeddings:
        state = {k: v for k, v in state.items() if not k.startswith(family.lm_head + ".")}
    return _assign(family.model_class, cfg, state, lambda key: zero_filled(cfg, key))


def check_weights(state: dict[str, Tensor]) -> None:
    """HeadpruneError unless every weight holds values (not on the meta device), is floating point (not a quantized
    int8 weight) and shares one dtype and one device with the others: what the forward needs."""
    if meta := [k for k, v in state.items() if v.is_meta]:
        raise HeadpruneError(f"the model's weights are on the meta device (first: {meta[0]}): they hold no values; "
                             "load the model's weights before from_hf")
    if ints := [k for k, v in state.items() if not v.is_floating_point()]:
        raise HeadpruneError(f"weight {ints[0]} is {state[ints[0]].dtype}, not floating point (a quantized model?); "
                             "from_hf takes a model in float32, bfloat16 or float16")
    kinds = {(str(v.dtype).removeprefix("torch."), str(v.device)) for v in state.values()}
    if len(kinds) > 1:
        raise HeadpruneError(f"the model's weights mix dtypes or devices ({', '.join(sorted(map(' on '.join, kinds)))})"
                             "; cast it to one first, e.g. hf_model.float()")


def _assign(model_class: type[HeadModel], cfg: Any, state: dict[str, Tensor],
            zero: Callable[[str], bool] = lambda key: False) -> HeadModel:
    """``model_class(cfg)`` built on the meta device, then owning copies of ``state`` (checked against its
    keys and shapes, and finite); a missing key that ``zero(key)`` allows (b_O of a family without an o_proj
    bias) is zeros, on the device and dtype of the state's first weight."""
    with on_meta():
        model = model_class(cfg)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(k for k in set(expected) - set(state) if not zero(k))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise HeadpruneError(f"the model's weights do not match its config: missing {missing[:3]}, unexpected "
                             f"{unexpected[:3]}")
    check_weights(state)
    first = next(iter(state.values()))
    copies = {}
    for key, value in state.items():
        if tuple(value.shape) != expected[key]:
            raise HeadpruneError(f"weight {key} has shape {tuple(value.shape)}, the config implies {expected[key]}")
        if not torch.isfinite(value).all():
            raise HeadpruneError(f"the model's weights contain NaN or inf (first: {key})")
        copies[key] = value.detach().clone()
    for key in set(expected) - set(state):
        copies[key] = torch.zeros(expected[key], device=first.device, dtype=first.dtype)
    model.load_state_dict(copies, assign=True)
    return model
