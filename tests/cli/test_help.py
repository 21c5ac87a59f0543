"""The command line's help: what the tool is for, the commands, examples that parse, every option's default,
--version; and ``headprune report`` importing no torch."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import headprune
from headprune.cli.main import COMMANDS, build_parser, command_module, main
from headprune.cli.options import HelpFormatter
from headprune.report import build_report
from headprune.schema import IMPORTANCE_METHODS, METHODS

from report_tables import BASELINE, SETTINGS, make_curves, make_scores

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_top_help_says_what_it_is_for_lists_commands_and_ends_with_examples(wide):
    text = build_parser().format_help()
    assert "`" not in text and "Which attention heads of a transformer matter" in text
    lines = text.splitlines()
    for name in COMMANDS:
        help = command_module(name).HELP
        assert any(line.split() == [name, *help.split()] for line in lines), name  # one line each
    tail = [line for line in lines if line.strip()][-4:-1]
    assert len(tail) == 3 and all(line.startswith("  headprune ") for line in tail)
    for line in tail:
        argv = shlex.split(line.split("#")[0])[1:]
        args = build_parser().parse_args(argv)
        assert args.command in COMMANDS


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"headprune {headprune.__version__}"


def test_every_option_shows_its_default_or_that_it_is_required(wide):
    formatter = HelpFormatter("headprune")
    for name, parser in subparsers(build_parser()).items():
        assert parser.formatter_class is HelpFormatter
        text = parser.format_help()
        assert "`" not in text
        for action in parser._actions:
            if not action.option_strings or action.default is argparse.SUPPRESS:
                continue
            shown = formatter._get_help_string(action)
            assert "(default" in shown or "(required)" in shown, (name, action.option_strings)
            if action.default not in (None, False) and "(default:" in shown and action.help and \
                    "(default" not in action.help:
                assert f"(default: {action.default})" in shown


def option_help(command: str, option: str) -> str:
    parser = subparsers(build_parser())[command]
    action = next(a for a in parser._actions if option in a.option_strings)
    return HelpFormatter(command)._get_help_string(action)


def test_device_dtype_methods_list_their_choices():
    for command in ("eval", "score", "run", "prune"):
        assert all(c in option_help(command, "--device") for c in ("auto", "cpu", "cuda"))
        assert all(c in option_help(command, "--dtype") for c in ("fp32", "bf16", "fp16"))
    assert all(m in option_help("score", "--methods") for m in METHODS)
    assert all(m in option_help("curve", "--methods") for m in IMPORTANCE_METHODS)
    assert all(m in option_help("prune", "--method") for m in (*IMPORTANCE_METHODS, "random"))


def test_prune_data_help_matches_its_default():
    parser = subparsers(build_parser())["prune"]
    assert parser.parse_args(["--heads", "L0H0", "--out", "x"]).data is None
    assert option_help("prune", "--data").endswith("(default: none, not measured)")
    assert subparsers(build_parser())["eval"].parse_args([]).data == "default"


def test_help_and_report_command_import_no_torch(tmp_path):
    """``headprune --help``, ``headprune report --help`` and ``headprune report`` start without torch."""
    build_report(make_scores(), make_curves(), tmp_path / "a", settings=SETTINGS, baseline=BASELINE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-X", "importtime", "-m", "headprune", "report", "--scores", str(tmp_path / "a/scores.csv"),
            "--curves", str(tmp_path / "a/curves.csv"), "--out", str(tmp_path / "b")]
    for cmd in (argv[:5] + ["--help"], argv[:6] + ["--help"], argv):
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines() if "|" in line}
        assert "headprune" in imported and "torch" not in imported
    assert (tmp_path / "b/report.html").is_file()
