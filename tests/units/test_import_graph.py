"""No import circles among headprune's modules, counting every import: module level, inside functions (lazy) and
under ``TYPE_CHECKING``. A package's ``__init__`` is a module like the others; ``from pkg import name`` counts as
importing ``pkg.name`` where that is a module, else ``pkg``."""

from __future__ import annotations

import ast
from pathlib import Path

import headprune

ROOT = Path(headprune.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_lazy_and_type_checking_imports():
    graph = import_graph()
    assert "headprune.models.base" in graph["headprune.models.gpt2"]  # a module-level import
    assert "headprune.io.write.export" in graph["headprune.io.read.in_memory"]  # one inside a function


def test_no_import_circles():
    assert cycles(import_graph()) == []


def test_a_planted_circle_is_found():
    graph = import_graph()
    graph["headprune.models.base"].add("headprune.models.gpt2")
    assert ["headprune.models.base", "headprune.models.gpt2"] in cycles(graph)
