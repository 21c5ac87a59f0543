"""Reading checkpoint weights without building a model: safetensors files and shards (headers first: names, shapes,
dtypes) or a ``pytorch_model.bin`` of plain tensors, one tensor at a time."""

from __future__ import annotations

import contextlib
import json
import math
import warnings
from pathlib import Path
from typing import Any

import torch

from headprune.errors import HeadpruneError

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

    def float_dtype(self) -> torch.dtype | None:
        """The floating dtype holding most of the checkpoint's numbers (None when it has no float weights)."""
        sizes: dict[torch.dtype, int] = {}
        for name, (shape, is_float) in self.specs.items():
            if is_float:
                where = self._where[name]
                dtype = where.dtype if isinstance(where, torch.Tensor) else _SAFETENSORS_FLOATS[where[3]]
                sizes[dtype] = sizes.get(dtype, 0) + math.prod(shape)
        return max(sizes, key=lambda d: sizes[d]) if sizes else None

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


def all_finite(tensor: torch.Tensor, chunk: int = 1 << 22) -> bool:
    """No NaN or inf in ``tensor``, checked ``chunk`` elements at a time: a whole-tensor ``isfinite`` would hold a
    bool per element, a quarter of an fp32 embedding (262 MB for Llama-3's 128256 × 2048) on top of the model."""
    flat = tensor.reshape(-1)
    if flat.element_size() == 1:  # fp8 (e4m3, e5m2): torch has no isfinite for it; a chunk in fp16 holds it exactly
        return all(bool(torch.isfinite(part.to(torch.float16)).all()) for part in flat.split(chunk))
    return all(bool(torch.isfinite(part).all()) for part in flat.split(chunk))


@contextlib.contextmanager
def _read_errors(file: Path):
    try:
        yield
    except HeadpruneError:
        raise
    except Exception as err:  # noqa: BLE001 - safetensors, unpickling and I/O raise many kinds
        msg = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise HeadpruneError(f"cannot read weights {file}: corrupt or truncated, or an unsafe pickle ({msg})") from None


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
