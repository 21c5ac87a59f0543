"""The README and docs/*.md: every relative link and every repository path they name exists, the README stays a
front door (≤ 150 lines, the set-up commands CI runs first), and its Python recipe starts with a cheap call."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SETUP = ["pip install torch==2.13.0 && pip install -e '.[dev]' && headprune run", "python -m pytest"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)
SPAN = re.compile(r"`([^`\n]+)`")
REPO_PATH = re.compile(r"(?<![\w./~-])(?:headprune|tests|reports|scripts|benchmarks|analyses|docs)/[\w./-]*")
MODULE = re.compile(r"python -m ((?:benchmarks|analyses)\.[a-z_][a-z0-9_]*)\b")  # NAME: a placeholder


def _prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)


def _ids(doc: Path) -> str:
    return doc.relative_to(ROOT).as_posix()


def test_docs_exist():
    names = {d.name for d in DOCS}
    assert {"methods.md", "anatomy.md", "reliability.md", "scaling.md", "python-api.md", "architecture.md"} <= names


@pytest.mark.parametrize("doc", DOCS, ids=_ids)
def test_relative_links_point_to_files(doc):
    targets = [t for t in LINK.findall(doc.read_text()) if not re.match(r"[a-z]+:", t)]
    missing = [t for t in targets if not (doc.parent / t.split("#")[0]).exists()]
    assert not missing, f"{_ids(doc)} links to missing files: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=_ids)
def test_named_repository_paths_and_modules_exist(doc):
    prose = _prose(doc.read_text())
    paths = {m for span in SPAN.findall(prose) for m in REPO_PATH.findall(span) if "<" not in m}
    missing = [p for p in sorted(paths) if not (ROOT / p).exists()]
    modules = {m for m in MODULE.findall(doc.read_text())}
    missing += [m for m in sorted(modules) if not (ROOT / (m.replace(".", "/") + ".py")).is_file()]
    assert not missing, f"{_ids(doc)} names what does not exist: {missing}"


def test_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= 150
    assert lines[0] == "# headprune"
    assert lines[2:6] == ["```bash", *SETUP, "```"]  # CI runs these two lines verbatim
    for doc in DOCS[1:]:
        assert f"](docs/{doc.name})" in text, f"README does not link docs/{doc.name}"


@pytest.mark.parametrize("name", ["README.md", "docs/python-api.md"])
def test_python_recipe_starts_cheap_and_says_what_all_costs(name):
    text = (ROOT / name).read_text()
    first = re.search(r"```python\n(.*?)```", text, re.DOTALL).group(1)
    calls = re.findall(r"score_heads\(([^\n]*)\)", first)
    assert calls and '"all"' not in calls[0], calls
    assert "1,345 CPU-s" in text


def test_install_text_names_the_cpu_wheel():
    text = (ROOT / "README.md").read_text()
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in text
    assert "CUDA build" in text and "measured on" in text
