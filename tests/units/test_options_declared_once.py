"""Every command-line option is declared in one place: a flag that two commands share comes from one function of
headprune/cli/options.py, so its type, default and checks cannot drift apart."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import headprune

CLI = Path(headprune.__file__).parent / "cli"


def declarations(sources: dict[str, str]) -> dict[str, list[str]]:
    """flag -> the places (file:line) of the ``add_argument`` calls that declare it."""
    found: dict[str, list[str]] = defaultdict(list)
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"):
                        found[arg.value].append(f"{name}:{node.lineno}")
    return found


def test_no_flag_is_declared_twice():
    sources = {p.name: p.read_text() for p in sorted(CLI.glob("*.py"))}
    twice = {flag: places for flag, places in declarations(sources).items() if len(places) > 1}
    assert twice == {}


def test_shared_flags_come_from_options():
    """The flags several commands take are declared in options.py only (and reach every command that takes them)."""
    sources = {p.name: p.read_text() for p in sorted(CLI.glob("*.py"))}
    found = declarations(sources)
    for flag in ("--seed", "--ablation-rows", "--json", "--scores", "--methods", "--out", "--quiet", "--gate-steps"):
        assert [place.split(":")[0] for place in found[flag]] == ["options.py"], flag


def test_the_scan_sees_a_second_declaration():
    text = 'p.add_argument("--seed", type=int)\nq.add_argument("--seed", default=1)\n'
    assert declarations({"a.py": text, "b.py": 'p.add_argument("--x")'}) == {
        "--seed": ["a.py:1", "a.py:2"], "--x": ["b.py:1"]}
