"""bf16 against fp32, with bounds tight enough that losing an attention layer (or a head) fails them.

tests/oracles/test_gpt2_vs_transformers.py allows 0.05 in softmax probabilities; over GPT-2's 50,257-token vocabulary
almost every probability is tiny, so a bf16 path that skipped a whole attention layer could still pass it. Here the
shipped model (``stdlib-gpt2-mini``, 6 x 8 heads, trained) runs on the first 4,096 tokens of the default
corpus' validation split. Measured on the CPU (torch 2.x):

  corpus NLL       |bf16 - fp32| = 1.4e-4 nats/token          bound NLL_TOL = 5e-3
  logits           max|bf16 - fp32| / max|fp32| = 0.0087      bound LOGIT_REL_TOL = 0.03
  one layer gated  max|drop - fp32| / max|fp32| = 0.34..0.61  (every layer), NLL change 0.024..0.18
  one head gated   max|drop - fp32| / max|fp32| = 0.068..0.15 (head 0 of every layer)

so the bounds sit ~3.5x (logits) and ~35x (NLL) above bf16's own error and ~2x..10x below what removing one
attention layer does; the tests below check that last part on the fp32 model, in the test itself.
"""

import pytest
import torch
from scipy import stats

from headprune.cli.main import main
from headprune.data.sources import load_texts
from headprune.data.tokens import tokenize_corpus
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import load_tokenizer
from headprune.io.work.files import read_scores
from headprune.models.nll import token_nll
from headprune.perplexity import Windowing, evaluate
from headprune.schema import DEFAULT_MODEL

NLL_TOL = 5e-3  # nats/token
LOGIT_REL_TOL = 0.03  # max|logits_bf16 - logits_fp32| <= LOGIT_REL_TOL * max|logits_fp32|
SEQ = 256
N_TOKENS = 4096


@pytest.fixture(autouse=True)
def token_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HEADPRUNE_CACHE", str(tmp_path_factory.getbasetemp() / "token-cache"))


@pytest.fixture(scope="module")
def models():
    return load_model(DEFAULT_MODEL), load_model(DEFAULT_MODEL, dtype="bf16")


@pytest.fixture(scope="module")
def ids(models, tmp_path_factory):
    tok = load_tokenizer(DEFAULT_MODEL, models[0].cfg.vocab_size)
    ids = tokenize_corpus(load_texts("default", "validation"), tok, tmp_path_factory.mktemp("bf16-tokens"))
    assert len(ids) >= N_TOKENS
    return ids[:N_TOKENS]


@pytest.fixture(scope="module")
def fp32_logits(models, ids):
    with torch.no_grad():
        return models[0](ids[:2048].view(8, SEQ))


@pytest.fixture(scope="module")
def dropped_logits(models, ids):
    """fp32 logits on the first 2,048 tokens with each attention layer in turn gated off entirely."""
    with torch.no_grad():
        return [models[0](ids[:2048].view(8, SEQ), gates=_layer_gates(models[0], layer))
                for layer in range(models[0].cfg.n_layers)]


def _rel_dev(logits, ref):
    return ((logits.float() - ref).abs().max() / ref.abs().max()).item()


def _layer_gates(model, layer):
    gates = model.ones_gates()
    gates[layer][:] = 0
    return gates


def test_bf16_model_is_bf16(models):
    assert models[1].dtype == torch.bfloat16 and all(p.dtype == torch.bfloat16 for p in models[1].parameters())


def test_bf16_logits_relative_to_their_scale(models, ids, fp32_logits, dropped_logits):
    with torch.no_grad():
        bf16 = models[1](ids[:2048].view(8, SEQ))
    assert bf16.dtype == torch.bfloat16
    assert _rel_dev(bf16, fp32_logits) <= LOGIT_REL_TOL
    # The bound is tight enough: the fp32 model without any one attention layer is far outside it.
    for layer, dropped in enumerate(dropped_logits):
        assert _rel_dev(dropped, fp32_logits) > 5 * LOGIT_REL_TOL, layer


