"""Exports keep what they were given (issue 27, item 3): the source's special token ids in config.json, the
source checkpoint's dtype in model.safetensors (unless --dtype says otherwise), the usual file modes, and a line
telling a transformers user that only --format hf loads there. GPT-2 (its config written from the model's) and Llama
(the source's config.json), both through headprune.io.write.export."""

from __future__ import annotations

import json
import logging
import os
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from headprune.cli.main import main
from headprune.io.read.loading import load_model
from headprune.pruning.prune import prune_model

HEADS = [(0, 1), (1, 2), (1, 3)]
SPEC = "L0H1,L1H2,L1H3"
VOCAB, D, H = 300, 32, 4
DK = D // H
IDS = {"bos_token_id": 5, "eos_token_id": 7, "pad_token_id": 9}  # none of them GPT-2's 50256


def _perturb(hf) -> None:
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "norm" in name or name.startswith("transformer.ln"):
                p.add_(0.3 * torch.randn_like(p))


@pytest.fixture(scope="module")
def gpt2_fp16(tmp_path_factory) -> Path:
    """A random GPT-2 (vocabulary 300, special ids 5/7/9) saved in float16, as the shipped model is."""
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=D, n_layer=2, n_head=H,
                                    initializer_range=0.2, **IDS)).eval()
    _perturb(hf)
    folder = tmp_path_factory.mktemp("gpt2-fp16")
    hf.half().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llama_fp16(tmp_path_factory) -> Path:
    torch.manual_seed(1)
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=D, num_attention_heads=H, num_key_value_heads=2,
                                      intermediate_size=48, num_hidden_layers=2, max_position_embeddings=32,
                                      initializer_range=0.15, bos_token_id=1, eos_token_id=2)).eval()
    _perturb(hf)
    folder = tmp_path_factory.mktemp("llama-fp16")
    hf.half().save_pretrained(folder)
    return folder


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def header_dtypes(path: Path) -> set[str]:
    """The dtypes named in a safetensors header, read from the file's bytes (not through safetensors)."""
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    header.pop("__metadata__", None)
    return {info["dtype"] for info in header.values()}


def modes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def load_quietly(cls, folder: Path):
    """``cls.from_pretrained(folder)`` in float32, and every warning and transformers log message it gave."""
    records, logger = _Records(), logging.getLogger("transformers")
    logger.addHandler(records)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = cls.from_pretrained(folder, dtype=torch.float32).eval()
    finally:
        logger.removeHandler(records)
    return model, records.messages + [str(w.message) for w in caught]


def prune_cli(capsys, model: Path, out: Path, *extra: str) -> str:
    assert main(["prune", "--model", str(model), "--heads", SPEC, "--out", str(out), "--quiet", *extra]) == 0
    return capsys.readouterr().out


def x(seed: int = 3) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- GPT-2

def test_gpt2_hf_export_keeps_fp16_ids_and_loads_without_warning(gpt2_fp16, tmp_path, capsys):
    with umask(0o022):
        out = prune_cli(capsys, gpt2_fp16, tmp_path / "hf", "--format", "hf")
    assert "(float16 weights, the source checkpoint's dtype)" in out
    folder = tmp_path / "hf"
    assert header_dtypes(folder / "model.safetensors") == {"F16"}
    config, source = (json.loads((f / "config.json").read_text()) for f in (folder, gpt2_fp16))
    assert {k: config[k] for k in IDS} == {k: source[k] for k in IDS} == IDS and config["dtype"] == "float16"
    assert set(modes(folder).values()) == {0o644} and "model.safetensors" in modes(folder)
    # the values: the source's fp16 tensors, the removed heads' Q/K/V columns and W_O rows zero (built here)
    want, got = ({k.removeprefix("transformer."): v for k, v in load_file(f / "model.safetensors").items()}
                 for f in (gpt2_fp16, folder))
    for layer, head in HEADS:
        pre = f"h.{layer}.attn."
        for part in range(3):  # q, k, v blocks of c_attn
            cols = slice(part * D + head * DK, part * D + (head + 1) * DK)
            want[pre + "c_attn.weight"][:, cols] = 0
            want[pre + "c_attn.bias"][cols] = 0
        want[pre + "c_proj.weight"][head * DK:(head + 1) * DK] = 0
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == torch.float16 and torch.equal(got[k], want[k]), k
    # stock transformers: no bos/eos complaint, the logits of headprune's pruned model
    hf, messages = load_quietly(GPT2LMHeadModel, folder)
    assert not [m for m in messages if "bos_token_id" in m or "eos_token_id" in m or "50256" in m], messages
    assert (hf.config.bos_token_id, hf.config.eos_token_id, hf.config.pad_token_id) == (5, 7, 9)
    ours = prune_model(load_model(gpt2_fp16), HEADS)
    with torch.no_grad():
        assert (hf(x()).logits - ours(x())).abs().max() <= 1e-4


