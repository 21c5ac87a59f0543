"""Scale-out pieces that need no second process: cost-balanced unit assignment, the ablation units' costs,
resuming from the progress files of a run with another number of processes, and loading without a second copy."""

import json
import subprocess
import sys

import pytest
import torch

from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.io.work import distributed
from headprune.io.work.distributed import assign_units, progress_files
from headprune.io.work.progress import Progress, fingerprint
from headprune.perplexity import Windowing
from headprune.scoring.ablation import AblationScores
from headprune.scoring.base import ScoringContext


def test_assign_units_longest_first_by_hand():
    # loads (r0, r1): 5 -> (5,0); 4 -> (5,4); 3 -> (5,7); 3 -> (8,7); 3 -> (8,10)
    assert assign_units([5, 4, 3, 3, 3], 2) == [[0, 3], [1, 2, 4]]
    assert assign_units([1.0] * 7, 3) == [[0, 3, 6], [1, 4], [2, 5]]  # equal costs: i mod N, as before
    assert assign_units([], 2) == [[], []] and assign_units([2.0], 3) == [[0], [], []]


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_assign_units_balances_ablation_costs(world):
    """GPT-2 XL shapes, 4 batches, 3 ablation methods: every rank's summed cost within 2% of every other's,
    where the old i-mod-N striding is up to 16% apart."""
    L, H, d, V, T, b = 48, 25, 1600, 50257, 1024, 8
    c, u = 24 * d * d + 4 * T * d, 2 * d * V
    costs = []
    for _ in range(4):
        costs += [b * T * (L * c + u)] + [H * b * T * ((L - l) * c + u) for _ in range(3) for l in range(L)]
    shares = assign_units(costs, world)
    assert sorted(i for s in shares for i in s) == list(range(len(costs))) and all(s == sorted(s) for s in shares)
    loads = [sum(costs[i] for i in s) for s in shares]
    assert max(loads) / min(loads) <= 1.02
    assert max(loads) <= sum(costs) / world + max(costs)  # LPT's guarantee
    assert assign_units(costs, world) == shares  # deterministic


def test_ablation_unit_costs(tiny_dir):
    model = load_model(tiny_dir)
    ids = torch.arange(200) % 1000
    batches = Windowing.resolve(model.cfg.n_positions, 64, batch_size=2).batches(ids)
    ctx = ScoringContext(model, batches, ["abl_zero"])
    family = AblationScores()
    units = family.units(ctx)
    costs = dict(zip([k for k, _ in units], family.costs(ctx, units), strict=True))
    cfg, T = model.cfg, 64
    c = 24 * cfg.d_model**2 + 4 * T * cfg.d_model  # d_mlp = 4d
    u = 2 * cfg.d_model * cfg.vocab_size
    assert costs["base/w/b0"] == 2 * T * (cfg.n_layers * c + u)
    assert costs["abl_zero/w/b0/L0"] == cfg.n_heads * 2 * T * (cfg.n_layers * c + u)
    assert costs["abl_zero/w/b0/L2"] / costs["abl_zero/w/b0/L0"] == pytest.approx((c + u) / (3 * c + u))
    assert costs["abl_zero/w/b1/L0"] == costs["abl_zero/w/b0/L0"] / 2  # the last batch holds 1 window of 2


def _write_progress(path, settings, units, torn=""):
    lines = [json.dumps({"fingerprint": fingerprint(**settings), "settings": settings})]
    lines += [json.dumps({"unit": k, "value": v}) for k, v in units.items()]
    path.write_text("\n".join(lines) + "\n" + torn)


