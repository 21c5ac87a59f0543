"""Head anatomy against independent computations: Hugging Face attention and hidden states, explicit loops over
positions, dense d×d and vocab×vocab products, scipy's principal angles, and hand calculations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch
from transformers import GPT2LMHeadModel

from headprune.anatomy import (
    composition_scores,
    copying_scores,
    corpus_rows,
    detect_heads,
    effective_rank,
    head_anatomy,
    logit_attribution,
    repeated_random_tokens,
    wo_geometry,
)
from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.models.gpt2 import GPT2
from headprune.models.gpt2_config import GPT2Config
from headprune.pruning.prune import prune_model

from helpers import TINY, random_tokens, save_hf_gpt2

SMALL_VOCAB = TINY | {"vocab_size": 40}


def built_model(**config) -> GPT2:
    """A GPT2 from a GPT2Config with every parameter drawn from N(0, 0.1²), seeded."""
    torch.manual_seed(0)
    model = GPT2(GPT2Config(**config)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    return model


@pytest.fixture(scope="module")
def small_vocab_dir(tmp_path_factory):
    """TINY with a 40-token vocabulary: random text repeats tokens (duplicate/induction patterns are not empty),
    and the vocab×vocab OV circuit is small enough to form densely."""
    folder = tmp_path_factory.mktemp("tiny-v40")
    save_hf_gpt2(folder, seed=3, **SMALL_VOCAB)
    return folder


# ---------------------------------------------------------------- roles


def reference_roles(attentions, tokens) -> dict[str, np.ndarray]:
    """Slow reference: explicit loops build each detection pattern from its definition; Σ(A⊙P)/ΣA per sequence,
    averaged over the batch. attentions: per layer (B,h,T,T) from Hugging Face."""
    B, T = tokens.shape
    t = tokens.tolist()
    out = {r: np.zeros((len(attentions), attentions[0].shape[1])) for r in ("previous_token", "duplicate_token",
                                                                            "induction")}
    for b in range(B):
        P = {r: np.zeros((T, T)) for r in out}
        for i in range(T):
            for j in range(T):
                P["previous_token"][i, j] = float(j == i - 1)
                P["duplicate_token"][i, j] = float(j < i and t[b][j] == t[b][i])
                P["induction"][i, j] = float(1 <= j <= i and j - 1 < i and t[b][j - 1] == t[b][i])
        for layer, A in enumerate(attentions):
            for h in range(A.shape[1]):
                a = A[b, h].double().numpy()
                for r, table in out.items():
                    table[layer, h] += (a * P[r]).sum() / a.sum() / B
    return out


def test_detect_heads_matches_slow_reference_on_hf_attention(small_vocab_dir):
    model = load_model(small_vocab_dir)
    hf = GPT2LMHeadModel.from_pretrained(small_vocab_dir, attn_implementation="eager").eval()
    tokens = torch.cat([random_tokens(40, B=2, T=20, seed=1), repeated_random_tokens(40, 10, 1, seed=2)])
    with torch.no_grad():
        attentions = hf(tokens, output_attentions=True).attentions
    ref = reference_roles(attentions, tokens)
    got = detect_heads(model, tokens, batch_size=2)  # batches of 2: the mean spans batches
    assert list(got.columns) == ["layer", "head", "head_id", "previous_token", "duplicate_token", "induction"]
    for role, table in ref.items():
        np.testing.assert_allclose(got[role].to_numpy(), table.reshape(-1), rtol=1e-5, atol=1e-7)
    assert got[["duplicate_token", "induction"]].min().min() > 0  # the patterns were not empty


def test_detect_heads_uniform_attention_hand_calculation():
    """W_Q = W_K = 0: every head attends uniformly, A[i, j] = 1/(i+1) for j <= i. On n distinct tokens repeated
    twice (T = 2n): previous = Σ_{i>=1} 1/(i+1) / T; duplicate = induction = Σ_{i=n}^{2n-1} 1/(i+1) / T."""
    model = built_model(vocab_size=50, n_positions=32, d_model=16, n_layers=2, n_heads=2, d_mlp=32)
    with torch.no_grad():
        for blk in model.h:
            blk.attn.c_attn.weight[:, :32] = 0  # the Q and K columns
            blk.attn.c_attn.bias[:32] = 0
    n = 6
    first = torch.randperm(50, generator=torch.Generator().manual_seed(0))[:n]
    tokens = torch.cat([first, first]).view(1, -1)
    T = 2 * n
    got = detect_heads(model, tokens)
    np.testing.assert_allclose(got["previous_token"], sum(1 / (i + 1) for i in range(1, T)) / T, rtol=1e-6)
    second_half = sum(1 / (i + 1) for i in range(n, T)) / T
    np.testing.assert_allclose(got["duplicate_token"], second_half, rtol=1e-6)
    np.testing.assert_allclose(got["induction"], second_half, rtol=1e-6)


def test_repeated_random_tokens_and_bad_input(tiny_dir):
    probe = repeated_random_tokens(100, 7, 3, seed=5)
    assert probe.shape == (3, 14) and torch.equal(probe[:, :7], probe[:, 7:])
    assert torch.equal(probe, repeated_random_tokens(100, 7, 3, seed=5))
    with pytest.raises(HeadpruneError):
        repeated_random_tokens(100, 1, 3)
    with pytest.raises(HeadpruneError):
        detect_heads(load_model(tiny_dir), torch.zeros(5, dtype=torch.long))


# ---------------------------------------------------------------- composition


def dense_composition(model) -> dict[tuple[int, int, int, int], tuple[float, float, float]]:
    """The d×d products of every pair, as Elhage et al. / TransformerLens define them, float64."""
    W = {}
    for layer in model.active_layers:
        a = model.h[layer].attn
        for i, head in enumerate(model.cfg.kept_heads[layer]):
            ov = a.W_V[i].double() @ a.W_O[i].double()
            qk = a.W_Q[i].double() @ a.W_K[i].double().T
            W[layer, head] = (ov, qk)
    out = {}
    for (la, ha), (ov_a, _) in W.items():
        for (lb, hb), (ov_b, qk_b) in W.items():
            if la < lb:
                out[la, ha, lb, hb] = tuple(float(torch.linalg.norm(ov_a @ m)
                                                  / (torch.linalg.norm(ov_a) * torch.linalg.norm(m)))
                                            for m in (qk_b, qk_b.T, ov_b))
    return out


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_composition_matches_dense_products(tiny_dir, dtype, tol):
    model = load_model(tiny_dir)
    got = composition_scores(model, dtype)
    ref = dense_composition(model)
    assert len(got) == len(ref) == 3 * 16  # pairs (0,1), (0,2), (1,2) of layers, 4 x 4 heads each
    for row in got.itertuples():
        expected = ref[row.layer_a, row.head_a, row.layer_b, row.head_b]
        np.testing.assert_allclose([row.q_comp, row.k_comp, row.v_comp], expected, rtol=tol)
        assert row.head_a_id == f"L{row.layer_a}H{row.head_a}"


def test_composition_of_a_pruned_model_keeps_original_indices(tiny_dir):
    model = load_model(tiny_dir)
    full = composition_scores(model, torch.float64).set_index(["layer_a", "head_a", "layer_b", "head_b"])
    pruned = composition_scores(prune_model(model, [(0, 1), (1, 0), (1, 3)]), torch.float64)
    assert len(pruned) == 3 * 2 + 3 * 4 + 2 * 4
    assert not ((pruned.layer_a == 0) & (pruned.head_a == 1)).any()
    np.testing.assert_allclose(pruned[["q_comp", "k_comp", "v_comp"]].to_numpy(),
                               full.loc[list(zip(pruned.layer_a, pruned.head_a, pruned.layer_b, pruned.head_b)),
                                        ["q_comp", "k_comp", "v_comp"]].to_numpy(), rtol=1e-12)


# ---------------------------------------------------------------- direct logit attribution


def test_dla_decomposition_sums_to_the_mean_correct_logit(tiny_dir):
    model = load_model(tiny_dir)
    tokens = random_tokens(B=3, T=17, seed=4)
    att = logit_attribution(model, tokens, batch_size=2)
    with torch.no_grad():
        logits = model(tokens)[:, :-1]
    mean_logit = float(logits.gather(-1, tokens[:, 1:, None]).double().mean())
    assert att.positions == 3 * 16
    assert att.logit == pytest.approx(mean_logit, abs=1e-5)
    assert att.components["value"].sum() == pytest.approx(mean_logit, abs=1e-5)
    heads_total = att.components.set_index("component").loc[[f"L{l}.heads" for l in range(3)], "value"].sum()
    assert att.heads["dla"].sum() == pytest.approx(heads_total, abs=1e-6)


def test_dla_of_one_head_matches_hf_hooks(tiny_dir):
    """Independent: Hugging Face's GPT2LMHeadModel with hooks on layer 1's c_proj input (concat z) and ln_f's
    input (the final residual stream): head 2's term z_2 W_O^(2) centred, / σ, · (γ ⊙ u_t)."""
    hf = GPT2LMHeadModel.from_pretrained(tiny_dir).eval()
    tokens = random_tokens(B=2, T=12, seed=7)
    seen = {}
    hooks = [hf.transformer.h[1].attn.c_proj.register_forward_pre_hook(lambda m, a: seen.__setitem__("z", a[0])),
             hf.transformer.ln_f.register_forward_pre_hook(lambda m, a: seen.__setitem__("resid", a[0]))]
    with torch.no_grad():
        hf(tokens)
    for h in hooks:
        h.remove()
    d_k, head = 8, 2
    z = seen["z"][:, :-1, head * d_k:(head + 1) * d_k].double()  # (B,T-1,d_k)
    out = z @ hf.transformer.h[1].attn.c_proj.weight[head * d_k:(head + 1) * d_k].double()  # (B,T-1,d)
    resid = seen["resid"][:, :-1].double()
    sigma = (resid.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
    u = hf.transformer.wte.weight[tokens[:, 1:]].double() * hf.transformer.ln_f.weight.double()
    expected = (((out - out.mean(-1, keepdim=True)) / sigma) * u).sum(-1).mean().detach()
    got = logit_attribution(load_model(tiny_dir), tokens).heads.set_index("head_id").loc["L1H2", "dla"]
    assert got == pytest.approx(float(expected), abs=1e-5)


# ---------------------------------------------------------------- copying


def test_copying_matches_dense_vocab_circuit(small_vocab_dir):
    model = load_model(small_vocab_dir)
    got = copying_scores(model)
    W_E = model.wte.weight.double()
    for row in got.itertuples():
        a = model.h[row.layer].attn
        M = W_E @ a.W_V[row.head].double() @ a.W_O[row.head].double() @ W_E.T  # [V, V], tied W_U = W_Eᵀ
        lam = torch.linalg.eigvals(M)
        assert row.copying == pytest.approx(float(lam.sum().real / lam.abs().sum()), abs=1e-8)
    assert got["copying"].between(-1, 1).all()


def test_gemma_copying_reads_the_scaled_embedding_a_block_at_a_time(tmp_path_factory, monkeypatch):
    """Gemma 3's W_E is √d · embed_tokens (what transformers' scaled embedding gives the first block), formed a block
    of rows at a time: copying from blocks of 7 rows equals the dense [V, V] circuit of transformers' embeddings."""
    from headprune.anatomy import copying
    from tests.oracles.test_families import VOCAB, build

    hf, _, model = build("gemma3-untied-linear-softcap", tmp_path_factory)
    with torch.no_grad():
        W_E = hf.model.embed_tokens(torch.arange(VOCAB)).double()  # [V, d], transformers' scaled rows
    assert torch.equal(model.embedding_rows(3, 10), hf.model.embed_tokens(torch.arange(3, 10)).detach())
    W_U = hf.lm_head.weight.double()  # untied
    monkeypatch.setattr(copying, "GRAM_ROWS", 7)
    got = copying_scores(model)
    for row in got.itertuples():
        a = model.h[row.layer].attn
        M = W_E @ a.W_V[row.head].double() @ a.W_O[row.head].double() @ W_U.T  # [V, V]
        lam = torch.linalg.eigvals(M)
        assert row.copying == pytest.approx(float(lam.sum().real / lam.abs().sum()), abs=1e-8)


def test_copying_hand_case():
    """d = d_k = 2, one head, W_E = I on a 2-token vocabulary, W_V = I: M = W_O W_Eᵀ = W_O; W_O = diag(2, -1)
    has eigenvalues 2 and -1: (2 - 1) / (2 + 1) = 1/3."""
    model = built_model(vocab_size=2, n_positions=4, d_model=2, n_layers=1, n_heads=1, d_mlp=2)
    with torch.no_grad():
        model.wte.weight.copy_(torch.eye(2))
        model.h[0].attn.c_attn.weight[:, 4:6] = torch.eye(2)
        model.h[0].attn.c_proj.weight.copy_(torch.diag(torch.tensor([2.0, -1.0])))
    assert copying_scores(model)["copying"].iloc[0] == pytest.approx(1 / 3, abs=1e-12)


# ---------------------------------------------------------------- W_O geometry


def test_wo_geometry_hand_case():
    """d = 4, d_k = 2, two heads. Head 0: rows 3·e1, 1·e2 (σ = 3, 1). Head 1: rows e1, (e2 + e3)/√2 scaled by 2.
    Row spaces span{e1, e2} and span{e1, (e2+e3)/√2}: principal angles 0° and 45°, overlap (1 + 1/2)/2 = 0.75.
    Effective rank of head 0: exp(H(0.75, 0.25)); of head 1 (σ = 2, 2): 2."""
    model = built_model(vocab_size=5, n_positions=4, d_model=4, n_layers=1, n_heads=2, d_mlp=4)
    W = torch.zeros(4, 4)
    W[0, 0], W[1, 1] = 3, 1
    W[2, 0] = 2
    W[3, 1] = W[3, 2] = 2 / math.sqrt(2)
    with torch.no_grad():
        model.h[0].attn.c_proj.weight.copy_(W)
    heads, svs, pairs = wo_geometry(model)
    h0 = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert heads["wo_eff_rank"].tolist() == pytest.approx([math.exp(h0), 2.0], abs=1e-9)
    assert heads["wo_sv_max"].tolist() == pytest.approx([3.0, 2.0], abs=1e-9)
    assert svs[svs["head"] == 0]["sigma"].tolist() == pytest.approx([3.0, 1.0], abs=1e-9)
    assert pairs["overlap"].iloc[0] == pytest.approx(0.75, abs=1e-9)
    assert pairs[["min_angle_deg", "max_angle_deg"]].iloc[0].tolist() == pytest.approx([0.0, 45.0], abs=1e-5)
    assert heads["wo_overlap_rest"].tolist() == pytest.approx([0.75, 0.75], abs=1e-9)  # one other head: the pair


def test_wo_geometry_matches_scipy_subspace_angles(tiny_dir):
    model = load_model(tiny_dir)
    _, _, pairs = wo_geometry(model)
    for row in pairs.itertuples():
        W_O = model.h[row.layer].attn.W_O.double().numpy()
        angles = scipy.linalg.subspace_angles(W_O[row.head_a].T, W_O[row.head_b].T)
        assert row.overlap == pytest.approx(float(np.mean(np.cos(angles) ** 2)), abs=1e-10)
        assert row.max_angle_deg == pytest.approx(float(np.degrees(angles.max())), abs=1e-6)
    heads, _, _ = wo_geometry(model)
    W_O = model.h[2].attn.W_O.double().numpy()
    rest = scipy.linalg.subspace_angles(W_O[0].T, np.concatenate(W_O[1:]).T)  # head 0 against heads 1-3
    assert heads.set_index("head_id").loc["L2H0", "wo_overlap_rest"] == pytest.approx(
        float(np.sum(np.cos(rest) ** 2) / 8), abs=1e-10)


def test_effective_rank_edges():
    assert float(effective_rank(torch.tensor([5.0, 0.0, 0.0]))) == pytest.approx(1.0)
    assert float(effective_rank(torch.tensor([2.0, 2.0, 2.0, 2.0]))) == pytest.approx(4.0)


# ---------------------------------------------------------------- the joined table


def test_head_anatomy_joins_every_measure(tiny_dir):
    model = load_model(tiny_dir)
    ids = random_tokens(B=1, T=100, seed=2).view(-1)
    corpus = corpus_rows(ids, 32, 2)
    assert corpus.shape == (2, 32) and torch.equal(corpus.reshape(-1), ids[:64])
    probe = repeated_random_tokens(model.cfg.vocab_size, 8, 2)
    a = head_anatomy(model, probe, corpus)
    assert len(a.heads) == 12 and a.heads.notna().all().all()
    pd_roles = detect_heads(model, probe).set_index("head_id")
    np.testing.assert_allclose(a.heads.set_index("head_id").loc[pd_roles.index, "induction"], pd_roles["induction"])
    np.testing.assert_allclose(a.heads["dla"], logit_attribution(model, corpus).heads["dla"])


def test_anatomy_command_writes_the_tables(tiny_dir, corpus, tmp_path, capsys):
    import pandas as pd

    from headprune.cli.main import main

    out = tmp_path / "anatomy"
    argv = ["anatomy", "--model", str(tiny_dir), "--data", str(corpus), "--seq-len", "32", "--rows", "2",
            "--probe-length", "8", "--probe-count", "2", "--seed", "3", "--out", str(out)]
    assert main(argv) == 0
    assert "composition pairs" in capsys.readouterr().out
    heads = pd.read_csv(out / "heads.csv")
    expected = detect_heads(load_model(tiny_dir), repeated_random_tokens(50257, 8, 2, seed=3))
    np.testing.assert_allclose(heads["induction"], expected["induction"], rtol=1e-6)
    assert len(pd.read_csv(out / "composition.csv")) == 48
    assert ({"singular_values.csv", "wo_pairs.csv", "attribution.csv", "settings.json"}
            <= {p.name for p in out.iterdir()})
    assert main([*argv[:-2], "--probe-length", "40", "--out", str(tmp_path / "x")]) == 2  # 2·40 > n_positions 64
    assert "--probe-length 40 is too long" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_bootstrap_spearman_interval():
    """ρ equals scipy's; the interval holds it, and equals a loop of scipy.stats.spearmanr over the same resamples."""
    from scipy.stats import spearmanr

    from headprune.report.anatomy import bootstrap_spearman

    rng = np.random.default_rng(1)
    x = rng.normal(size=40)
    y = x + rng.normal(size=40)
    rho, lo, hi = bootstrap_spearman(x, y, n=300, seed=5)
    assert rho == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)
    idx = np.random.default_rng(5).integers(0, 40, size=(300, 40))
    loop = [spearmanr(x[i], y[i]).statistic for i in idx]
    assert (lo, hi) == pytest.approx((np.quantile(loop, 0.025), np.quantile(loop, 0.975)), abs=1e-12)
    assert lo < rho < hi


