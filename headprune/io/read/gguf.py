"""GGUF files (llama.cpp's format) as a model source: dequantized once into a Hugging Face model folder in the cache.

A GGUF holds the weights (any of gguf's quantization types: F32/F16/BF16, Q4_0/Q4_1/Q5_0/Q8_0, the K-quants), the
hyper-parameters as ``{arch}.*`` metadata and the tokenizer as ``tokenizer.ggml.*`` metadata. :func:`gguf_folder`
turns it into ``config.json`` + ``model.safetensors`` (float32, the dequantized values) + the tokenizer files, which
every headprune command and stock transformers then load as any local model folder. The dequantized model *is* the
model: its logits equal transformers' ``from_pretrained(folder, gguf_file=...)``
(tests/oracles/test_real_models.py).

What llama.cpp's converter changed is undone here, as each family's record says
(:attr:`headprune.models.families.ModelFamily.gguf`, :mod:`headprune.models.gguf_names`): ``llama``'s q/k rows
permuted for its rotary layout (the inverse reshapes to (h, d_k/2, 2, d) and swaps axes 1 and 2), ``gemma3``'s
RMSNorm weights stored as 1 + w (1 is subtracted), and what llama.cpp fixes rather than stores (Gemma 3's local rope
base, layer pattern and score scale) set the same way.

The conversion dequantizes one tensor at a time (quantized ones in slices of rows) and holds the float32 state dict
until it is written; the folder is written to a temporary name and renamed when complete, so a
failed or interrupted conversion leaves nothing that looks finished.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from headprune.errors import HeadpruneError
from headprune.io.read.gguf_checks import check_metadata
from headprune.io.read.gguf_deci import (
    DECI_ATTENTION,
    DeciAsLlama,
    DeciRecord,
    check_deci_shapes,
    deci_fields,
    deci_tensor,
    fill_emptied_layers,
)
from headprune.io.read.gguf_metadata import Metadata
from headprune.io.work.files import clear_stale_temporaries, temp_prefix, write_failures
from headprune.models.families import GGUF_ARCHITECTURES, REGISTRY, gguf_arch
from headprune.models.gguf_names import GgufArch

if TYPE_CHECKING:  # torch is imported where a conversion runs: `headprune models` and name checks need none
    import torch

FORMAT_VERSION = 1  # of the converted folder; a new version converts again


def models_cache_dir() -> Path:
    """``$HEADPRUNE_MODELS`` if set, else ``~/.cache/headprune/models``: fetched and converted models."""
    env = os.environ.get("HEADPRUNE_MODELS")
    return Path(env) if env else Path.home() / ".cache" / "headprune" / "models"


def hf_config(meta: Metadata, tensors: dict[str, tuple[int, ...]]) -> dict:
    """The transformers ``config.json`` of a GGUF's metadata; ``tensors``: GGUF name -> shape (rows, cols)."""
    kind = GGUF_ARCHITECTURES[meta.arch]
    family, arch = REGISTRY[kind], gguf_arch(kind)
    d, n_heads, n_layers = int(meta.need("embedding_length")), int(meta.need("attention.head_count")), \
        int(meta.need("block_count"))
    n_kv = meta.model("attention.head_count_kv", n_heads)
    if isinstance(n_kv, list):
        raise HeadpruneError("the GGUF gives a KV head count per layer; headprune needs one count for every layer")
    d_head = int(meta.model("attention.key_length", d // n_heads))
    vocab = tensors["token_embd.weight"][0]
    hf: dict[str, Any] = {
        "model_type": kind, "architectures": [family.architecture], "vocab_size": vocab,
        "hidden_size": d, "intermediate_size": int(meta.need("feed_forward_length")),
        "num_hidden_layers": n_layers, "num_attention_heads": n_heads, "num_key_value_heads": int(n_kv),
        "head_dim": d_head, "max_position_embeddings": int(meta.need("context_length")),
        "rms_norm_eps": float(meta.need("attention.layer_norm_rms_epsilon")),
        "tie_word_embeddings": "output.weight" not in tensors, "dtype": "float32",
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
    }
    theta = float(meta.model("rope.freq_base", arch.rope_theta_default))
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    scaling = meta.model("rope.scaling.type")
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise HeadpruneError(f"the GGUF's rope scaling {scaling!r} is not supported (linear only)")
        rope.update(rope_type="linear", factor=float(meta.need("rope.scaling.factor")))
    if "rope_freqs.weight" in tensors:
        raise HeadpruneError("the GGUF stores rope frequency factors (rope_freqs, Llama 3.1's rope scaling), which "
                             "its metadata does not describe fully; use the model's Hugging Face folder instead")
    hf.update(arch.config(meta, hf, rope))
    if arch.bias_switch and "blk.0.attn_q.bias" in tensors:
        hf["attention_bias"] = True
    return hf


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's rotary permutation of q or k rows [h·d_k, d]."""
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


#: Rows of a quantized tensor dequantized at once: gguf's dequantization makes float32 temporaries several times
#: its output, so a 262,144-row embedding is converted in slices into one preallocated array.
DEQUANT_ROWS = 8192


def _dequantized(tensor: Any) -> np.ndarray:
    """One GGUF tensor as float32, in transformers' (out, in) layout (a new, writable array)."""
    from gguf import GGMLQuantizationType, dequantize

    shape = tuple(int(n) for n in reversed(tensor.shape))
    data = tensor.data
    if tensor.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return np.array(data, dtype=np.float32).reshape(shape)  # a copy: the file's memory map is read-only
    out = np.empty((data.shape[0] if data.ndim > 1 else 1, shape[-1]), dtype=np.float32)
    rows = data if data.ndim > 1 else data.reshape(1, -1)
    try:
        for start in range(0, len(rows), DEQUANT_ROWS):
            part = rows[start:start + DEQUANT_ROWS]
            out[start:start + len(part)] = dequantize(part, tensor.tensor_type).reshape(len(part), -1)
    except NotImplementedError:
        raise HeadpruneError(f"the GGUF tensor {tensor.name} has quantization type {tensor.tensor_type.name}, which "
                             "the gguf package cannot dequantize") from None
    return out.reshape(shape)


def _open(path: Path) -> Any:
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except Exception as err:  # noqa: BLE001 - a damaged file fails in numpy, struct or gguf's own checks
        raise HeadpruneError(f"{path} is not a readable GGUF file ({type(err).__name__}: "
                             f"{str(err).splitlines()[0][:160] if str(err) else 'truncated or corrupt'}); "
                             "fetch it again") from None


#: Keys of a source GGUF that an export or a tokenizer copy writes itself rather than copies.
_NOT_COPIED = ("general.architecture", "general.file_type", "general.quantization_version")


def copy_source_metadata(writer: Any, source: Path, vocab_size: int) -> None:
    """The source GGUF's ``tokenizer.*`` (vocabulary, merges, special ids, chat template) and ``general.*`` keys
    into ``writer`` (a GGUF export, or the tokenizer copy of a deci file), its vocabulary checked against
    ``vocab_size``."""
    reader = _open(source)
    fields = reader.fields
    if "tokenizer.ggml.model" not in fields or "tokenizer.ggml.tokens" not in fields:
        raise HeadpruneError(f"{source} has no tokenizer metadata (tokenizer.ggml.*); a GGUF export needs one")
    n_tokens = len(fields["tokenizer.ggml.tokens"].data)
    if n_tokens != vocab_size:
        raise HeadpruneError(f"the tokenizer of {source} has {n_tokens} tokens, the model {vocab_size} embedding rows; "
                             "pass the GGUF the model was made from")
    for key, field in fields.items():
        if key.startswith(("tokenizer.", "general.")) and key not in _NOT_COPIED:
            sub = field.types[-1] if len(field.types) > 1 else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)


def _state(reader: Any, arch: GgufArch, hf: dict, deci: DeciRecord | None = None) -> dict[str, torch.Tensor]:
    """The dequantized tensors under transformers' names; a headprune ``deci`` export's attention reduced to its
    kept heads (:mod:`headprune.io.read.gguf_deci`)."""
    import torch
    from tqdm import tqdm

    state = {}
    for tensor in tqdm(reader.tensors, desc="dequantizing", unit="tensor", leave=False):
        name = arch.hf_name(tensor.name)
        if name is None:
            raise HeadpruneError(f"the GGUF holds a tensor {tensor.name!r} that a {hf['model_type']} model does not "
                                 "have; headprune cannot map it")
        values = _dequantized(tensor)
        if arch.permute_qk and name.endswith(("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias")):
            heads = hf["num_attention_heads"] if "q_proj" in name else hf["num_key_value_heads"]
            if deci is not None:  # each layer its own counts
                layer = int(tensor.name.split(".")[1])
                heads = deci.heads[layer] if "q_proj" in name else deci.kv_heads[layer]
            values = _unpermute(values, heads)
        if deci is not None and tensor.name.endswith(DECI_ATTENTION):
            kept = deci_tensor(deci, tensor.name, values, hf["head_dim"])
            if kept is None:
                continue
            values = np.ascontiguousarray(kept)
        if arch.norm_offset and name.endswith("norm.weight"):
            values = values - arch.norm_offset
        if not np.isfinite(values).all():
            raise HeadpruneError(f"the GGUF tensor {tensor.name} holds NaN or inf; the file is broken")
        state[name] = torch.from_numpy(values)
    if deci is not None:
        fill_emptied_layers(state, arch, hf)
    return state


def _check_tokenizer(path: Path, meta: Metadata) -> None:
    if meta.get("tokenizer.ggml.model") is None or "tokenizer.ggml.tokens" not in meta.fields:
        raise HeadpruneError(f"{path} has no tokenizer metadata (tokenizer.ggml.*); headprune needs the model's own "
                             "tokenizer")


def _tokenizer(path: Path, out: Path, vocab_size: int, deci: bool = False) -> None:
    """The GGUF's own tokenizer (from its ``tokenizer.ggml.*`` metadata, by transformers' converter), saved; a
    ``deci`` file's (an architecture transformers does not know) through a tensor-less ``llama`` GGUF of its
    tokenizer and general metadata, written beside ``out``."""
    from transformers import AutoTokenizer

    source = path
    if deci:
        from gguf import GGUFWriter

        source = out / "tokenizer-source.gguf"
        writer = GGUFWriter(str(source), "llama")
        copy_source_metadata(writer, path, vocab_size)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    try:
        tok = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    except Exception as err:  # noqa: BLE001 - transformers' converters raise many kinds
        raise HeadpruneError(f"cannot build the tokenizer of {path} from its metadata ({type(err).__name__}: "
                             f"{str(err).splitlines()[0][:160] if str(err) else ''})") from None
    tok.save_pretrained(out)
    if deci:
        source.unlink()


def convert(path: Path, out: Path) -> Path:
    """Write ``path``'s model as a Hugging Face folder ``out`` (atomically: a temporary folder renamed)."""
    from safetensors.torch import save_file

    reader = _open(path)
    meta = Metadata(reader)
    if meta.arch not in GGUF_ARCHITECTURES and meta.arch != "deci":
        raise HeadpruneError(f"{path} holds a GGUF {meta.arch or '(unnamed)'!r} model; headprune reads the GGUF "
                             f"architectures {', '.join(GGUF_ARCHITECTURES)} (and deci, its own uneven exports)")
    shapes = {t.name: tuple(int(n) for n in reversed(t.shape)) for t in reader.tensors}
    if "token_embd.weight" not in shapes:
        raise HeadpruneError(f"{path} has no token_embd.weight tensor; the file is incomplete")
    deci = DeciRecord(meta) if meta.arch == "deci" else None
    if deci is None:
        check_metadata(meta, shapes)  # before any reshape: one line naming the key, its value, what the tensors imply
        hf = hf_config(meta, shapes)
    else:
        as_llama = DeciAsLlama(meta, deci)
        check_deci_shapes(as_llama, deci, shapes)
        hf = hf_config(as_llama, shapes) | deci_fields(deci, shapes)
    out.parent.mkdir(parents=True, exist_ok=True)
    _check_tokenizer(path, meta)
    clear_stale_temporaries(out)  # a killed conversion's folder (its process gone)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(out), suffix=".tmp", dir=out.parent))
    try:
        _tokenizer(path, tmp, hf["vocab_size"], deci is not None)
        state = _state(reader, gguf_arch(hf["model_type"]), hf, deci)
        with write_failures(out):  # a full disk: one line
            save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        del state
        (tmp / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
        (tmp / "headprune_gguf.json").write_text(json.dumps(
            {"source": str(path), "format_version": FORMAT_VERSION, "architecture": meta.arch,
             "file_type": meta.get("general.file_type"), "name": meta.get("general.name")}, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


@contextlib.contextmanager
def locked(target: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``target``'s ``.NAME.lock`` beside it while a process fetches or converts it:
    torchrun's ranks, or two commands started together, wait for the first and then find its result."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def file_key(path: Path) -> str:
    """A name for ``path``'s conversion: its stem and a digest of where it is, its size and its modification time."""
    st = path.stat()
    digest = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{FORMAT_VERSION}".encode()).hexdigest()
    return f"{path.stem}-{digest[:12]}"


def gguf_folder(path: Path, out: Path | None = None) -> Path:
    """The converted folder of the GGUF file ``path`` (``out``, or one in the cache named by :func:`file_key`),
    converting on first use."""
    path = Path(path)
    if not path.is_file():
        raise HeadpruneError(f"GGUF file {path} does not exist")
    out = out or models_cache_dir() / "gguf" / file_key(path)
    if (out / "config.json").is_file():
        return out
    with locked(out):
        if not (out / "config.json").is_file():  # another process may have converted it while this one waited
            print(f"headprune: converting {path.name} ({path.stat().st_size / 2**20:.0f} MiB) into {out} (once)",
                  file=sys.stderr, flush=True)
            convert(path, out)
    return out


def single_gguf(folder: Path) -> Path | None:
    """The one ``.gguf`` file of a folder without config.json (None if there is none); two or more are refused."""
    if (folder / "config.json").is_file():
        return None
    found = sorted(folder.glob("*.gguf"))
    if len(found) > 1:
        raise HeadpruneError(f"{folder} holds {len(found)} GGUF files ({', '.join(f.name for f in found[:3])}); "
                             "pass the one to load as --model FILE.gguf")
    return found[0] if found else None
