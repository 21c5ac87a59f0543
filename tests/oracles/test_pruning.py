"""Pruning against independent computations: Hugging Face's GPT2LMHeadModel with the pruned heads' weights
zeroed by hand, gate masking, mean ablation, hand-derived parameter/FLOP formulas; exports."""

import json

import pytest
import torch
from transformers import GPT2LMHeadModel

from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.io.write.export import export_hf, export_native
from headprune.io.write.export_folder import EXPORT_MARKER
from headprune.models.head_config import Origin
from headprune.models.heads import head_id
from headprune.models.hooks import Capture
from headprune.models.interventions import fill_tensors, mask_gates
from headprune.models.ledger import pruning_stats
from headprune.models.nll import count_params
from headprune.pruning.prune import prune_model, removed_heads

from helpers import random_tokens

D, H, DK = 32, 4, 8  # tiny model
HEADS = [(0, 1), (0, 3), (1, 0), (2, 0), (2, 1), (2, 2)]


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load_model(tiny_dir)


def _hf_zeroed(folder, heads, fills=None):
    """Stock GPT2LMHeadModel with each head's Q/K/V columns, biases and W_O rows zeroed by hand (and the
    fill's contribution z̄ W_O^(i) added to b_O)."""
    hf = GPT2LMHeadModel.from_pretrained(folder).eval()
    with torch.no_grad():
        for layer, head in heads:
            attn = hf.transformer.h[layer].attn
            sl = slice(head * DK, (head + 1) * DK)
            if fills is not None:
                attn.c_proj.bias += fills[(layer, head)] @ attn.c_proj.weight[sl]
            attn.c_proj.weight[sl] = 0
            for part in range(3):
                cols = slice(part * D + head * DK, part * D + (head + 1) * DK)
                attn.c_attn.weight[:, cols] = 0
                attn.c_attn.bias[cols] = 0
    return hf


def _mean_fills(model, tokens):
    """z̄ of every head: its output averaged over batch and positions, {(layer, head): [d_head]}."""
    capture = Capture()
    with torch.no_grad():
        model(tokens, capture=capture)
    return {(l, h): capture.z[l][:, p].mean((0, 1)) for l, kept in enumerate(model.cfg.kept_heads)
            for p, h in enumerate(kept)}


def _maxdiff(a, b):
    return (a - b).abs().max().item()


# ---------------------------------------------------------------- physical pruning

def test_pruned_equals_masked_equals_hf_zeroed(tiny, tiny_dir):
    before = {k: v.clone() for k, v in tiny.state_dict().items()}
    pruned = prune_model(tiny, HEADS)
    x = random_tokens()
    with torch.no_grad():
        p, m, r = pruned(x), tiny(x, gates=mask_gates(tiny, HEADS)), _hf_zeroed(tiny_dir, HEADS)(x).logits
        full = tiny(x)
    assert _maxdiff(p, m) <= 1e-4 and _maxdiff(p, r) <= 1e-4
    assert _maxdiff(p, full) > 1e-2  # the heads mattered
    assert pruned.cfg.kept_heads == [[0, 2], [1, 2, 3], [3]]
    assert [tuple(b.attn.c_attn.weight.shape) for b in pruned.h] == [(D, 3 * 2 * DK), (D, 9 * DK), (D, 3 * DK)]
    assert [tuple(b.attn.c_proj.weight.shape) for b in pruned.h] == [(2 * DK, D), (3 * DK, D), (DK, D)]
    assert all(torch.equal(v, tiny.state_dict()[k]) for k, v in before.items())  # input untouched
    assert count_params(tiny) - count_params(pruned) == len(HEADS) * (3 * D * DK + 3 * DK + DK * D)


def test_shared_pruning_holds_the_inputs_unchanged_tensors_and_equals_the_copy(tiny):
    """share=True (the curve's evaluated points): the same model bit for bit, holding the input's own storage for
    every tensor pruning leaves as it is (layer 1 here, the embeddings, the MLPs) and new tensors for the rest;
    the default holds no storage of the input."""
    heads = [(0, 1), (2, 0)]
    x = random_tokens()
    shared, copied = prune_model(tiny, heads, share=True), prune_model(tiny, heads)
    with torch.no_grad():
        assert torch.equal(shared(x), copied(x))
    ours = {v.data_ptr() for v in tiny.state_dict().values()}
    held = {k: v.data_ptr() in ours for k, v in shared.state_dict().items()}
    touched = lambda k: k.startswith(("h.0.attn.", "h.2.attn."))
    assert all(held[k] != touched(k) for k in held), [k for k in held if held[k] == touched(k)]
    assert not any(v.data_ptr() in ours for v in copied.state_dict().values())


def test_pruned_heads_keep_their_weights(tiny):
    pruned = prune_model(tiny, HEADS)
    for layer, kept in enumerate(pruned.cfg.kept_heads):
        a, b = tiny.h[layer].attn, pruned.h[layer].attn
        for p, h in enumerate(kept):
            for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V"):
                assert torch.equal(getattr(b, name)[p], getattr(a, name)[h]), (layer, h, name)
        assert torch.equal(b.b_O, a.b_O)


