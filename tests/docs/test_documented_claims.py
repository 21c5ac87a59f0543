"""Documented claims that have no test of their own. They are stated in docs/methods.md
(Loading, Pruning, Reports) and in the README (``--data``); the file names in docs/ and the README are checked
by test_docs_links.py.

- scoring a pruned model: emptied layers, original head names, scores equal the unpruned model's with the
  removed heads zeroed (weight methods exactly; data methods against the ``--format hf`` zero-filled export;
  ``abl_zero`` against Hugging Face's GPT2LMHeadModel with the W_O rows zeroed);
- ``prune --scores`` with ``--per-layer``, ``--normalize layer``, ``--standardize``, ``--method random
  --seed`` and ``--compensate mean``: the removed heads against a hand computation from the scores table;
- the report's Spearman / Kendall matrices against scipy.stats;
- loading config variants (``n_inner``, ``scale_attn_by_inverse_layer_idx``, ``layer_norm_epsilon``, an
  untied LM head), old ``attn.masked_bias`` keys (with and without the ``transformer.`` prefix), and a hub
  cache holding only ``pytorch_model.bin``;
- ``hf:NAME[:CONFIG]:SPLIT`` from a local ``datasets`` cache, offline: the cache is laid out as ``datasets``
  lays out a hub dataset it has downloaded (``NAMESPACE___NAME/CONFIG/VERSION/HASH/NAME-SPLIT.arrow``,
  built here with the packaged ``json`` builder), and a fresh process with HF_DATASETS_OFFLINE=1 /
  HF_HUB_OFFLINE=1 (read by the libraries at import) loads it through ``datasets.load_dataset(NAME)``;
- the model's own tokenizer (vocab.json + merges.txt) chosen over GPT-2's.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file
from scipy import stats
from transformers import GPT2LMHeadModel

from headprune.cli.main import main
from headprune.data.tokens import corpus_ids, tokenize_corpus
from headprune.io.read.fingerprint import model_fingerprint
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import load_tokenizer
from headprune.io.work.files import read_scores
from headprune.perplexity import Windowing
from headprune.report.tables import rank_correlations
from headprune.schema import METHODS, OPT_IN, score_columns
from headprune.scoring import head_means

from helpers import TINY, guide_loop, save_hf_gpt2

DK = TINY["n_embd"] // TINY["n_head"]
SEQ = 64
WEIGHT = ["wo_fro", "wo_spec", "ov_fro", "ov_spec"]


@pytest.fixture(autouse=True)
def token_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HEADPRUNE_CACHE", str(tmp_path_factory.getbasetemp() / "token-cache"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    import pydoc_data.topics

    folder = tmp_path_factory.mktemp("claims-corpus")
    (folder / "c.txt").write_text(" ".join(list(pydoc_data.topics.topics.values())[:30])[:12000])
    return folder / "c.txt"


def _tokens(seed=0, B=2, T=23):
    return torch.randint(0, TINY["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- scoring a pruned model

REMOVED = [(0, 1), (0, 3)] + [(1, h) for h in range(4)] + [(2, 2)]  # layer 1 emptied, 0 and 2 partly
KEPT_IDS = ["L0H0", "L0H2", "L2H0", "L2H1", "L2H3"]


@pytest.fixture(scope="module")
def pruned_scores(tiny_dir, corpus, tmp_path_factory):
    """Scores (all methods) of the tiny model pruned to KEPT_IDS, exported native and reloaded; and of the same
    pruning exported ``--format hf`` (original shapes, removed heads zero-filled)."""
    root = tmp_path_factory.mktemp("pruned-scores")
    mp = pytest.MonkeyPatch()
    mp.setenv("HEADPRUNE_CACHE", str(tmp_path_factory.getbasetemp() / "token-cache"))
    heads = ",".join(f"L{l}H{h}" for l, h in REMOVED)
    out = {}
    for fmt in ("native", "hf"):
        assert main(["prune", "--model", str(tiny_dir), "--heads", heads, "--out", str(root / fmt), "--format", fmt,
                     "--quiet"]) == 0
        assert main(["score", "--model", str(root / fmt), "--data", str(corpus), "--max-tokens", "200",
                     "--seq-len", str(SEQ), "--out", str(root / f"{fmt}.csv"), "--quiet"]) == 0
        out[fmt] = read_scores(root / f"{fmt}.csv")
    mp.undo()
    return root, out


def test_pruned_model_scores_keep_original_head_names(pruned_scores):
    root, out = pruned_scores
    native = out["native"]
    assert native.head_id.tolist() == KEPT_IDS
    assert list(zip(native.layer, native["head"])) == [(0, 0), (0, 2), (2, 0), (2, 1), (2, 3)]
    assert load_model(root / "native").cfg.kept_heads == [[0, 2], [], [0, 1, 3]]
    every = [m for m in METHODS if m not in OPT_IN]  # what "all" scores
    assert list(native.columns) == score_columns(every)
    assert native[every].notna().all().all()


def test_pruned_model_weight_scores_equal_unpruned(pruned_scores, tiny_dir, corpus, tmp_path):
    _, out = pruned_scores
    full = tmp_path / "full.csv"
    assert main(["score", "--model", str(tiny_dir), "--data", str(corpus), "--max-tokens", "200", "--seq-len",
                 str(SEQ), "--methods", ",".join(WEIGHT), "--out", str(full), "--quiet"]) == 0
    full = read_scores(full).set_index("head_id").loc[KEPT_IDS]
    for m in WEIGHT:  # the kept heads' weights are the same numbers: so are their norms
        np.testing.assert_array_equal(out["native"][m].to_numpy(), full[m].to_numpy(), err_msg=m)


def test_pruned_model_data_scores_equal_zero_filled_unpruned(pruned_scores):
    _, out = pruned_scores
    zeroed = out["hf"].set_index("head_id")
    assert len(zeroed) == 12
    kept = zeroed.loc[KEPT_IDS]
    for m in [m for m in METHODS if m not in OPT_IN]:
        np.testing.assert_allclose(out["native"][m].to_numpy(), kept[m].to_numpy(), rtol=1e-4, atol=1e-6, err_msg=m)
    removed = zeroed.drop(index=KEPT_IDS)  # a zero-filled head has z = 0: no weight, no output, no effect
    for m in ["wo_fro", "wo_spec", "ov_fro", "ov_spec", "out_norm", "fluct", "grad", "abl_zero", "abl_mean"]:
        assert (removed[m].abs() <= 1e-6).all(), m


def test_pruned_model_abl_zero_equals_hf_with_rows_zeroed(pruned_scores, tiny_dir, corpus):
    _, out = pruned_scores
    ids = corpus_ids(str(corpus), "validation", load_tokenizer(tiny_dir), 200)

    def hf_nll(extra):
        hf = GPT2LMHeadModel.from_pretrained(tiny_dir).eval()
        with torch.no_grad():
            for l, h in REMOVED + extra:
                hf.transformer.h[l].attn.c_proj.weight[h * DK:(h + 1) * DK] = 0
        return guide_loop(hf, ids, SEQ, SEQ)[0]

    base = hf_nll([])
    native = out["native"].set_index("head_id")
    for l, h in [(0, 2), (2, 1), (2, 3)]:
        assert native.loc[f"L{l}H{h}", "abl_zero"] == pytest.approx(hf_nll([(l, h)]) - base, abs=2e-5)


# ---------------------------------------------------------------- prune --scores with selection options

IMP = {0: [0.51, 0.9, 0.94, 0.39], 1: [5.93, 3.56, 6.15, 3.71], 2: [0.13, 0.27, 0.08, 0.19]}  # every option differs


@pytest.fixture(scope="module")
def scores_file(tiny_dir, tmp_path_factory):
    fingerprint = model_fingerprint(load_model(tiny_dir))
    rows = [{"layer": l, "head": h, "head_id": f"L{l}H{h}", "imp": v, "model_fingerprint": fingerprint}
            for l, vs in IMP.items() for h, v in enumerate(vs)]
    path = tmp_path_factory.mktemp("scores") / "scores.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _hand_lowest(values: dict, k: int) -> set:
    order = sorted(values, key=lambda lh: (values[lh], lh))
    return set(order[:k])


def _hand_selection(option: str) -> set:
    raw = {(l, h): v for l, vs in IMP.items() for h, v in enumerate(vs)}
    if option == "global":
        return _hand_lowest(raw, 3)
    if option == "per-layer":  # round(0.5 * 4) = 2 lowest in every layer
        return set().union(*(_hand_lowest({(l, h): v for h, v in enumerate(vs)}, 2) for l, vs in IMP.items()))
    if option == "normalize":  # s / ||s_layer||_2
        norms = {l: np.sqrt(sum(v * v for v in vs)) for l, vs in IMP.items()}
        return _hand_lowest({(l, h): v / norms[l] for (l, h), v in raw.items()}, 3)
    if option == "standardize":  # (s - mean) / population std, per layer
        return _hand_lowest({(l, h): (v - np.mean(IMP[l])) / np.std(IMP[l]) for (l, h), v in raw.items()}, 3)
    if option == "random":  # u ~ U(0,1) from default_rng(seed), in (layer, head) order
        u = np.random.default_rng(7).random(12)
        return _hand_lowest({lh: u[i] for i, lh in enumerate(sorted(raw))}, 3)
    raise AssertionError(option)


OPTIONS = {
    "global": ["--method", "imp", "--fraction", "0.25"],
    "per-layer": ["--method", "imp", "--fraction", "0.5", "--per-layer"],
    "normalize": ["--method", "imp", "--count", "3", "--normalize", "layer"],
    "standardize": ["--method", "imp", "--count", "3", "--standardize"],
    "random": ["--method", "random", "--count", "3", "--seed", "7"],
}


def test_hand_selections_differ():
    """The table is built so that each option picks differently: ignoring an option would be noticed."""
    picks = [frozenset(_hand_selection(o)) for o in OPTIONS]
    assert len(set(picks)) == len(picks)


def _removed(out) -> set:
    marker = json.loads((out / "headprune_export.json").read_text())
    return {(int(s[1:s.index("H")]), int(s[s.index("H") + 1:])) for s in marker["removed_heads"]}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_prune_by_scores_options_remove_hand_computed_heads(option, tiny_dir, scores_file, tmp_path, capsys):
    out = tmp_path / "pruned"
    assert main(["prune", "--model", str(tiny_dir), "--scores", str(scores_file), *OPTIONS[option],
                 "--out", str(out), "--quiet"]) == 0
    expected = _hand_selection(option)
    assert _removed(out) == expected
    assert f"heads removed ({len(expected)})" in capsys.readouterr().out
    kept = load_model(out).cfg.kept_heads
    assert {(l, h) for l in range(3) for h in range(4) if h not in kept[l]} == expected


def test_prune_by_scores_compensate_mean(tiny_dir, scores_file, corpus, tmp_path):
    out = tmp_path / "pruned"
    assert main(["prune", "--model", str(tiny_dir), "--scores", str(scores_file), "--method", "imp", "--count", "3",
                 "--standardize", "--compensate", "mean", "--score-data", str(corpus), "--max-tokens", "200",
                 "--out", str(out), "--quiet"]) == 0
    expected = _hand_selection("standardize")
    assert _removed(out) == expected
    # b_O of each layer = original b_O + sum over its removed heads of mean(z_i) W_O^(i), means on --score-data.
    model = load_model(tiny_dir)
    ids = corpus_ids(str(corpus), "validation", load_tokenizer(tiny_dir), 200)
    means = head_means(model, ids, Windowing(TINY["n_positions"], TINY["n_positions"], 8), show_progress=False)
    pruned = load_model(out)
    for layer in range(3):
        want = model.h[layer].attn.b_O + sum((means[(l, h)] @ model.h[layer].attn.W_O[h]
                                              for l, h in expected if l == layer), torch.zeros(TINY["n_embd"]))
        assert torch.allclose(pruned.h[layer].attn.b_O, want, atol=1e-6), layer
    assert {l for l, _ in expected} == {0, 1, 2}
    for layer in range(3):
        assert not torch.equal(pruned.h[layer].attn.b_O, model.h[layer].attn.b_O)


# ---------------------------------------------------------------- Spearman / Kendall matrices

def test_rank_correlation_matrices_equal_scipy():
    rng = np.random.default_rng(3)
    n = 24
    base = rng.normal(size=n)
    table = pd.DataFrame({
        "layer": np.repeat(np.arange(4), 6), "head": np.tile(np.arange(6), 4),
        "abl_zero": base, "taylor": base + rng.normal(scale=0.5, size=n),
        "out_norm": np.round(rng.normal(size=n), 1),  # ties
        "wo_fro": -base ** 3,  # a monotone (decreasing) function of abl_zero
        "grad": rng.normal(size=n),
        "entropy": 1.0,  # constant: correlation undefined
    })
    table.loc[[2, 9], "grad"] = np.nan  # pairwise finite heads
    rho, tau = rank_correlations(table)
    methods = [m for m in METHODS if m in table.columns]  # canonical order
    assert list(rho.index) == list(rho.columns) == methods == list(tau.index) == list(tau.columns)
    for x in methods:
        for y in methods:
            if "entropy" in (x, y):
                assert np.isnan(rho.loc[x, y]) and np.isnan(tau.loc[x, y])
                continue
            ok = table[x].notna() & table[y].notna()
            assert rho.loc[x, y] == pytest.approx(stats.spearmanr(table[x][ok], table[y][ok]).statistic, abs=1e-12)
            assert tau.loc[x, y] == pytest.approx(stats.kendalltau(table[x][ok], table[y][ok]).statistic, abs=1e-12)
    assert rho.loc["abl_zero", "wo_fro"] == pytest.approx(-1.0) and tau.loc["abl_zero", "wo_fro"] == pytest.approx(-1.0)


# ---------------------------------------------------------------- loading variants

@pytest.mark.parametrize("variant", [
    {"n_inner": 48},
    {"scale_attn_by_inverse_layer_idx": True},
    {"layer_norm_epsilon": 1e-2},
    {"tie_word_embeddings": False},
    {"n_inner": 80, "scale_attn_by_inverse_layer_idx": True, "layer_norm_epsilon": 0.5, "tie_word_embeddings": False},
])
def test_config_variants_equal_hugging_face(variant, tmp_path):
    hf = save_hf_gpt2(tmp_path, seed=4, **TINY, **variant)
    ours = load_model(tmp_path)
    if variant.get("tie_word_embeddings") is False:
        assert ours.lm_head is not None and not torch.equal(ours.lm_head.weight, ours.wte.weight)
        assert torch.equal(ours.lm_head.weight, hf.lm_head.weight)
    if "n_inner" in variant:
        assert ours.h[0].mlp.c_fc.weight.shape == (TINY["n_embd"], variant["n_inner"])
    x = _tokens(seed=1)
    with torch.no_grad():
        assert (hf(x).logits - ours(x)).abs().max().item() <= 1e-5


def _hf_state(hf):
    return {k: v.contiguous().clone() for k, v in hf.state_dict().items()}


@pytest.mark.parametrize("prefix", ["transformer.", ""])
def test_old_masked_bias_keys(prefix, tmp_path):
    """Checkpoints of transformers < 4.x carry ``attn.masked_bias`` (and ``attn.bias``) buffers."""
    hf = save_hf_gpt2(tmp_path / "src", seed=6, **TINY)
    state = {(prefix + k.removeprefix("transformer.") if k.startswith("transformer.") else k): v
             for k, v in _hf_state(hf).items() if k != "lm_head.weight" or prefix}
    T = TINY["n_positions"]
    for layer in range(TINY["n_layer"]):
        state[f"{prefix}h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
        state[f"{prefix}h.{layer}.attn.bias"] = torch.ones(T, T, dtype=torch.uint8).tril().view(1, 1, T, T)
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "config.json").write_text((tmp_path / "src" / "config.json").read_text())
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    assert any(k.endswith("masked_bias") for k in load_file(folder / "model.safetensors"))
    x = _tokens(seed=2)
    with torch.no_grad():
        assert (hf(x).logits - load_model(folder)(x)).abs().max().item() <= 1e-5


_BIN_ONLY = """
import sys, torch
from transformers import GPT2LMHeadModel
from headprune.io.read.loading import load_model
ours = load_model("testorg/tiny-bin")
hf = GPT2LMHeadModel.from_pretrained(sys.argv[1]).eval()
x = torch.arange(40).view(2, 20) * 7
with torch.no_grad():
    print((hf(x).logits - ours(x)).abs().max().item(), ours.origin.folder)
