"""Fixtures: the token cache, a small corpus, random-init GPT-2 checkpoints saved in exact Hugging Face format, and an
offline HF cache. Helper functions live in helpers.py."""

from __future__ import annotations

import io
import os
import shutil

import pytest
import torch

from helpers import PATCH_CFG, PATCH_SEED, TINY, save_hf_gpt2, write_corpus

# commands run as one process here (tests read their output in-process); tests/cli/test_workers.py asks for two
os.environ["HEADPRUNE_WORKERS"] = "1"

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest -n 2: one core per test worker, for its own torch and for the processes its tests start
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    torch.set_num_threads(1)


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    """Under -q, pytest-xdist's status line is a bare "bringing up nodes..." written twice to a non-terminal: left
    out (the summary line still gives the counts)."""
    reporter = config.pluginmanager.get_plugin("terminaldistreporter")
    if reporter is not None and config.option.verbose < 0 and hasattr(reporter, "ensure_show_status"):
        reporter.ensure_show_status = lambda: None


def pytest_terminal_summary(terminalreporter, config):
    """The line coverage of headprune in one line (pyproject's addopts ask pytest-cov for no table)."""
    controller = getattr(config.pluginmanager.get_plugin("_cov"), "cov_controller", None)
    cov = getattr(controller, "cov", None)
    if cov is None or any(config.getoption("cov_report", None) or {}):  # no coverage, or a report was asked for
        return
    try:
        total = cov.report(ignore_errors=True, output_format="total", file=io.StringIO())
    except Exception:  # noqa: BLE001 - coverage.exceptions.NoDataError and the like: no line to print
        return
    terminalreporter.write_line(f"line coverage of headprune: {total:.1f}% (--cov-report=term: per module)")


@pytest.fixture(autouse=True, scope="session")
def token_cache(tmp_path_factory):
    """The token cache of every test (and of the processes tests start): a session folder, never ~/.cache.

    A module that needs its own empty cache overrides this fixture."""
    path = tmp_path_factory.getbasetemp() / "token-cache"
    mp = pytest.MonkeyPatch()
    mp.setenv("HEADPRUNE_CACHE", str(path))
    yield path
    mp.undo()


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """A 12,000-character English text file (pydoc topics)."""
    return write_corpus(tmp_path_factory.mktemp("corpus") / "c.txt")

@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """3 layers x 4 heads x d_model 32, GPT-2 vocabulary, weights large enough that heads matter."""
    folder = tmp_path_factory.mktemp("tiny-gpt2")
    save_hf_gpt2(folder, **TINY)
    return folder


@pytest.fixture(scope="session")
def patch_dir(tmp_path_factory):
    """The patching tests' GPT-2 (:data:`helpers.PATCH_CFG`): 3 layers x 4 heads, a 96-token vocabulary."""
    folder = tmp_path_factory.mktemp("patch-gpt2")
    save_hf_gpt2(folder, seed=PATCH_SEED, **PATCH_CFG)
    return folder


@pytest.fixture(scope="session")
def small_dir(tmp_path_factory):
    """The GPT-2 small architecture (12 x 12 x 768, vocab 50257), random weights."""
    folder = tmp_path_factory.mktemp("gpt2-small")
    save_hf_gpt2(folder)
    return folder


@pytest.fixture(scope="session")
def hf_cache(tmp_path_factory, tiny_dir):
    """An HF_HOME whose hub cache holds ``testorg/tiny-gpt2`` laid out as huggingface_hub lays it out."""
    home = tmp_path_factory.mktemp("hf-home")
    repo = home / "hub" / "models--testorg--tiny-gpt2"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in tiny_dir.iterdir():
        blob = repo / "blobs" / f"blob-{file.name}"
        shutil.copy(file, blob)
        (snapshot / file.name).symlink_to(f"../../blobs/{blob.name}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return home


# Test files by measured duration, heaviest first: with `-n 2 --dist loadfile` each file runs on one worker (its
# module fixtures built once), and starting the long ones first lets both workers finish together.
HEAVIEST_FIRST = ("oracles/test_real_models.py",
                  "reliability/test_resume_and_bad_input.py", "cli/test_torchrun.py", "cli/test_end_to_end.py",
                  "reliability/test_machine_failures.py", "oracles/test_finetune.py", "cli/test_families_cli.py",
                  "oracles/test_learned_gates.py", "oracles/test_bf16_vs_fp32.py", "oracles/test_anatomy.py",
                  "oracles/test_iterative_and_curves.py", "reliability/test_failure_classes.py",
                  "reliability/test_mixed_inputs.py", "cli/test_reproduce_report.py",
                  "cli/test_run_progress_cleanup.py", "report/test_first_screen.py", "report/test_findings.py",
                  "oracles/test_bootstrap.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(HEAVIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0].removeprefix("tests/"), len(rank)))