def test_layer_pruned_to_zero_heads(tiny, tiny_dir):
    heads = [(1, h) for h in range(H)] + [(0, 2)]
    pruned = prune_model(tiny, heads)
    assert pruned.cfg.kept_heads[1] == [] and pruned.h[1].attn.n_heads == 0
    assert pruned.h[1].attn.c_attn.weight.shape == (D, 0)
    x = random_tokens(seed=1)
    with torch.no_grad():
        p = pruned(x)
        assert _maxdiff(p, _hf_zeroed(tiny_dir, heads)(x).logits) <= 1e-4
        assert _maxdiff(p, tiny(x, gates=mask_gates(tiny, heads))) <= 1e-4


def test_compensated_equals_mean_ablated(tiny, tiny_dir):
    fills = _mean_fills(tiny, random_tokens(B=4, T=32, seed=5))
    pruned = prune_model(tiny, HEADS, fills)
    x = random_tokens(seed=2)
    with torch.no_grad():
        p = pruned(x)
        ablated = tiny(x, gates=mask_gates(tiny, HEADS), fills=fill_tensors(tiny, {h: fills[h] for h in HEADS}))
        assert _maxdiff(p, ablated) <= 1e-5
        assert _maxdiff(p, _hf_zeroed(tiny_dir, HEADS, fills)(x).logits) <= 1e-4
        assert _maxdiff(p, prune_model(tiny, HEADS)(x)) > 1e-3  # compensation changed something


def test_prune_a_pruned_model_by_original_ids(tiny):
    first, second = HEADS[:3], HEADS[3:] + [(1, 2)]
    once = prune_model(tiny, first)
    twice = prune_model(once, second)
    direct = prune_model(tiny, first + second)
    assert twice.cfg.kept_heads == direct.cfg.kept_heads == [[0, 2], [1, 3], [3]]
    x = random_tokens(seed=3)
    with torch.no_grad():
        assert _maxdiff(twice(x), direct(x)) <= 1e-5
        assert _maxdiff(once(x, gates=mask_gates(once, second)), direct(x)) <= 1e-4
    assert removed_heads(twice) == sorted(first + second)
    with pytest.raises(HeadpruneError, match="L0H1 was already pruned"):
        prune_model(once, [(0, 1)])


def test_bad_heads_and_fills(tiny):
    for heads in ([(3, 0)], [(0, 4)], [(0, -1)]):
        with pytest.raises(HeadpruneError):
            prune_model(tiny, heads)
        with pytest.raises(HeadpruneError):
            mask_gates(tiny, heads)
    with pytest.raises(HeadpruneError, match="no mean output"):
        prune_model(tiny, [(0, 1), (0, 2)], {(0, 1): torch.zeros(DK)})
    with pytest.raises(HeadpruneError, match="shape"):
        prune_model(tiny, [(0, 1)], {(0, 1): torch.zeros(DK + 1)})


@pytest.mark.slow
def test_counts_match_hand_formulas_gpt2_small(small_dir):
    model = load_model(small_dir)
    d, dk, T = 768, 64, 128
    k = {0: 3, 5: 12, 11: 1}  # heads removed per layer; layer 5 loses all
    heads = [(layer, h) for layer, n in k.items() for h in range(n)]
    pruned = prune_model(model, heads)
    s = pruning_stats(model, pruned, seq_len=T)
    n = sum(k.values())
    assert s["heads_removed"] == n and s["heads_after"] == 144 - n
    assert s["params_removed"] == n * (3 * d * dk + 3 * dk + dk * d) == count_params(model) - count_params(pruned)
    assert s["params_before"] == 124_439_808  # GPT-2 small, tied LM head
    assert s["wo_params_removed"] == n * dk * d
    assert s["attention_flops_per_token_removed"] == n * (2 * d * 3 * dk + 2 * dk * d + 2 * 2 * dk * T)
    assert s["attention_flops_per_token_before"] == 12 * (2 * d * 3 * d + 2 * d * d + 4 * d * T)


# ---------------------------------------------------------------- export

def test_native_export_round_trip(tiny, tiny_dir, tmp_path):
    pruned = prune_model(tiny, HEADS, _mean_fills(tiny, random_tokens(seed=7)))
    src = tmp_path / "src"
    src.mkdir()
    (src / "vocab.json").write_text("{}")
    (src / "merges.txt").write_text("#version: 0.2\n")
    pruned.origin = Origin(pruned.origin.source, src)
    out = export_native(pruned, tmp_path / "native", metadata={"method": "test"})
    back = load_model(out)
    assert back.cfg.kept_heads == pruned.cfg.kept_heads
    assert json.loads((out / "config.json").read_text())["headprune_kept_heads"] == [[0, 2], [1, 2, 3], [3]]
    assert (out / "vocab.json").read_text() == "{}" and (out / "merges.txt").is_file()
    marker = json.loads((out / EXPORT_MARKER).read_text())
    assert marker["removed_heads"] == [head_id(*h) for h in HEADS] and marker["method"] == "test"
    x = random_tokens(seed=4)
    with torch.no_grad():
        assert _maxdiff(back(x), pruned(x)) == 0.0
    assert (out / "model.safetensors").stat().st_size < (tiny_dir / "model.safetensors").stat().st_size
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp folders left


