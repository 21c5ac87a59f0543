"""The README's recipes, as written: its ``headprune`` command lines for the shipped model, parsed from README.md,
run in a fresh folder in the README's order and in reverse order (each command after the recipes that write the
files it reads), every one succeeding, and the report holding the patching study exactly when ``patch`` ran before
it. Only ``--max-tokens`` and ``--n-pairs`` are added (to the commands that take them), to keep the run short; lines
for other models (smollm2, a llama folder) are left out.

And the README's prune recipe is the report's headline point: its ranking and fraction are the headline's best
ranking at 30%, uncompensated, and its ``eval`` prints the perplexity the headline gives (the committed report's
curves), here run as written on the committed report's scores."""

import json
import re
import shlex
import shutil
from pathlib import Path

import pandas as pd
import pytest

from headprune.cli.main import build_parser, main, option_names
from headprune.report.choice import best_method
from headprune.report.findings import FINDING_FRACTIONS
from headprune.report.headline import cost_answer
from headprune.report.patching_section import SECTION_TITLE

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "reports" / "stdlib-gpt2-mini"
SMALLER = {"--max-tokens": "512", "--n-pairs": "8"}  # less data where a command takes these: the same code paths
INPUTS = ("--scores", "--curves", "--model", "--pairs")  # options naming a file or folder a command reads


def recipe_lines(readme: str) -> list[list[str]]:
    """argv (without ``headprune``) of every command line in the README's Recipes section's bash blocks, in order."""
    section = readme.split("\n## Recipes\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```bash\n(.*?)^```", section, flags=re.DOTALL | re.MULTILINE)
    return [shlex.split(line, comments=True)[1:] for block in blocks for line in block.splitlines()
            if line.startswith("headprune ")]


def value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def shipped_model_lines(lines: list[list[str]]) -> list[list[str]]:
    """The lines that run the shipped model: no --model, or a model another line writes."""
    outs = {value(a, "--out") for a in lines}
    return [a for a in lines if value(a, "--model") in (None, *outs)]


def dependency_order(lines: list[list[str]]) -> list[list[str]]:
    """``lines`` in their order, except that a line comes after the lines whose --out it reads (once each)."""
    writer = {value(a, "--out"): i for i, a in enumerate(lines)}
    done: list[int] = []

    def visit(i: int) -> None:
        if i in done:
            return
        for flag in INPUTS:
            if (path := value(lines[i], flag)) is not None and (j := writer.get(path)) is not None:
                visit(j)
        done.append(i)

    for i in range(len(lines)):
        visit(i)
    return [lines[i] for i in done]


def smaller(argv: list[str]) -> list[str]:
    """``argv`` with :data:`SMALLER`'s options that its command takes and the line does not give."""
    takes = option_names(build_parser(), argv[0]).values()
    return [*argv, *(x for flag, n in SMALLER.items() if flag in takes and flag not in argv for x in (flag, n))]


README_LINES = shipped_model_lines(recipe_lines((ROOT / "README.md").read_text()))


def test_the_readme_recipes_are_the_shipped_models_commands():
    """What the slow test runs: the README's seven recipes, every command's outputs under out/."""
    assert [a[0] for a in README_LINES] == ["score", "prune", "eval", "curve", "report", "anatomy", "patch"]
    assert all(value(a, "--out").startswith("out/") for a in README_LINES if "--out" in a)


@pytest.mark.slow
@pytest.mark.parametrize("order", ["readme", "reverse"])
def test_readme_recipes_run_in_either_order(order, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    lines = README_LINES if order == "readme" else dependency_order(README_LINES[::-1])
    ran = []
    for argv in lines:
        assert main(smaller(argv)) == 0, (argv, capsys.readouterr().err)
        ran.append(argv[0])
        if argv[0] == "report":
            summary = (tmp_path / value(argv, "--out") / "summary.md").read_text()
            assert (f"## {SECTION_TITLE}" in summary) == ("patch" in ran), (order, ran)
    assert sorted(ran) == sorted(a[0] for a in README_LINES)
    if order == "reverse":  # patch first, and the report after it
        assert ran.index("patch") < ran.index("report")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing, progress files included, outside out/


@pytest.mark.slow
def test_readme_prune_recipe_prints_the_headlines_perplexity(tmp_path, monkeypatch, capsys):
    """The README's prune and eval lines, as written, on the committed report's scores (the score recipe's grad
    column is the same: both read the default corpus' validation split, 8,192 tokens): the perplexity ``eval``
    prints is the headline's for the best ranking at 30%."""
    prune = next(a for a in README_LINES if a[0] == "prune")
    evaluate = next(a for a in README_LINES if a[0] == "eval")
    curves = pd.read_csv(COMMITTED / "curves.csv")
    best, fraction = best_method(curves), FINDING_FRACTIONS[0]
    assert (value(prune, "--method"), float(value(prune, "--fraction"))) == (best, fraction)
    assert "--compensate" not in prune  # the headline's points are uncompensated
    row = curves[(curves["method"] == best) & (curves["compensation"] == "none") & (curves["fraction"] == fraction)]
    want = float(row["ppl"].iloc[0])
    base = float(json.loads((COMMITTED / "baseline.json").read_text())["ppl"])
    point = f"{base:.1f} → {want:.1f}"
    said = cost_answer(curves, {"ppl": base})
    assert said.startswith(f"Perplexity {base:.1f} unpruned.") and f"{best} (best: lowest mean ΔNLL up to 50%) " \
        f"{want:.1f}," in said
    assert f"headline point (perplexity {point} on the shipped model" in (ROOT / "README.md").read_text()

    monkeypatch.chdir(tmp_path)
    scores = Path(value(prune, "--scores"))
    scores.parent.mkdir(parents=True)
    shutil.copy(COMMITTED / "scores.csv", scores)
    assert main(prune) == 0 and main(evaluate) == 0
    printed = re.search(r"^perplexity: ([0-9.]+) ", capsys.readouterr().out, flags=re.MULTILINE)
    assert printed is not None and float(printed.group(1)) == pytest.approx(want, abs=1e-4)
