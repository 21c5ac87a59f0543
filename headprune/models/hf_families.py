"""Load a Llama / Mistral / Qwen2 / Qwen3 / GPT-NeoX checkpoint from a local HF directory, and its tokenizer.

As for GPT-2 (:mod:`headprune.loading`): the config is checked against every weight's name and shape from the file
headers, then tensors stream one at a time (safetensors, single or sharded, any float dtype) into a model built on
the meta device, each cast to the requested dtype as it arrives, so the peak is the model plus one tensor.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from headprune.errors import HeadpruneError, config_error
from headprune.io.checkpoint import CheckpointReader, all_finite
from headprune.io.loading import check_device_dtype, parse_config_json, resolve_device, resolve_dtype, resolve_source
from headprune.models.base import HeadModel
from headprune.models.families import REGISTRY, SUPPORTED, Family
from headprune.models.head_config import Origin
from headprune.models.meta import on_meta


def family_of(hf: dict, folder: Path) -> Family:
    """The registry entry of a config's model_type, or the refusal naming the supported ones."""
    model_type = hf.get("model_type")
    if model_type not in REGISTRY:
        raise HeadpruneError(f"{folder} holds a {model_type!r} model; headprune supports model_type "
                             f"{', '.join(repr(t) for t in SUPPORTED)}")
    return REGISTRY[model_type]


def read_family_config(folder: Path):
    """(family, config) of a non-GPT-2 model directory."""
    hf = parse_config_json(folder)
    family = family_of(hf, folder)
    try:
        return family, family.read_config(hf)
    except (KeyError, ValueError, TypeError) as err:
        raise config_error(str(folder / "config.json"), hf["model_type"], err) from None


def zero_filled(cfg, key: str) -> bool:
    """Whether our ``key`` may be absent from the checkpoint: b_O of a family without an o_proj bias."""
    return not cfg.o_bias and key.endswith((".attn.o_proj.bias", ".attn.dense.bias"))


def load_family_model(
    source: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = torch.float32,
    check_finite: bool = True,
) -> HeadModel:
    """Load a supported non-GPT-2 checkpoint into its :class:`~.base.HeadModel`, on ``device`` in ``dtype``, eval."""
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    check_device_dtype(device, dtype)
    folder = resolve_source(source)
    family, cfg = read_family_config(folder)
    reader = CheckpointReader(folder)
    with on_meta():  # shapes only: nothing is allocated
        model = family.model_class(cfg)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    ours = {k: our for k in reader.specs if (our := family.our_key(k)) is not None}  # HF key -> ours
    if cfg.tie_word_embeddings:  # a tied checkpoint may still store the head: the embedding is used
        ours = {k: v for k, v in ours.items() if not v.startswith(family.lm_head + ".")}
    names = {our: hf for hf, our in ours.items()}  # ours -> HF key
    missing = sorted(k for k in expected if k not in names and not zero_filled(cfg, k))
    unexpected = sorted(hf for hf, our in ours.items() if our not in expected)
    if missing or unexpected:
        raise HeadpruneError(f"{folder} is not a {type(cfg).__name__} checkpoint matching its config: missing "
                             f"{[family.hf_key(k) for k in missing[:3]]}, unexpected {unexpected[:3]}")
    for key, hf_key in names.items():
        shape, is_float = reader.specs[hf_key]
        if shape != expected[key]:
            raise HeadpruneError(f"{folder}: weight {hf_key} has shape {shape}, config implies {expected[key]}")
        if not is_float:
            raise HeadpruneError(f"{folder}: weight {hf_key} is not floating point; checkpoints hold float weights")
    state = {}
    for key, shape in expected.items():
        if key not in names:  # an o_proj bias the family does not have: zero
            state[key] = torch.zeros(shape, device=device, dtype=dtype)
            continue
        tensor = reader.get(names[key])
        if check_finite and not all_finite(tensor):
            raise HeadpruneError(f"{folder}: weights contain NaN or inf (first: {names[key]}); the checkpoint is "
                                 "broken")
        state[key] = tensor.to(device=device, dtype=dtype)
        del tensor
    del reader
    model.load_state_dict(state, assign=True)
    model.origin = Origin(str(source), folder)
    return model.eval().requires_grad_(False)


def load_family_tokenizer(folder: Path, vocab_size: int | None = None):
    """The model directory's own tokenizer (tokenizer.json, or a SentencePiece model) via AutoTokenizer, checked
    to fit the embedding (``vocab_size`` rows)."""
    from transformers import AutoTokenizer

    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer.model")):
        raise HeadpruneError(f"{folder} has no tokenizer.json or tokenizer.model; a non-GPT-2 model needs its own "
                             "tokenizer files")
    try:
        tok = AutoTokenizer.from_pretrained(folder)
    except Exception as err:  # noqa: BLE001 - tokenizers and transformers raise many kinds on damaged files
        raise HeadpruneError(f"cannot read the tokenizer of {folder} ({type(err).__name__}: "
                             f"{str(err).splitlines()[0][:200] if str(err) else ''})") from None
    if vocab_size is not None and len(tok) > vocab_size:
        raise HeadpruneError(f"the tokenizer has {len(tok)} tokens but the model embeds only {vocab_size}; use the "
                             "model's own tokenizer files")
    return tok
