"""The CLI end to end on a random-init Llama (GQA 2, no attention_bias) and GPT-NeoX (biases), each saved with a
tiny trained BPE tokenizer.json, against transformers 5 (eval's sliding-window loop, exports loaded by
AutoModelForCausalLM, DLA from HF's own activations)."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
)

from headprune.cli.main import main
from headprune.data.tokens import corpus_ids
from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import model_tokenizer
from headprune.models.interventions import mask_gates
from headprune.models.prune import prune_heads
from tests.helpers import guide_loop, write_corpus

VOCAB, TOL = 320, 1e-4
SHAPES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
                                              "intermediate_size": 48}),
    "neox": (GPTNeoXConfig, GPTNeoXForCausalLM, {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 48,
                                                 "rotary_pct": 0.5}),
    "mistral": (MistralConfig, MistralForCausalLM, {"hidden_size": 32, "num_attention_heads": 4,
                                                    "num_key_value_heads": 2, "intermediate_size": 48}),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "c.txt")


@pytest.fixture(autouse=True)
def token_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HEADPRUNE_CACHE", str(tmp_path_factory.getbasetemp() / "token-cache"))


def save_tokenizer(folder, text: str) -> None:
    """A byte-level BPE of 300 tokens trained on ``text``, with an eos token, as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>").save_pretrained(folder)


@pytest.fixture(scope="module")
def built(corpus, tmp_path_factory):
    """{name: (folder, HF model)}: random init, norm weights and biases perturbed."""
    out = {}
    for i, (name, (cfg_cls, model_cls, kwargs)) in enumerate(SHAPES.items()):
        torch.manual_seed(i)
        hf = model_cls(cfg_cls(vocab_size=VOCAB, num_hidden_layers=2, max_position_embeddings=64,
                               initializer_range=0.15, **kwargs)).eval()
        with torch.no_grad():
            for pname, p in hf.named_parameters():
                if pname.endswith("bias") or "norm" in pname:
                    p.add_(0.3 * torch.randn_like(p))
        folder = tmp_path_factory.mktemp(name)
        hf.save_pretrained(folder)
        config = json.loads((folder / "config.json").read_text())
        config.pop("head_dim", None)  # as older checkpoints: d/h implied, so a compact export must write head_dim
        (folder / "config.json").write_text(json.dumps(config))
        save_tokenizer(folder, corpus.read_text())
        out[name] = (folder, hf)
    return out


def cli(capsys, *argv: str) -> str:
    assert main([str(a) for a in argv]) == 0
    return capsys.readouterr().out


def hf_logits(folder, x):
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return hf, hf(x).logits