"""


@pytest.mark.slow
def test_hub_cache_with_only_pytorch_model_bin(tiny_dir, tmp_path):
    home = tmp_path / "hf-home"
    repo = home / "hub" / "models--testorg--tiny-bin"
    commit = "89abcdef0123456789abcdef0123456789abcdef"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    hf = GPT2LMHeadModel.from_pretrained(tiny_dir)
    torch.save(hf.state_dict(), repo / "blobs" / "blob-bin")
    (repo / "blobs" / "blob-config").write_text((tiny_dir / "config.json").read_text())
    (snapshot / "pytorch_model.bin").symlink_to("../../blobs/blob-bin")
    (snapshot / "config.json").symlink_to("../../blobs/blob-config")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")}
    env |= {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    proc = subprocess.run([sys.executable, "-c", _BIN_ONLY, str(tiny_dir)], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    diff, folder = proc.stdout.split()
    assert float(diff) <= 1e-5
    assert str(home) in folder and commit in folder


# ---------------------------------------------------------------- hf: corpus from a local datasets cache

_HF_DATA = """
import json, os, sys
def hook(event, args):
    if event in ("socket.getaddrinfo", "socket.connect"):
        sys.stderr.write(f"NETWORK ATTEMPT {args[:2]!r}\\n")
        sys.stderr.flush()
        os._exit(99)
