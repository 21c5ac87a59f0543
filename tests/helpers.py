"""Test helpers shared by several test modules: checkpoint builders, corpora, and the HF perplexity loop."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

TINY = {"vocab_size": 50257, "n_positions": 64, "n_embd": 32, "n_layer": 3, "n_head": 4, "initializer_range": 0.2}
# the patching tests' model: TINY with a 96-token vocabulary (random-token tasks), 32 positions, seed 1
PATCH_CFG = {**TINY, "vocab_size": 96, "n_positions": 32, "bos_token_id": 0, "eos_token_id": 0}
PATCH_SEED = 1


def save_hf_gpt2(folder, seed: int = 0, **config) -> GPT2LMHeadModel:
    """A seeded random-init GPT2LMHeadModel saved with save_pretrained into ``folder``."""
    torch.manual_seed(seed)
    hf = GPT2LMHeadModel(GPT2Config(**config)).eval()
    hf.save_pretrained(folder)
    return hf


def guide_loop(hf, ids, max_length, stride, bos=None):
    """"Perplexity of fixed-length models", with the tokens really scored after the label shift counted; each
    window after the token ``bos`` where one is given."""
    encodings = ids.view(1, -1)
    seq_len = encodings.size(1)
    prefix = encodings.new_tensor([[bos]] if bos is not None else [[]])
    nll_sum, n_tokens, prev_end_loc = 0.0, 0, 0
    for begin_loc in range(0, seq_len, stride):
        end_loc = min(begin_loc + max_length, seq_len)
        trg_len = end_loc - prev_end_loc
        input_ids = torch.cat([prefix, encodings[:, begin_loc:end_loc]], dim=1)
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        num_loss_tokens = (target_ids[:, 1:] != -100).sum().item()
        if num_loss_tokens:  # a one-token last window scores nothing (its loss would be 0/0)
            with torch.no_grad():
                nll_sum += hf(input_ids, labels=target_ids).loss.item() * num_loss_tokens
        n_tokens += num_loss_tokens
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break
    return nll_sum / n_tokens, n_tokens


def write_corpus(path: Path, topics: int = 30, chars: int = 12000) -> Path:
    """A small English text file: the first ``topics`` pydoc topics joined, cut to ``chars`` characters."""
    import pydoc_data.topics

    path.write_text(" ".join(list(pydoc_data.topics.topics.values())[:topics])[:chars])
    return path


def random_tokens(vocab: int = 50257, B: int = 2, T: int = 24, seed: int = 0) -> torch.Tensor:
    """(B, T) token ids, seeded."""
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def module_inputs(modules, forward) -> dict[int, torch.Tensor]:
    """The first positional input (its batch row 0) of each of ``modules`` during ``forward()``, by index:
    e.g. every layer's concatenated head outputs z, the input of c_proj / o_proj."""
    found: dict[int, torch.Tensor] = {}
    handles = [m.register_forward_pre_hook(lambda _m, a, i=i: found.__setitem__(i, a[0][0].clone()))
               for i, m in enumerate(modules)]
    try:
        with torch.no_grad():
            forward()
    finally:
        for handle in handles:
            handle.remove()
    return found


# Llama: GQA 2 (6 query heads, 3 KV heads); Qwen2: GQA 3 with q/k/v biases; Gemma 3: GQA 2, a sliding and a global
# layer, its norms around attention
GQA_FAMILIES = ("llama", "qwen2", "gemma3")


def save_gqa_family(name: str, folder, vocab: int, seed: int):
    """A seeded random transformers model of ``name`` (:data:`GQA_FAMILIES`), its biases and norm weights moved off
    their init (so their handling is tested), saved into ``folder``; returns it."""
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    shape = {"vocab_size": vocab, "num_hidden_layers": 2, "max_position_embeddings": 64, "initializer_range": 0.15}
    model_cls, cfg = {
        "llama": (LlamaForCausalLM, LlamaConfig(hidden_size=48, num_attention_heads=6, num_key_value_heads=3,
                                                intermediate_size=64, **shape)),
        "qwen2": (Qwen2ForCausalLM, Qwen2Config(hidden_size=36, num_attention_heads=3, num_key_value_heads=1,
                                                intermediate_size=40, **shape)),
        "qwen3": (Qwen3ForCausalLM, Qwen3Config(hidden_size=48, num_attention_heads=4, num_key_value_heads=2,
                                                head_dim=10, intermediate_size=40, **shape)),
        "gemma3": (Gemma3ForCausalLM, Gemma3TextConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                                       head_dim=12, intermediate_size=40, sliding_window=6,
                                                       layer_types=["sliding_attention", "full_attention"], **shape)),
    }[name]
    torch.manual_seed(seed)
    hf = model_cls(cfg).eval()
    with torch.no_grad():
        for param_name, p in hf.named_parameters():
            if param_name.endswith("bias") or "norm" in param_name:
                p.add_(0.3 * torch.randn_like(p))
    hf.save_pretrained(folder)
    return hf


def edit_config(folder: Path, edits: dict, delete: object = None) -> Path:
    """Set each key of ``edits`` in ``folder``'s config.json (a value that ``is delete`` removes the key)."""
    import json

    path = Path(folder) / "config.json"
    config = json.loads(path.read_text())
    for key, value in edits.items():
        if value is delete:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))
    return Path(folder)


def vocab_gguf(path, vocab: int):
    """A GGUF holding only a tokenizer of ``vocab`` tokens (the 256 byte tokens, then fillers): the tokenizer source
    of the tiny random models."""
    from gguf import GGUFWriter

    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]  # GPT-2's byte -> character map
    extra = iter(range(256, 512))
    tokens = [chr(b) if b in printable else chr(next(extra)) for b in range(256)]
    tokens += ["ab"] + [f"<x{i}>" for i in range(vocab - 258)]  # one merge: llama.cpp's BPE needs merges
    tokens.append("<|endoftext|>")  # transformers' reading of a gpt2-style GGUF tokenizer adds it where it is missing
    writer = GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * vocab)
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def hf_zeroed_sums(hf, tokens, mask, heads, d_head: int = TINY["n_embd"] // TINY["n_head"]):
    """NLL sum of each window (``tokens`` (b, T), ``mask`` (b, T−1)) with the c_proj input slices of ``heads``
    zeroed in Hugging Face's GPT-2 ``hf``: zero ablation computed by transformers."""

    def zero(layer):
        def hook(_module, args):
            x = args[0].clone()
            for l, h in heads:
                if l == layer:
                    x[..., h * d_head:(h + 1) * d_head] = 0
            return (x,)
        return hook

    handles = [blk.attn.c_proj.register_forward_pre_hook(zero(l)) for l, blk in enumerate(hf.transformer.h)]
    try:
        with torch.no_grad():
            logits = hf(tokens).logits[:, :-1].double()
    finally:
        for handle in handles:
            handle.remove()
    nll = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
    return (nll * mask).sum(1).tolist()