def test_gpt2_native_export_keeps_fp16_and_says_it_is_not_for_transformers(gpt2_fp16, tmp_path, capsys):
    with umask(0o022):
        out = prune_cli(capsys, gpt2_fp16, tmp_path / "native")
    lines = [line for line in out.splitlines() if "transformers" in line]
    assert len(lines) == 1 and "--format hf" in lines[0] and "not in stock transformers" in lines[0]
    folder = tmp_path / "native"
    assert header_dtypes(folder / "model.safetensors") == {"F16"}
    assert set(modes(folder).values()) == {0o644}
    config = json.loads((folder / "config.json").read_text())
    assert {k: config[k] for k in IDS} == IDS and config["dtype"] == "float16"
    # fp16 -> fp32 (computed) -> fp16 (written) is exact: the reloaded model is the pruned source model
    reloaded, ours = load_model(folder), prune_model(load_model(gpt2_fp16), HEADS)
    assert reloaded.cfg.kept_heads == ours.cfg.kept_heads
    state = ours.state_dict()
    for k, v in reloaded.state_dict().items():
        assert torch.equal(v, state[k]), k
    # a native export re-exported as hf keeps the ids and dtype it got from the first export
    second = load_model(folder)
    from headprune.io.write.export import export_hf

    export_hf(second, tmp_path / "again")
    assert {k: json.loads((tmp_path / "again" / "config.json").read_text())[k] for k in IDS} == IDS
    assert header_dtypes(tmp_path / "again" / "model.safetensors") == {"F16"}
    assert "not in stock transformers" not in prune_cli(capsys, gpt2_fp16, tmp_path / "hf", "--format", "hf")


def test_dtype_given_is_what_is_written(gpt2_fp16, tmp_path, capsys):
    for fmt in ("native", "hf"):
        out = prune_cli(capsys, gpt2_fp16, tmp_path / fmt, "--format", fmt, "--dtype", "bf16")
        assert "(bfloat16 weights, --dtype)" in out
        assert header_dtypes(tmp_path / fmt / "model.safetensors") == {"BF16"}
        assert json.loads((tmp_path / fmt / "config.json").read_text())["dtype"] == "bfloat16"
    out = prune_cli(capsys, gpt2_fp16, tmp_path / "fp32", "--dtype", "fp32")
    assert header_dtypes(tmp_path / "fp32" / "model.safetensors") == {"F32"}


def test_file_modes_follow_the_umask(gpt2_fp16, tmp_path, capsys):
    with umask(0o027):
        prune_cli(capsys, gpt2_fp16, tmp_path / "hf", "--format", "hf")
    assert set(modes(tmp_path / "hf").values()) == {0o640}
    assert (tmp_path / "hf").stat().st_mode & 0o777 == 0o750


# ---------------------------------------------------------------- Llama (the family writer)

@pytest.mark.parametrize("fmt", ["native", "hf"])
def test_llama_export_keeps_fp16_ids_and_modes(fmt, llama_fp16, tmp_path, capsys):
    with umask(0o022):
        out = prune_cli(capsys, llama_fp16, tmp_path / fmt, "--format", fmt)
    folder = tmp_path / fmt
    assert header_dtypes(folder / "model.safetensors") == {"F16"}
    assert set(modes(folder).values()) == {0o644}
    config = json.loads((folder / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["dtype"]) == (1, 2, "float16")
    ours = prune_model(load_model(llama_fp16), HEADS)
    if fmt == "native":
        assert "not in stock transformers" in out
        reloaded = load_model(folder)
        state = ours.state_dict()
        for k, v in reloaded.state_dict().items():
            assert torch.equal(v, state[k]), k
        return
    hf, messages = load_quietly(AutoModelForCausalLM, folder)
    assert not [m for m in messages if "bos_token_id" in m or "eos_token_id" in m], messages
    # the kept values are the source's fp16 numbers exactly
    src, got = load_file(llama_fp16 / "model.safetensors"), load_file(folder / "model.safetensors")
    assert torch.equal(got["model.layers.0.mlp.up_proj.weight"], src["model.layers.0.mlp.up_proj.weight"])
    with torch.no_grad():
        assert (hf(x()).logits - ours(x())).abs().max() <= 1e-4