def test_resume_from_progress_of_another_process_count(tmp_path, monkeypatch):
    """Files of a killed 2-process run are resumed by 1 process and by 3 (never written, removed at the end);
    this run's own file is kept apart; a torn last line is redone; another run's file is refused."""
    settings = {"command": "score", "model": "abc"}
    out = tmp_path / "s.csv.progress.jsonl"
    _write_progress(out.with_name(out.name + ".rank0-of-2"), settings, {"a": 1, "c": 3}, torn='{"unit": "e", "va')
    _write_progress(out.with_name(out.name + ".rank1-of-2"), settings, {"b": [2.5]})
    (tmp_path / "unrelated.rank0-of-2").write_text("x")

    mine, others = progress_files(out)  # one process
    assert mine == out and [p.name for p in others] == [out.name + ".rank0-of-2", out.name + ".rank1-of-2"]
    progress = Progress(mine, settings, others=others)
    assert progress.units == {"a": 1, "c": 3, "b": [2.5]} and "e" not in progress
    assert progress.get_or_compute("d", lambda: 4) == 4 and progress.get_or_compute("a", lambda: 99) == 1
    assert others[0].read_text().endswith('"va')  # never written
    monkeypatch.setattr(distributed, "rank_and_world", lambda: (1, 3))  # rank 1 of 3 sees all three others
    mine3, others3 = progress_files(out)
    assert mine3.name == out.name + ".rank1-of-3" and {p.name for p in others3} == {
        out.name, out.name + ".rank0-of-2", out.name + ".rank1-of-2"}
    assert Progress(mine3, settings, others=others3).units == {"a": 1, "c": 3, "b": [2.5], "d": 4}
    with pytest.raises(HeadpruneError, match="progress of a different run"):
        Progress(mine3, {**settings, "model": "other"}, others=others3)
    progress.remove()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["unrelated.rank0-of-2"]


def test_overwrite_discards_progress_of_another_process_count(tmp_path):
    settings = {"command": "score"}
    out = tmp_path / "s.csv.progress.jsonl"
    _write_progress(out.with_name(out.name + ".rank0-of-2"), {"command": "other"}, {"a": 1})
    mine, others = progress_files(out)
    assert Progress(mine, settings, overwrite=True, others=others).units == {}
    assert not list(tmp_path.iterdir())


_PEAK = """
import ctypes, json, sys, torch
# a fixed mmap threshold (glibc's M_MMAP_THRESHOLD, 128 KiB): every freed large block goes back to the kernel at
# once, so the peak counts live memory, not heap the allocator kept from earlier frees (which made the growth
# depend on what the process had done before: 1.0x to 1.55x of the weights for the same load)
ctypes.CDLL("libc.so.6").mallopt(-3, 128 << 10)
from headprune.io.read.loading import load_model
def rss(): return int(open('/proc/self/statm').read().split()[1]) * 4096
load_model(sys.argv[4], dtype=sys.argv[2], fold_value_bias=sys.argv[3] == "fold")  # every lazy import done
def hwm(): return int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0]) * 1024
open('/proc/self/clear_refs', 'w').write('5')  # resets the peak (VmHWM) to the current resident set
before = rss()
model = load_model(sys.argv[1], dtype=sys.argv[2], fold_value_bias=sys.argv[3] == "fold")
peak = hwm()
held = sum(t.numel() * t.element_size() for t in model.state_dict().values())
print(json.dumps({"grown": max(peak, rss()) - before, "held": held}))
"""


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "fold", "bound"), [("fp32", "", 1.5), ("fp32", "fold", 1.5), ("bf16", "", 1.0)])
def test_loading_holds_no_second_copy(tmp_path_factory, tiny_dir, dtype, fold, bound):
    """The peak resident set (VmHWM, reset after a warm-up load) of loading a 2-shard checkpoint of 92 MB fp32
    weights grows by ≤ 1.5x them in fp32 (the issue's bound; measured 1.08x: the model plus one tensor in flight)
    and ≤ 1.0x in bf16 (measured 0.60x), where reading every tensor first and
    copying it into a randomly initialised model grew by ≥ 2x. The model really is resident (≥ 0.9x what it
    holds). On GPT-2 XL the slack is negligible: 1.07x fp32, 0.63x bf16 (benchmarks/bench_xl.py)."""
    from benchmarks import bench_xl

    folder = tmp_path_factory.getbasetemp() / "ckpt-100mb"
    if not (folder / "config.json").exists():
        bench_xl.build_checkpoint(folder, {"n_layer": 6, "n_head": 8, "n_embd": 512, "vocab_size": 8192,
                                           "n_positions": 256}, shard_bytes=60 * 10**6)
    fp32 = sum(4 * t.numel() for t in load_model(folder).state_dict().values())
    assert len(list(folder.glob("*.safetensors"))) == 2 and fp32 > 90e6, fp32
    proc = subprocess.run([sys.executable, "-c", _PEAK, str(folder), dtype, fold, str(tiny_dir)],
                          capture_output=True, text=True, check=True, timeout=300)
    result = json.loads(proc.stdout)
    assert result["held"] == fp32 // (2 if dtype == "bf16" else 1)
    assert 0.9 * result["held"] <= result["grown"] <= bound * fp32, result
