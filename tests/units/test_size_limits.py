"""The project's size limits (issue 51): every module of headprune/, analyses/ and benchmarks/ at most 350 lines,
every function (methods and nested functions included) at most 60 lines, def line to last line (ast's end_lineno −
lineno + 1; decorators not counted), and at most 8 parameters (a method's self or cls not counted; *args and
**kwargs one each). A function that needs more inputs takes an options dataclass."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import headprune

ROOT = Path(headprune.__file__).parent
REPO = ROOT.parent
FOLDERS = (ROOT, REPO / "analyses", REPO / "benchmarks")  # the package, the studies and the benchmarks
MODULE_LINES, FUNCTION_LINES, PARAMETERS = 350, 60, 8

# The only functions allowed over a limit, and which limit (none now; an entry must go once its function is within
# the limits: test_allowlist_holds_only_functions_still_over fails until then).
ALLOWED: dict[str, set[str]] = {}


@dataclass(frozen=True)
class Function:
    name: str  # "path/in/headprune.py:Class.function" (nested: "outer.inner")
    lines: int
    parameters: int

    def over(self) -> set[str]:
        """The limits this function breaks."""
        return {limit for limit, size, most in (("lines", self.lines, FUNCTION_LINES),
                                                ("parameters", self.parameters, PARAMETERS)) if size > most}


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    positional = args.posonlyargs + args.args
    if positional and positional[0].arg in ("self", "cls"):
        positional = positional[1:]
    return len(positional) + len(args.kwonlyargs) + (args.vararg is not None) + (args.kwarg is not None)


def functions_of(tree: ast.AST, module: str) -> list[Function]:
    """Every function defined in ``tree``, at any depth, named by its enclosing classes and functions."""
    found: list[Function] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert child.end_lineno is not None
                found.append(Function(f"{module}:{prefix}{child.name}", child.end_lineno - child.lineno + 1,
                                      parameter_count(child)))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def modules() -> dict[str, str]:
    """{path (relative to headprune/ for the package's, to the repository for the others): source} of every
    module of :data:`FOLDERS`."""
    return {path.relative_to(ROOT if folder == ROOT else REPO).as_posix(): path.read_text(encoding="utf-8")
            for folder in FOLDERS for path in sorted(folder.rglob("*.py"))}


def all_functions() -> list[Function]:
    return [f for name, source in modules().items() for f in functions_of(ast.parse(source), name)]


def test_modules_within_the_line_limit():
    lines = {name: len(source.splitlines()) for name, source in modules().items()}
    over = [f"{name}: {n} lines" for name, n in lines.items() if n > MODULE_LINES]
    assert not over, f"modules over {MODULE_LINES} lines (split them by what they hold): {over}"


def test_functions_within_the_line_limit():
    over = [f"{f.name}: {f.lines} lines" for f in all_functions()
            if "lines" in f.over() and "lines" not in ALLOWED.get(f.name, set())]
    assert not over, f"functions over {FUNCTION_LINES} lines (split them into helpers with one job each): {over}"


def test_functions_within_the_parameter_limit():
    over = [f"{f.name}: {f.parameters} parameters" for f in all_functions()
            if "parameters" in f.over() and "parameters" not in ALLOWED.get(f.name, set())]
    assert not over, f"functions with over {PARAMETERS} parameters (group them in an options dataclass): {over}"


def test_allowlist_holds_only_functions_still_over():
    found = {f.name: f for f in all_functions()}
    assert "models/base.py:HeadAttention.attend" in found and "pruning/curves.py:pruning_curves" in found
    assert "analyses/real_model.py:unit_curves" in found and "benchmarks/bench_adaptive.py:main" in found
    stale = [f"{name} ({', '.join(sorted(limits - found[name].over()))})" if name in found else f"{name} (gone)"
             for name, limits in ALLOWED.items() if name not in found or not limits <= found[name].over()]
    assert not stale, f"within the limits now: remove from ALLOWED {stale}"


def test_the_counts_follow_the_stated_rules():
    source = ("class A:\n"
              "    def method(self, a, b, *rest, c, **more):\n"
              "        def inner(x):\n"
              "            return x\n"
              "        return inner\n"
              "\n"
              "    @classmethod\n"
              "    def build(cls, a):\n"
              "        return cls()\n")
    assert functions_of(ast.parse(source), "m.py") == [Function("m.py:A.method", 4, 5),
                                                        Function("m.py:A.method.inner", 2, 1),
                                                        Function("m.py:A.build", 2, 1)]
