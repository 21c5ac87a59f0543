"""No import circles among headprune's modules, and no import running back up between its rooms (top-level modules
and folders, io/ split in three), counting every import: module level, inside functions (lazy) and under
``TYPE_CHECKING``. The graph is ``scripts/layers.py``'s, the command that prints the floors."""

from __future__ import annotations

from scripts.layers import back_up, cycles, floors, import_graph, room_graph, room_of


def test_the_graph_sees_lazy_and_type_checking_imports():
    graph = import_graph()
    assert "headprune.models.base" in graph["headprune.models.gpt2"]  # a module-level import
    assert "headprune.display" in graph["headprune.scoring.result"]  # one inside a method
    assert "headprune.stages.curves" in graph["headprune"]  # one under TYPE_CHECKING


def test_no_import_circles():
    assert cycles(import_graph()) == []


def test_a_planted_circle_is_found():
    graph = import_graph()
    graph["headprune.models.base"].add("headprune.models.gpt2")
    assert ["headprune.models.base", "headprune.models.gpt2"] in cycles(graph)


def test_rooms_are_folders_and_io_is_three():
    assert [room_of(m) for m in ("headprune.scoring.weights", "headprune.io.read.gguf", "headprune.io.work.files",
                                 "headprune.errors", "headprune")] == ["scoring", "io/read", "io/work", "errors",
                                                                       "__init__"]


def test_no_import_runs_back_up_between_rooms():
    rooms = room_graph(import_graph())
    assert back_up(rooms) == []
    floor = floors(rooms)
    assert all(floor[b] < floor[a] for a, targets in rooms.items() for b in targets)  # every arrow points down


def test_a_planted_import_back_up_is_found():
    graph = import_graph()
    graph["headprune.models.base"].add("headprune.scoring.weights")  # models would import from a room above it
    found = back_up(room_graph(graph))
    assert ("models", "scoring") in found and ("scoring", "models") in found
