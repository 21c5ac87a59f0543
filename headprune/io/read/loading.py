"""Load checkpoints (hub id, HF cache, local directory, GGUF file, shipped or packaged model) of every family.

One loader for every family of :data:`~headprune.models.families.REGISTRY`: the config is read by the family's
reader and checked against every weight's name, shape and dtype (from the file headers); then the tensors stream
one at a time (safetensors shards, or a memory-mapped ``pytorch_model.bin``) into a model built on the meta device:
no randomly initialised copy, no second full copy, so GPT-2 XL loads within its own size plus one tensor. Keys are
renamed by the family record (:meth:`~headprune.models.families.ModelFamily.our_key`); the model records where it came
from in ``model.origin``."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch

from headprune.errors import HeadpruneError, config_error
from headprune.io.read.checkpoint import CheckpointReader, all_finite
from headprune.io.read.sources import resolve_source
from headprune.io.read.tokenizer import model_bos
from headprune.models.base import HeadModel
from headprune.models.families import REGISTRY, SUPPORTED, ModelFamily
from headprune.models.folding import fold_value_biases_
from headprune.models.head_config import HeadConfig, Origin
from headprune.models.meta import on_meta
from headprune.schema import DEFAULT_MODEL

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


def parse_config_json(folder: Path) -> dict:
    """``folder/config.json`` as a dict; a missing, damaged or non-object file is refused."""
    path = folder / "config.json"
    if not path.is_file():
        raise HeadpruneError(f"{folder} has no config.json; it is not a Hugging Face model directory")
    try:
        hf = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise HeadpruneError(f"{path} is not valid JSON ({err}); the checkpoint is damaged") from None
    if not isinstance(hf, dict):
        raise HeadpruneError(f"{path} must hold a JSON object, not {type(hf).__name__}; the checkpoint is damaged")
    return hf


def read_model_config(folder: Path) -> tuple[ModelFamily, HeadConfig]:
    """(registry entry, config) of a model directory; a model type headprune does not support, or a config that
    cannot build its model, is refused."""
    hf = parse_config_json(folder)
    model_type = hf.get("model_type")
    if model_type not in REGISTRY:
        held = "has no model_type" if model_type is None else f"holds a {model_type!r} model"
        raise HeadpruneError(f"{folder / 'config.json' if model_type is None else folder} {held}; headprune supports "
                             f"model_type {', '.join(repr(t) for t in SUPPORTED)}")
    family = REGISTRY[model_type]
    try:
        return family, family.read_config(hf)
    except (KeyError, ValueError, TypeError) as err:
        raise config_error(str(folder / "config.json"), model_type, err) from None


def zero_filled(cfg: HeadConfig, key: str) -> bool:
    """Whether our ``key`` may be absent from the checkpoint: b_O of a family without an o_proj bias."""
    return not cfg.o_bias and key.endswith((".attn.o_proj.bias", ".attn.dense.bias"))


def load_model(
    source: str | os.PathLike = DEFAULT_MODEL,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = torch.float32,
    check_finite: bool = True,
    fold_value_bias: bool = False,
) -> HeadModel:
    """Load a checkpoint of any family of :data:`~headprune.models.families.REGISTRY` into its
    :class:`~headprune.models.base.HeadModel`, on ``device`` in ``dtype``, in eval mode.

    ``model.origin`` records where it came from and the BOS token its tokenizer puts before every text.
    ``fold_value_bias``: fold every head's value bias into b_O (:func:`headprune.models.folding.fold_value_biases`),
    done in float32 before the cast to ``dtype``."""
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    check_device_dtype(device, dtype)
    folder = resolve_source(source)
    family, cfg = read_model_config(folder)
    reader = CheckpointReader(folder)
    cfg = untie_if_distinct(cfg, family, reader)
    with on_meta():  # shapes only: nothing is allocated, an absurd config included
        model = family.model_class(cfg)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    names = checkpoint_names(folder, family, cfg, reader, expected)
    # One tensor at a time: read, check, cast and move it, then let the model own it (assign=True: no copy into
    # randomly initialised parameters). Peak memory is the model plus one tensor. Folding runs in float32.
    load_dtype = torch.float32 if fold_value_bias else dtype
    state = {}
    for key, shape in expected.items():
        if key not in names:  # an o_proj bias the family does not have: zero
            state[key] = torch.zeros(shape, device=device, dtype=load_dtype)
            continue
        tensor = reader.get(names[key])
        if check_finite and not all_finite(tensor):
            raise HeadpruneError(f"{folder}: weights contain NaN or inf (first: {names[key]}); the checkpoint is "
                                 "broken")
        state[key] = tensor.to(device=device, dtype=load_dtype)
        del tensor
    del reader
    model.load_state_dict(state, assign=True)
    del state
    model.origin = Origin(str(source), folder)
    model.origin = dataclasses.replace(model.origin, bos_token_id=model_bos(model))
    if fold_value_bias:
        fold_value_biases_(model)
        model.to(dtype=dtype)  # parameter by parameter: the float32 model plus one cast tensor at the peak
    return model.eval().requires_grad_(False)


def checkpoint_names(folder: Path, family: ModelFamily, cfg: HeadConfig, reader: CheckpointReader,
                     expected: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """{our key: the checkpoint's (HF) key} for the model whose state-dict shapes are ``expected``; refused unless
    the checkpoint holds every weight (but a zero-filled b_O) and nothing else, each floating point and of the
    shape the config implies."""
    ours = {k: our for k in reader.specs if (our := family.our_key(k)) is not None}  # HF key -> ours
    if cfg.tie_word_embeddings:  # a tied checkpoint storing the embedding's copy as its LM head: the embedding
        ours = {k: v for k, v in ours.items() if not v.startswith(family.lm_head + ".")}
    names = {our: hf for hf, our in ours.items()}  # ours -> HF key
    missing = sorted(k for k in expected if k not in names and not zero_filled(cfg, k))
    unexpected = sorted(hf for hf, our in ours.items() if our not in expected)
    if missing or unexpected:
        raise HeadpruneError(f"{folder} is not a {family.architecture} checkpoint matching its config: missing "
                             f"{[family.hf_key(k) for k in missing[:3]]}, unexpected {unexpected[:3]}")
    for key, hf_key in names.items():
        shape, is_float = reader.specs[hf_key]
        if shape != expected[key]:
            raise HeadpruneError(f"{folder}: weight {hf_key} has shape {shape}, config implies {expected[key]}")
        if not is_float:  # never cast integers silently
            raise HeadpruneError(f"{folder}: weight {hf_key} is not floating point; checkpoints hold float weights")
    return names


def untie_if_distinct(cfg: HeadConfig, family: ModelFamily, reader: CheckpointReader) -> HeadConfig:
    """``cfg`` untied where a tied config's checkpoint stores its own LM head with other values than the
    embedding, as transformers loads it (both present and different: it does not tie them)."""
    head = family.lm_head + ".weight"
    if not cfg.tie_word_embeddings or head not in reader.specs:
        return cfg
    ours = f"{family.model_class.embedding_name}.weight"
    embedding = next((k for k in reader.specs if family.our_key(k) == ours), None)
    if embedding is None or reader.specs[head] != reader.specs[embedding]:
        return cfg
    if torch.equal(reader.get(head), reader.get(embedding)):
        return cfg
    return dataclasses.replace(cfg, tie_word_embeddings=False)


def resolve_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise HeadpruneError(f"unknown device {device!r}; use auto, cpu or cuda") from None
    if resolved.type not in ("cpu", "cuda"):  # meta, mps, xpu, ...: torch knows them, headprune runs on cpu and cuda
        raise HeadpruneError(f"device {device!r} is not supported; use auto, cpu or cuda")
    if resolved.type == "cuda" and resolved.index is not None and resolved.index >= torch.cuda.device_count():
        raise HeadpruneError(f"device {device!r} does not exist: this machine has {torch.cuda.device_count()} CUDA "
                             "GPU(s); use cuda:0.. or cpu")
    return resolved


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise HeadpruneError(f"unknown dtype {dtype!r}; use fp32, bf16 or fp16")
    return DTYPES[dtype]


def check_device_dtype(device: torch.device, dtype: torch.dtype) -> None:
    """Fail early, with a clear message, where the device cannot run the dtype."""
    if device.type == "cuda" and not torch.cuda.is_available():
        raise HeadpruneError("device cuda requested but no CUDA GPU is available; use --device cpu")
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise HeadpruneError("this GPU cannot run bf16; use --dtype fp16 or fp32")
    if device.type == "cpu" and dtype == torch.float16:
        raise HeadpruneError("fp16 is not supported on the CPU (no fast kernels, poor accuracy); use fp32 or bf16")