def test_native_export_of_empty_layer_round_trips(tiny, tmp_path):
    pruned = prune_model(tiny, [(2, h) for h in range(H)])
    back = load_model(export_native(pruned, tmp_path / "e"))
    x = random_tokens(seed=6)
    with torch.no_grad():
        assert back.h[2].attn.n_heads == 0 and _maxdiff(back(x), pruned(x)) == 0.0


def test_export_target_rules(tiny, tmp_path):
    pruned = prune_model(tiny, HEADS[:1])
    (tmp_path / "file").write_text("x")
    with pytest.raises(HeadpruneError, match="is a file"):
        export_native(pruned, tmp_path / "file")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(HeadpruneError, match="not a headprune export"):
        export_native(pruned, foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"
    export_native(pruned, foreign, overwrite=True)
    assert not (foreign / "notes.txt").exists() and (foreign / EXPORT_MARKER).is_file()
    again = prune_model(tiny, HEADS)
    export_native(again, foreign)  # a previous export is replaced without overwrite
    assert load_model(foreign).cfg.kept_heads == again.cfg.kept_heads
    empty = tmp_path / "empty"
    empty.mkdir()
    export_native(pruned, empty)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "file", "foreign"]


def test_failed_export_leaves_the_previous_one(tiny, tmp_path, monkeypatch):
    import safetensors.torch

    out = export_native(prune_model(tiny, HEADS[:1]), tmp_path / "e")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", boom)
    with pytest.raises(HeadpruneError, match="No space left"):
        export_native(prune_model(tiny, HEADS), out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["e"]


def test_hf_export_loads_in_stock_transformers(tiny, tiny_dir, tmp_path):
    fills = _mean_fills(tiny, random_tokens(seed=8))
    out = export_hf(prune_model(tiny, HEADS, fills), tmp_path / "hf")
    cfg = json.loads((out / "config.json").read_text())
    assert "headprune_kept_heads" not in cfg and cfg["n_head"] == H
    hf = GPT2LMHeadModel.from_pretrained(out).eval()
    ref = GPT2LMHeadModel.from_pretrained(tiny_dir)
    assert {k: v.shape for k, v in hf.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
    assert torch.count_nonzero(hf.transformer.h[0].attn.c_proj.weight[DK : 2 * DK]) == 0
    x = random_tokens(seed=9)
    with torch.no_grad():
        assert _maxdiff(hf(x).logits, prune_model(tiny, HEADS, fills)(x)) <= 1e-4
        # from an already pruned model: the heads it lacks are zero-filled too
        once = prune_model(tiny, HEADS[:2])
        hf2 = GPT2LMHeadModel.from_pretrained(export_hf(prune_model(once, HEADS[2:]), tmp_path / "hf2")).eval()
        assert _maxdiff(hf2(x).logits, prune_model(tiny, HEADS)(x)) <= 1e-4


def test_hf_export_zeroes_removed_heads_whatever_the_record_says(tiny, tiny_dir, tmp_path, monkeypatch):
    """The removed heads' Q/K/V columns (weights and biases) and W_O rows are exactly 0 in the exported tensors,
    read from the checkpoint by the heads we removed (never from the export record, here made to list none), and
    every other attention weight is the original's."""
    import headprune.io.write.export as export_module

    monkeypatch.setattr(export_module, "removed_heads", lambda model: [])  # a record that lists no head
    out = export_hf(prune_model(tiny, HEADS), tmp_path / "hf")
    assert json.loads((out / EXPORT_MARKER).read_text())["removed_heads"] == []
    got = GPT2LMHeadModel.from_pretrained(out).state_dict()
    ref = GPT2LMHeadModel.from_pretrained(tiny_dir).state_dict()
    for layer in range(3):
        pre = f"transformer.h.{layer}.attn."
        for head in range(H):
            cols = torch.cat([torch.arange(part * D + head * DK, part * D + (head + 1) * DK) for part in range(3)])
            rows = torch.arange(head * DK, (head + 1) * DK)
            pieces = {"c_attn.weight": got[pre + "c_attn.weight"][:, cols],
                      "c_attn.bias": got[pre + "c_attn.bias"][cols],
                      "c_proj.weight": got[pre + "c_proj.weight"][rows]}
            originals = {"c_attn.weight": ref[pre + "c_attn.weight"][:, cols],
                         "c_attn.bias": ref[pre + "c_attn.bias"][cols],
                         "c_proj.weight": ref[pre + "c_proj.weight"][rows]}
            for name, piece in pieces.items():
                if (layer, head) in HEADS:
                    assert torch.count_nonzero(piece) == 0, (layer, head, name)
                else:
                    assert torch.equal(piece, originals[name]), (layer, head, name)