def test_report_section_from_saved_anatomy_without_torch_inputs(tmp_path):
    """The report section from a hand-made AnatomyReport: the top-heads table follows abl_zero, the findings quote
    the numbers, and the files round-trip through rebuild_report."""
    import pandas as pd

    from headprune.report import ReportSections, build_report, rebuild_report
    from headprune.report.anatomy import AnatomyReport, Thumbnail

    from report_tables import BASELINE, SETTINGS, make_curves, make_scores

    scores = make_scores()
    heads = scores[["layer", "head", "head_id"]].copy()
    rng = np.random.default_rng(0)
    for col in ("previous_token", "duplicate_token", "induction", "previous_token_corpus", "duplicate_token_corpus",
                "dla", "copying", "wo_eff_rank", "wo_overlap_rest"):
        heads[col] = rng.uniform(0, 0.1, size=len(heads))
    heads.loc[5, "induction"] = 0.4  # the strongest: 80% of an ideal 0.5
    comp = pd.DataFrame([{"layer_a": 0, "head_a": 0, "layer_b": 1, "head_b": 1, "head_a_id": "L0H0",
                          "head_b_id": "L1H1", "q_comp": 0.2, "k_comp": 0.3, "v_comp": 0.1}])
    thumbs = [Thumbnail("L1H1", "strongest induction", "probe", [[1.0, 0.0], [0.5, 0.5]])]
    anatomy = AnatomyReport(heads, comp, thumbs, {"induction_ideal": 0.5, "induction_uniform": 0.02})
    build_report(scores, make_curves(), tmp_path / "r", settings=SETTINGS, baseline=BASELINE,
                 extra=ReportSections(anatomy=anatomy))
    summary = (tmp_path / "r" / "summary.md").read_text()
    rank = int(scores["abl_zero"].rank(ascending=False, method="min")[5])
    assert (f"strongest induction score is 0.400 ({heads.head_id[5]}, 80% of the 0.500 an ideal induction head scores"
            in summary and "the model has induction heads" in summary and f"ranks #{rank} of 12" in summary)
    top = scores.sort_values("abl_zero", ascending=False)["head_id"].head(10).tolist()
    table = summary.split("with their anatomy")[1]
    assert [line.split(" | ")[1] for line in table.splitlines() if line.startswith("| ") and "L" in line][:10] == top
    rebuilt = rebuild_report(tmp_path / "r" / "scores.csv", tmp_path / "r" / "curves.csv", tmp_path / "again")
    assert "strongest induction score is 0.400" in rebuilt.with_name("summary.md").read_text()
    assert (tmp_path / "again" / "anatomy_attention.png").read_bytes()[:4] == b"\x89PNG"