def tokens(batch: int = 2, T: int = 20):
    return torch.randint(0, VOCAB, (batch, T), generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("name", ["llama", "neox"])
def test_info_and_eval_equal_hf_sliding_window(name, built, corpus, capsys):
    folder, hf = built[name]
    info = cli(capsys, "info", "--model", folder)
    assert ("(llama)" in info and "grouped-query" in info) if name == "llama" else "(gpt_neox)" in info
    out = json.loads(cli(capsys, "eval", "--model", folder, "--data", corpus, "--max-tokens", 300, "--seq-len", 32,
                         "--stride", 16, "--json"))
    ids = corpus_ids(str(corpus), "test", model_tokenizer(load_model(folder)), 300)
    nll, n = guide_loop(hf, ids, 32, 16)
    assert out["tokens"] == n and out["nll"] == pytest.approx(nll, abs=1e-5)


@pytest.mark.parametrize("name", ["llama", "neox"])
def test_score_all_curve_and_anatomy(name, built, corpus, capsys, tmp_path):
    folder, _ = built[name]
    data = ["--data", corpus, "--max-tokens", 200, "--seq-len", 32]
    cli(capsys, "score", "--model", folder, *data, "--methods", "all", "--out", tmp_path / "s.csv", "--quiet")
    scores = pd.read_csv(tmp_path / "s.csv")
    assert len(scores) == 8 and scores[["wo_fro", "ov_fro", "taylor", "abl_zero", "abl_mean"]].notna().all().all()
    cli(capsys, "curve", "--model", folder, *data, "--scores", tmp_path / "s.csv", "--methods", "taylor,abl_zero",
        "--fractions", "0,0.5", "--seeds", 2, "--bootstrap", 40, "--out", tmp_path / "c.csv", "--quiet")
    curves = pd.read_csv(tmp_path / "c.csv")
    assert (set(curves.method) == {"taylor", "abl_zero", "random"}
            and (curves[curves.fraction == 0].delta_nll == 0).all())
    cli(capsys, "anatomy", "--model", folder, *data, "--out", tmp_path / "anat")
    heads = pd.read_csv(tmp_path / "anat" / "heads.csv")
    assert len(heads) == 8 and heads[["dla", "copying"]].notna().all().all()


@pytest.mark.parametrize("name", ["llama", "neox"])
@torch.no_grad()
def test_dla_equals_hf_activations(name, built):
    """Head DLA from transformers' own o_proj inputs and final hidden state, through the final norm, scale frozen."""
    from headprune.anatomy.attribution import logit_attribution

    folder, hf = built[name]
    x = tokens()
    ours = logit_attribution(load_model(folder), x).heads
    layers = hf.gpt_neox.layers if name == "neox" else hf.model.layers
    inputs = {}
    hooks = [(blk.attention.dense if name == "neox" else blk.self_attn.o_proj).register_forward_pre_hook(
        lambda _m, args, layer=layer: inputs.__setitem__(layer, args[0].double())) for layer, blk in enumerate(layers)]
    norm = hf.gpt_neox.final_layer_norm if name == "neox" else hf.model.norm
    hooks.append(norm.register_forward_pre_hook(lambda _m, args: inputs.__setitem__("final", args[0].double())))
    with torch.no_grad():
        hf(x)
    for hook in hooks:
        hook.remove()
    final = inputs["final"]  # the residual stream entering the final norm
    u = hf.get_output_embeddings().weight.double()[x[:, 1:]] * norm.weight.double()  # (B,T-1,d)
    f = final[:, :-1]
    if name == "neox":  # LayerNorm: centre, divide by σ
        u = (u - u.mean(-1, keepdim=True)) / (f.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
    else:  # RMSNorm: divide by ρ
        u = u / (f.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon).sqrt()
    for row in ours.itertuples():
        o = (layers[row.layer].attention.dense if name == "neox" else layers[row.layer].self_attn.o_proj).weight
        cols = slice(row.head * 8, (row.head + 1) * 8)
        contrib = inputs[row.layer][:, :-1, cols] @ o.detach().double()[:, cols].T  # (B,T-1,d)
        assert row.dla == pytest.approx(float((contrib * u).sum(-1).mean()), abs=1e-5)


@pytest.mark.parametrize("name", ["llama", "neox"])
def test_prune_native_reloads_and_hf_export_loads_in_transformers(name, built, corpus, capsys, tmp_path):
    folder, _ = built[name]
    heads, data = "L0H1,L1H2,L1H3", ["--score-data", corpus, "--max-tokens", 200, "--seq-len", 32]
    cli(capsys, "prune", "--model", folder, "--heads", heads, "--out", tmp_path / "native", "--quiet")
    model, x = load_model(folder), tokens()
    gated = model(x, gates=mask_gates(model, [(0, 1), (1, 2), (1, 3)]))
    assert (load_model(tmp_path / "native")(x) - gated).abs().max() <= TOL
    # mean compensation: the constant goes into an o_proj bias, created (attention_bias) where the model has none
    for fmt in ("native", "hf"):
        out = cli(capsys, "prune", "--model", folder, "--heads", heads, "--compensate", "mean", *data,
                  "--format", fmt, "--out", tmp_path / f"mean-{fmt}", "--quiet")
    assert "original shapes with the removed heads zeroed" in out
    config = json.loads((tmp_path / "mean-hf" / "config.json").read_text())
    assert config["num_attention_heads"] == 4 and config.get("attention_bias") is True
    _, theirs = hf_logits(tmp_path / "mean-hf", x)
    native = load_model(tmp_path / "mean-native")
    assert native.h[0].attn.b_O.abs().max() > 0 and (theirs - native(x)).abs().max() <= TOL


def test_uniform_prune_exports_compact_hf_checkpoint(built, corpus, capsys, tmp_path):
    folder, _ = built["llama"]
    data = ["--data", corpus, "--max-tokens", 200, "--seq-len", 32]
    cli(capsys, "score", "--model", folder, *data, "--methods", "taylor", "--out", tmp_path / "s.csv", "--quiet")
    data += ["--score-data", corpus]
    for fmt in ("native", "hf"):
        out = cli(capsys, "prune", "--model", folder, "--scores", tmp_path / "s.csv", "--method", "taylor",
                  "--fraction", 0.5, "--uniform", "--compensate", "mean", *data, "--format", fmt,
                  "--out", tmp_path / fmt, "--quiet")
    assert "hf export: compact" in out and "4 heads removed" in out
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["num_attention_heads"] == 2 and config["head_dim"] == 8 and "headprune_kept_heads" not in config
    hf, theirs = hf_logits(tmp_path / "hf", tokens())
    assert hf.model.layers[0].self_attn.q_proj.weight.shape == (2 * 8, 32)
    assert (theirs - load_model(tmp_path / "native")(tokens())).abs().max() <= TOL


def test_uniform_heads_is_the_best_uniform_prune(built):
    """Against brute force over every prune of the model: same (KV heads, query heads per KV head) in every layer."""
    import itertools

    from headprune.pruning.uniform import uniform_heads

    model = load_model(built["llama"][0])
    rng = torch.Generator().manual_seed(0)
    scores = pd.DataFrame([{"layer": l, "head": h, "head_id": f"L{l}H{h}", "s": float(torch.rand(1, generator=rng))}
                           for l, h in model.head_ids])
    value = dict(zip(zip(scores["layer"], scores["head"]), scores["s"]))

    def shape(kept):  # (KV heads kept, query heads per KV head) or None when unbalanced
        per = [sum(1 for h in kept if h // 2 == g) for g in range(2)]
        nonzero = {p for p in per if p}
        return (len([p for p in per if p]), nonzero.pop()) if len(nonzero) == 1 else None

    assert len(uniform_heads(model, scores, "s", count=2)) == 4  # 3 kept per layer is no shape: 4 removed, not 0
    for count in (4, 6):
        best = None
        layer_sets = [s for k in range(1, 5) for s in itertools.combinations(range(4), k) if shape(s)]
        for a, b in itertools.product(layer_sets, repeat=2):
            if shape(a) == shape(b) and 8 - len(a) - len(b) == count:
                value_sum = sum(value[(0, h)] for h in a) + sum(value[(1, h)] for h in b)
                best = max(best or (value_sum, a, b), (value_sum, a, b))
        removed = set(uniform_heads(model, scores, "s", count=count))
        assert removed == ({(0, h) for h in range(4) if h not in best[1]}
                           | {(1, h) for h in range(4) if h not in best[2]})


def test_hf_export_refusals(built, tmp_path):
    from headprune.io.write.export import export_hf

    mistral = load_model(built["mistral"][0])
    filled = prune_heads(mistral, [(0, 1)], {(0, 1): torch.ones(8)})
    with pytest.raises(HeadpruneError, match="mistral has no o_proj bias"):
        export_hf(filled, tmp_path / "m")
    export_hf(prune_heads(mistral, [(0, 1)]), tmp_path / "plain")  # without a constant: fine
    assert not (tmp_path / "m").exists()
    from headprune.pruning.uniform import uniform_heads

    neox = load_model(built["neox"][0])
    frame = pd.DataFrame([{"layer": l, "head": h, "head_id": f"L{l}H{h}", "s": 1.0} for l, h in neox.head_ids])
    with pytest.raises(HeadpruneError, match="gpt_neox derives its head size"):
        uniform_heads(neox, frame, "s", count=2)


@pytest.mark.slow
def test_run_on_llama_names_family_layout_and_unit(built, corpus, tmp_path):
    folder, _ = built["llama"]
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "headprune", "run", "--model", str(folder), "--data", str(corpus),
                           "--score-data", str(corpus), "--max-tokens", "200", "--seq-len", "32", "--seeds", "2",
                           "--bootstrap", "40", "--fractions", "0,0.5", "--out", str(out), "--quiet"],
                          check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = (out / "summary.md").read_text()
    assert "llama, grouped-query attention, 4 query / 2 KV heads per layer" in summary
    assert "unit: query head" in summary
    assert len(pd.read_parquet(out / "scores.parquet")) == 8

    # the exports served in stock transformers: 25% is no shape of this model (nearest: 4 heads out of 8)
    serving = pd.read_csv(out / "serving.csv")
    assert serving["fraction"].tolist() == [0, 0.25, 0.5] and serving["removed"].tolist() == [0, 4, 4]
    assert (serving["max_abs_logit_diff"] <= TOL).all()
    curves = pd.read_csv(out / "curves.csv")
    assert serving["ppl"][0] == pytest.approx(curves[curves["fraction"] == 0]["ppl"].iloc[0], rel=1e-9)
    d_head, layers = 8, 2  # 32 / 4; keys and values of every layer, fp32
    assert serving["kv_bytes_per_token"].tolist() == [2 * layers * kv * d_head * 4 for kv in serving["kv_heads"]]
    compact = serving.iloc[2]
    assert compact["layout"] == "compact" and compact["query_heads"] * 2 == 4 and compact["parameters"] < \
        serving["parameters"][0]
    assert "Serving the pruned model in stock transformers" in summary
    assert summary.count("Removing 4 heads by ") == 1
    settings = json.loads((out / "settings.json").read_text())
    assert settings["serving"]["workload"]["seq_len"] == 32
    for rate in ("prefill_tokens_per_s", "decode_b1_tokens_per_s", "decode_b32_tokens_per_s"):  # the repeats' spread
        assert (serving[f"{rate}_min"] <= serving[rate]).all() and (serving[rate] <= serving[f"{rate}_max"]).all()
    assert "over the repeats)" in summary
    rebuilt = tmp_path / "rebuilt"
    assert main(["report", "--scores", str(out / "scores.csv"), "--curves", str(out / "curves.csv"),
                 "--out", str(rebuilt)]) == 0
    assert (rebuilt / "summary.md").read_text() == summary


def test_score_unit_group_equals_hf_joint_ablation(built, corpus, capsys, tmp_path):
    """abl_zero_group against transformers with an o_proj pre-hook zeroing every query-head slice of the group,
    through HF's own sliding-window loop; the summed columns are sums of the per-head table's."""
    folder, hf = built["llama"]
    data = ["--data", corpus, "--max-tokens", 200, "--seq-len", 32, "--stride", 16]
    summary = json.loads(cli(capsys, "score", "--model", folder, *data, "--methods", "abl_zero,wo_fro", "--unit",
                             "group", "--bootstrap", 40, "--json", "--out", tmp_path / "g.csv", "--quiet"))
    cli(capsys, "score", "--model", folder, *data, "--methods", "abl_zero,wo_fro", "--out", tmp_path / "h.csv",
        "--quiet")
    table, heads = pd.read_csv(tmp_path / "g.csv"), pd.read_csv(tmp_path / "h.csv")
    assert list(table.group_id) == ["L0G0", "L0G1", "L1G0", "L1G1"] and summary["groups"] == 4
    lo, hi = summary["summed_vs_joint_ci"]
    assert -1 <= lo <= summary["summed_vs_joint_spearman"] <= hi <= 1
    ids = corpus_ids(str(corpus), "validation", model_tokenizer(load_model(folder)), 200)
    from headprune.perplexity import Windowing
    from headprune.scoring.groups import group_ablation, summed_vs_joint

    model = load_model(folder)
    fit = summed_vs_joint(model, group_ablation(model, ids, Windowing(32, 16, 8)), 0)
    assert fit["summed"] == pytest.approx(table.abl_zero.to_numpy(), abs=1e-9)  # the sweep's single-head ablations
    base, _ = guide_loop(hf, ids, 32, 16)
    for row in table.itertuples():
        members = [int(h.split("H")[1]) for h in row.heads.split(",")]
        assert row.wo_fro == pytest.approx(heads[(heads.layer == row.layer) & heads["head"].isin(members)].wo_fro.sum())

        def zero(_module, args, members=members):
            z = args[0].clone()
            for h in members:
                z[..., h * 8:(h + 1) * 8] = 0
            return (z,)

        hook = hf.model.layers[row.layer].self_attn.o_proj.register_forward_pre_hook(zero)
        try:
            ablated, _ = guide_loop(hf, ids, 32, 16)
        finally:
            hook.remove()
        assert row.abl_zero_group == pytest.approx(ablated - base, abs=1e-5)
    # without replicates the interval is null, and groups.json stays JSON (no bare NaN)
    cli(capsys, "score", "--model", folder, *data, "--methods", "abl_zero", "--unit", "group", "--bootstrap", 0,
        "--out", tmp_path / "g0.csv", "--quiet")
    strict = json.loads((tmp_path / "g0.groups.json").read_text(),
                        parse_constant=lambda c: pytest.fail(f"groups.json holds {c}"))
    assert strict["summed_vs_joint_ci"] is None
    assert main(["score", "--model", str(built["neox"][0]), *map(str, data), "--unit", "group", "--out",
                 str(tmp_path / "n.csv")]) == 2
    assert "needs grouped-query attention" in capsys.readouterr().err and not (tmp_path / "n.csv").exists()


def test_finetune_and_learn_gates_on_llama(built, corpus, capsys, tmp_path):
    """Recovery fine-tuning of a pruned Llama's hf export (distilled from the unpruned model): the result loads in
    stock transformers with its logits equal to headprune's, the removed heads stay zero, and the reported
    perplexity is the reloaded model's. Learned gates close exactly the asked share of query heads."""
    from safetensors.torch import load_file

    from headprune.perplexity import Windowing, evaluate
    from headprune.pruning.finetune import load_pruned

    folder, _ = built["llama"]
    text = corpus.read_text()
    train, held_out = tmp_path / "train.txt", tmp_path / "eval.txt"
    train.write_text(text[: len(text) // 2])
    held_out.write_text(text[len(text) // 2 :])
    cli(capsys, "prune", "--model", folder, "--heads", "L0H1,L1H2", "--format", "hf", "--out", tmp_path / "pruned",
        "--data", held_out, "--quiet")
    summary = json.loads(cli(capsys, "finetune", tmp_path / "pruned", "--steps", "3", "--train-data", train,
                             "--data", held_out, "--teacher", folder, "--seq-len", "16", "--batch-size", "2",
                             "--lr", "1e-3", "--out", tmp_path / "ft", "--quiet", "--json"))
    assert summary["format"] == "hf" and summary["after"]["ppl"] != summary["before"]["ppl"]
    ours, _ = load_pruned(tmp_path / "ft")  # the export's record of its removed heads
    assert ours.cfg.kept_heads == [[0, 2, 3], [0, 1, 3]]
    _, theirs = hf_logits(tmp_path / "ft", tokens())
    assert (theirs - ours(tokens())).abs().max() <= TOL
    o_proj = load_file(tmp_path / "ft" / "model.safetensors")["model.layers.0.self_attn.o_proj.weight"]  # [32, 4·8]
    assert o_proj[:, 8:16].abs().max() == 0 and o_proj[:, :8].abs().max() > 0
    held_out_ids = corpus_ids(str(held_out), "test", model_tokenizer(ours), None)
    ev = evaluate(ours, held_out_ids, Windowing(64, 64), progress=False)
    assert ev.ppl == pytest.approx(summary["after"]["ppl"], rel=1e-5)

    out = cli(capsys, "learn-gates", "--model", folder, "--data", train, "--sparsity", "0.5", "--gate-steps", "4",
              "--seq-len", "16", "--out", tmp_path / "gates.csv", "--quiet")
    gates = pd.read_csv(tmp_path / "gates.csv")
    assert gates["head_id"].tolist() == [f"L{l}H{h}" for l in range(2) for h in range(4)]
    assert gates["gate"].between(0, 1).all() and "closed 4 of 8 heads" in out


def test_run_frees_its_model_before_transformers_loads_the_exports(built, corpus, tmp_path, monkeypatch):
    """The serving table's stock-transformers loads come after the run's last use of its own model, whose weights
    are freed first (two full models of a real one would sit in memory at once); the table's numbers unchanged."""
    from headprune import pipeline
    from headprune.pruning import serving
    from headprune.stages import inputs
    from headprune.stages.settings import RunSettings

    loaded, served = [], []
    monkeypatch.setattr(inputs, "load_model", lambda *a, **k: loaded.append(load_model(*a, **k)) or loaded[-1])
    measure = serving.measure_serving

    def measured(folder, work, check, device):
        served.append({p.device.type for p in loaded[0].parameters()})
        return measure(folder, work, check, device)

    monkeypatch.setattr(serving, "measure_serving", measured)
    settings = RunSettings(str(built["llama"][0]), data=str(corpus), score_data=str(corpus), max_tokens=200,
                                    seq_len=32, seeds=1, bootstrap=0, fractions=(0.0, 0.5), methods=("wo_fro",),
                                    patch_task="none", out=str(tmp_path / "report"))
    pipeline.run_analysis(settings, quiet=True, log=lambda *a: None)
    assert served == [{"meta"}, {"meta"}]  # 0% and 50% (25%'s nearest prune is 50%'s: served once)
    table = pd.read_csv(tmp_path / "report" / "serving.csv")
    assert (table["max_abs_logit_diff"] <= TOL).all() and table["removed"].tolist() == [0, 4, 4]