def test_bf16_corpus_nll(models, ids, fp32_logits, dropped_logits):
    fp32 = evaluate(models[0], ids, Windowing(SEQ, SEQ, 16), progress=False)
    bf16 = evaluate(models[1], ids, Windowing(SEQ, SEQ, 16), progress=False)
    assert bf16.tokens == fp32.tokens == N_TOKENS - N_TOKENS // SEQ
    assert abs(bf16.nll - fp32.nll) <= NLL_TOL
    # ... and dropping any one attention layer moves the NLL (first 2,048 tokens) by more than the bound.
    tokens = ids[:2048].view(8, SEQ)
    base = token_nll(fp32_logits, tokens).mean().item()
    assert base == pytest.approx(evaluate(models[0], ids[:2048], Windowing(SEQ, SEQ), progress=False).nll, abs=1e-5)
    for layer, dropped in enumerate(dropped_logits):
        assert abs(token_nll(dropped, tokens).mean().item() - base) > 2 * NLL_TOL, layer


def test_bf16_single_head_gate_is_seen(models, ids, fp32_logits):
    """Even one head gated off in bf16 moves the logits outside the bound (so gates work in bf16)."""
    gates = [g.to(torch.bfloat16) for g in models[1].ones_gates()]
    gates[3][0] = 0
    with torch.no_grad():
        got = models[1](ids[:2048].view(8, SEQ), gates=gates)
    assert _rel_dev(got, fp32_logits) > LOGIT_REL_TOL


# ---------------------------------------------------------------- the CLI in bf16 (tiny model)

WEIGHT = ["wo_fro", "wo_spec", "ov_fro", "ov_spec"]
ACTIVATION = ["out_norm", "fluct", "entropy"]
NOISY = ["grad", "taylor", "abl_zero", "abl_mean"]  # differences of NLLs / gradients: bf16 noise is relative


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    import pydoc_data.topics

    folder = tmp_path_factory.mktemp("bf16-corpus")
    (folder / "c.txt").write_text(" ".join(list(pydoc_data.topics.topics.values())[:30])[:12000])
    return folder / "c.txt"


def _score(tiny_dir, corpus, out, dtype):
    assert main(["score", "--model", str(tiny_dir), "--data", str(corpus), "--max-tokens", "192", "--seq-len", "64",
                 "--device", "cpu", "--dtype", dtype, "--out", str(out), "--quiet"]) == 0
    return read_scores(out)


def test_score_bf16_agrees_with_fp32(tiny_dir, corpus, tmp_path):
    """Measured (tiny model, 192 tokens): weight norms 3e-4..5e-4 of the column's largest |value|, activations
    8e-4..5e-3, gradients 7e-3, ablation 2.8e-2 (abl_zero) and 3.2e-2 (abl_mean): those are differences of two
    NLLs, each carrying bf16's logit error, so their relative error is the largest. Spearman rho >= 0.993."""
    fp32 = _score(tiny_dir, corpus, tmp_path / "fp32.csv", "fp32")
    bf16 = _score(tiny_dir, corpus, tmp_path / "bf16.csv", "bf16")
    assert bf16.head_id.tolist() == fp32.head_id.tolist()
    assert (bf16.model_fingerprint == fp32.model_fingerprint).all()  # the same model, whatever the dtype
    for method, tol in [(m, 2**-8) for m in WEIGHT] + [(m, 2e-2) for m in ACTIVATION] + [(m, 0.1) for m in NOISY]:
        x, y = fp32[method].to_numpy(), bf16[method].to_numpy()
        # Weight norms: bf16 rounds each weight by <= 2^-9 relatively, so a norm moves by <= 2^-9 of its size.
        assert abs(x - y).max() <= tol * abs(x).max(), method
        assert stats.spearmanr(x, y).statistic >= 0.95, method


def test_run_bf16_finishes_and_writes_report(tiny_dir, corpus, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["run", "--model", str(tiny_dir), "--data", str(corpus), "--score-data", str(corpus), "--out", str(out),
                 "--device", "cpu", "--dtype", "bf16", "--max-tokens", "200", "--seq-len", "64",
                 "--fractions", "0,0.5", "--seeds", "1", "--quiet",
                 # one method per family (test_score_bf16_agrees_with_fp32 checks every method in bf16)
                 "--methods", "wo_fro,fluct,grad,abl_zero"]) == 0
    assert "baseline: perplexity" in capsys.readouterr().out
    for name in ["scores.parquet", "scores.csv", "curves.parquet", "curves.csv", "summary.md", "report.html",
                 "curves.png", "predictiveness.csv", "ledger.txt"]:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    scores = read_scores(out / "scores.parquet")
    assert len(scores) == 12 and scores.drop(columns=["head_id", "model_fingerprint"]).notna().all().all()
