"""podium's architecture as rules a change cannot break quietly: the parts of the package import
each other without a circle (lazy imports inside functions included), and no module grows past
:data:`MAX_MODULE_LINES`."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import podium

PACKAGE = Path(podium.__file__).parent
MAX_MODULE_LINES = 500


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _part(module: str) -> str:
    """The part a module belongs to: ``podium.launcher.backends.slurm`` -> ``launcher``;
    modules directly in the package (``podium.net``, ``podium.cli``) are parts of their own."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "podium"


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            if node.module == "podium":  # `from podium import x`: x may be a module of its own
                names += [f"podium.{alias.name}" for alias in node.names]
            found.update(names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name == "podium" or name.startswith("podium.")}


def part_graph() -> dict[str, set[str]]:
    """Which part imports which (importing ``podium`` itself runs the root, a part of its own)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        here = _part(_module_name(path))
        graph[here].update(there for there in map(_part, _imports(path)) if there != here)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_parts_import_each_other_without_a_circle() -> None:
    graph = part_graph()
    assert graph["launcher"] >= {"config", "rendezvous"}, graph  # the graph is really read
    cycle = _cycle(graph)
    assert cycle is None, f"import circle between podium's parts: {' -> '.join(cycle or [])}"


def test_the_cycle_check_finds_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_is_over_the_line_cap() -> None:
    sizes = {str(p.relative_to(PACKAGE.parent)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert len(sizes) > 50, sizes
    over = {path: n for path, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split them by concern): {over}"
