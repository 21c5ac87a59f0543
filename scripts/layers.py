"""The package's structure read from its imports: rooms (a top-level module or folder of headprune/; io/ split into
read/, write/ and work/), the floor each stands on (the longest chain of rooms below it), the imports between rooms,
and any import that runs back up (between rooms that import each other, directly or through others) or closes a
circle of modules. Every import counts: module level, inside functions (lazy) and under ``TYPE_CHECKING``.

    python scripts/layers.py    # the floors, bottom first, and what runs back up

tests/units/test_import_graph.py holds both the imports running back up and the circles of modules at zero.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "headprune"
SPLIT = {"io"}  # folders whose subfolders are rooms of their own


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the headprune modules it imports (``from pkg import name``: ``pkg.name`` where that is a module,
    else ``pkg``)."""
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
    """Strongly connected components with more than one node (Tarjan), each sorted."""
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


def room_of(module: str) -> str:
    """``headprune.io.read.gguf`` -> ``io/read``; ``headprune.scoring.weights`` -> ``scoring``; the package's own
    ``__init__`` -> ``__init__``."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__"
    depth = 2 if parts[0] in SPLIT and len(parts) > 1 and (ROOT / parts[0] / parts[1]).is_dir() else 1
    return "/".join(parts[:depth])


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """room -> the rooms it imports from."""
    rooms: dict[str, set[str]] = defaultdict(set)
    for module, targets in graph.items():
        rooms[room_of(module)] |= {room_of(t) for t in targets} - {room_of(module)}
    return dict(rooms)


def floors(rooms: dict[str, set[str]]) -> dict[str, int]:
    """room -> its floor: 0 for a room that imports no other, else one above the highest room it imports (rooms in
    a circle share the floor of the circle)."""
    floor: dict[str, int] = {}

    def height(room: str, seen: frozenset[str]) -> int:
        if room not in floor:
            below = [height(r, seen | {room}) for r in rooms.get(room, ()) if r not in seen]
            floor[room] = 1 + max(below) if below else 0
        return floor[room]

    for room in sorted(rooms):
        height(room, frozenset())
    return floor


def back_up(rooms: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports between two rooms of one circle of rooms (each such import runs back up)."""
    return sorted((a, b) for circle in cycles(rooms) for a in circle for b in rooms[a] if b in circle)


def report() -> str:
    graph = import_graph()
    rooms = room_graph(graph)
    floor = floors(rooms)
    lines = [(f"headprune: {len(rooms)} rooms on {max(floor.values()) + 1} floors, {len(back_up(rooms))} imports "
              f"running back up, {len(cycles(graph))} circles of modules")]
    for level in range(max(floor.values()) + 1):
        here = sorted(r for r in rooms if floor[r] == level)
        lines.append(f"floor {level}: " + ", ".join(
            f"{r} (-> {', '.join(sorted(rooms[r]))})" if rooms[r] else r for r in here))
    lines += [f"back up: {a} -> {b}" for a, b in back_up(rooms)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