sys.addaudithook(hook)
from headprune.data.sources import load_texts
print(json.dumps([load_texts("hf:testorg/tiny-texts:test"), load_texts("hf:testorg/tiny-texts:default:test")]))
"""

DOCS = ["The first document of the cached set.", "A second one, with more words in it.", "Third."]


def _datasets_cache(root):
    """A datasets cache holding hub dataset ``testorg/tiny-texts`` (config ``default``, split ``test``)."""
    from datasets.packaged_modules.json.json import Json

    src = root / "src"
    src.mkdir()
    (src / "test.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in DOCS) + "\n")
    build = root / "build"
    builder = Json(cache_dir=str(build), dataset_name="tiny-texts", config_name="default",
                   data_files={"test": str(src / "test.jsonl")}, hash="0123456789abcdef")
    builder.download_and_prepare()
    final = root / "cache" / "testorg___tiny-texts" / "default" / "0.0.0" / "0123456789abcdef"
    final.parent.mkdir(parents=True)
    os.rename(builder.cache_dir, final)
    assert (final / "tiny-texts-test.arrow").is_file()
    return root / "cache"


@pytest.mark.slow
def test_hf_corpus_from_local_datasets_cache_offline(tmp_path):
    cache = _datasets_cache(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env |= {"HF_HOME": str(tmp_path / "hf-home"), "HF_DATASETS_CACHE": str(cache), "HF_DATASETS_OFFLINE": "1",
            "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    proc = subprocess.run([sys.executable, "-c", _HF_DATA], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [DOCS, DOCS]


# ---------------------------------------------------------------- the model's own tokenizer

def _byte_level_vocab():
    """A small byte-level BPE: GPT-2's 256 byte symbols in another order, three merges, eos last."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    others = [b for b in range(256) if b not in printable]
    symbols = [chr(b) for b in printable] + [chr(256 + i) for i in range(len(others))]  # GPT-2's byte symbols
    symbols = sorted(symbols, reverse=True)
    vocab = {s: i for i, s in enumerate(symbols)}
    for merged in ["he", "ll", "hell"]:
        vocab[merged] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return vocab, "#version: 0.2\nh e\nl l\nhe ll\n"


def test_models_own_tokenizer_is_chosen(tiny_dir, tmp_path, capsys):
    folder = tmp_path / "own-tok"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes((tiny_dir / name).read_bytes())
    vocab, merges = _byte_level_vocab()
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text(merges)
    own, gpt2 = load_tokenizer(folder, vocab_size=TINY["vocab_size"]), load_tokenizer(tiny_dir)
    assert len(own) == 260 and len(gpt2) == 50257
    assert own("hello")["input_ids"] == [vocab["hell"], vocab["o"]]
    assert gpt2("hello")["input_ids"] == [31373]
    assert own.eos_token_id == vocab["<|endoftext|>"] == 259
    ids = tokenize_corpus(["hello", "hell"], own, tmp_path / "cache")
    assert ids.tolist() == [vocab["hell"], vocab["o"], 259, vocab["hell"]]
    # the CLI tokenizes with it too: 'hello hello' is hell|o|Ġ|hell|o, 5 tokens -> 4 scored (GPT-2's: 2 -> 1)
    (tmp_path / "c.txt").write_text("hello hello")
    assert main(["eval", "--model", str(folder), "--data", str(tmp_path / "c.txt"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == 4

