"""podium's architecture as rules a change cannot break quietly: the parts of the package import
each other without a circle (lazy imports inside functions included), no two modules import each
other at module level, the teacher's layers import only downwards, no module grows past
:data:`MAX_MODULE_LINES` nor a function past :data:`MAX_FUNCTION_LINES`, no two classes share a name."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import podium

PACKAGE = Path(podium.__file__).parent
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


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


# ---------------------------------------------------------------------------------------- modules


def _module_imports(path: Path, *, module_level: bool) -> set[str]:
    """The podium modules ``path`` imports: at module level only (what runs when it is imported,
    ``if TYPE_CHECKING:`` blocks included: mypy follows them) or anywhere (lazy imports too).
    ``from podium.x import y`` is an import of ``podium.x.y`` where that is a module, else of
    ``podium.x`` (parent packages, which every import runs, are not counted)."""
    tree = ast.parse(path.read_text(), str(path))
    nodes: list[ast.AST] = []
    if module_level:
        pending: list[ast.AST] = list(tree.body)
        while pending:
            node = pending.pop()
            nodes.append(node)
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                pending.extend(ast.iter_child_nodes(node))
    else:
        nodes = list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & _MODULES
            found.update(submodules or {node.module})  # `from package import module`: that module
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in _MODULES}


_MODULES = {_module_name(p) for p in PACKAGE.rglob("*.py")}


def module_graph(*, module_level: bool = True) -> dict[str, set[str]]:
    """Which podium module imports which (a package's ``__init__`` is the package's name)."""
    return {_module_name(p): _module_imports(p, module_level=module_level) - {_module_name(p)}
            for p in PACKAGE.rglob("*.py")}


def test_no_module_level_import_circle() -> None:
    """No two modules import each other at module level, type-only imports included (a circle
    there works only by the order of imports, and breaks when it changes)."""
    graph = module_graph()
    assert "podium.teacher.seam" in graph["podium.teacher.endpoint.server"], graph["podium.teacher.endpoint.server"]
    cycle = _cycle(graph)
    assert cycle is None, f"module-level import circle: {' -> '.join(cycle or [])}"


# Within podium.teacher, the layers (see its package docstring) and what each may not import
# (lazy imports included): serving knows a group only through the seam and the micro-batch rule,
# model building knows nothing of compute or serving, the CPU stand-ins nothing of the others.
TEACHER_LAYERS_FORBIDDEN = {
    "podium.teacher.endpoint": ("podium.teacher.model", "podium.teacher.cpu", "podium.teacher.compute.group",
                                "podium.teacher.compute.worker", "podium.teacher.compute.head"),
    "podium.teacher.compute": ("podium.teacher.endpoint",),
    "podium.teacher.model": ("podium.teacher.endpoint", "podium.teacher.compute"),
    "podium.teacher.cpu": ("podium.teacher.endpoint", "podium.teacher.compute", "podium.teacher.model"),
    "podium.teacher.seam": ("podium.teacher.endpoint", "podium.teacher.compute", "podium.teacher.model",
                            "podium.teacher.cpu"),
    "podium.teacher.megatron_compat": ("podium.teacher.endpoint", "podium.teacher.compute", "podium.teacher.model",
                                       "podium.teacher.cpu"),
}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _layer_violations(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{module} imports {target}"
                  for layer, forbidden in TEACHER_LAYERS_FORBIDDEN.items()
                  for module, targets in graph.items() if _within(module, layer)
                  for target in targets if any(_within(target, f) for f in forbidden))


def test_the_teacher_layers_import_only_downwards() -> None:
    graph = module_graph(module_level=False)
    assert "podium.teacher.model.checkpoint_loader" in graph["podium.teacher.compute.worker"]  # the graph is read
    wrong = _layer_violations(graph)
    assert not wrong, "imports against podium.teacher's layers:\n" + "\n".join(wrong)


def test_the_layer_check_finds_a_wrong_import() -> None:
    graph = {"podium.teacher.model.hf.weights": {"podium.teacher.endpoint.server"},
             "podium.teacher.modelling": {"podium.teacher.endpoint.server"},  # not in the model layer
             "podium.teacher.endpoint.batching": {"podium.teacher.compute.microbatch"}}  # allowed
    assert _layer_violations(graph) == ["podium.teacher.model.hf.weights imports podium.teacher.endpoint.server"]


def test_no_function_is_over_the_line_cap() -> None:
    long = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"] = lines
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps): {long}"


def test_no_two_classes_share_a_name() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(str(path.relative_to(PACKAGE.parent)))
    assert len(where) > 50, sorted(where)
    twice = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not twice, f"classes sharing a name (a reader cannot tell them apart): {twice}"


# -- the launcher's sides ------------------------------------------------------------------------
# podium.launcher runs in two places: login/ where `podium` is typed, job/ inside a teacher's job,
# and common/ what both use; a cluster kind's scheduler (backends/<kind>/scheduler.py) is login's,
# its job environment (backends/<kind>/environment.py) the job's, the registry and base classes common.

# The login side's imports of the job side, each with why it is right.
LOGIN_IMPORTS_OF_THE_JOB = {
    ("podium.launcher.backends.local.scheduler", "podium.launcher.backends.local.environment"):
        "the local kind's job ids (sequence * PID_SPAN + controller PID) and its GPU rule (gpu_use) are "
        "defined once, in its environment, which computes them in the job; the scheduler, which hands the "
        "job its sequence and turns job ids back into PIDs and refuses what the GPUs cannot run, uses "
        "the same functions",
}


def _launcher_side(module: str) -> str | None:
    """``login``, ``job`` or ``common`` for a module of the launcher (the CLI is login's); None for
    the rest of podium."""
    parts = module.split(".")
    if module in ("podium.cli", "podium.cli_render"):
        return "login"
    if parts[:2] != ["podium", "launcher"]:
        return None
    rest = parts[2:]
    if rest and rest[0] in ("login", "job", "common"):
        return rest[0]
    if rest and rest[0] == "backends" and len(rest) == 3 and rest[2] in ("scheduler", "environment"):
        return "login" if rest[2] == "scheduler" else "job"
    assert not rest or rest[0] == "backends", f"{module}: a launcher module outside login/, job/, common/, backends/"
    return "common"


def test_the_launchers_job_side_never_imports_its_login_side() -> None:
    """The job never imports the login side (module level or lazily), so a node task loads no CLI,
    renderer or submission code; the login side imports the job side only as
    :data:`LOGIN_IMPORTS_OF_THE_JOB` says why; ``common`` imports neither."""
    paths = [*sorted((PACKAGE / "launcher").rglob("*.py")), PACKAGE / "cli.py", PACKAGE / "cli_render.py"]
    graph = module_graph(module_level=False)
    sides: dict[str, set[str]] = defaultdict(set)
    crossings: set[tuple[str, str]] = set()
    wrong: list[str] = []
    for path in paths:
        here = _module_name(path)
        side = _launcher_side(here)
        assert side is not None, here
        sides[side].add(here)
        for there in graph[here]:
            other = _launcher_side(there)
            if other is None or other == side or other == "common":
                continue
            crossings.add((here, there))
            if side == "login" and (here, there) in LOGIN_IMPORTS_OF_THE_JOB:
                continue
            wrong.append(f"{here} ({side}) imports {there} ({other})")
    assert {"podium.launcher.job.node_entry", "podium.launcher.backends.slurm.environment"} <= sides["job"], sides
    assert {"podium.launcher.login.up", "podium.launcher.backends.slurm.scheduler"} <= sides["login"], sides
    assert {"podium.launcher.common.files", "podium.launcher.backends"} <= sides["common"], sides
    assert not wrong, "imports across the launcher's sides:\n" + "\n".join(wrong)
    unused = set(LOGIN_IMPORTS_OF_THE_JOB) - crossings
    assert not unused, f"allowed crossings that no longer happen (remove them): {unused}"


def test_no_package_docstring_keeps_a_module_index() -> None:
    """Package docstrings say what the package is; each module says what it owns. A hand-kept list
    of a package's modules drifts (four had), so none is kept: a docstring naming three or more of
    its package's own modules as ``name`` is one."""
    indexes = {}
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        children = {p.stem for p in init.parent.glob("*.py") if p.stem != "__init__"}
        children |= {p.name for p in init.parent.iterdir() if (p / "__init__.py").exists()}
        named = sorted(c for c in children if f"``{c}``" in doc)
        if len(named) >= 3:
            indexes[str(init.relative_to(PACKAGE.parent))] = named
    assert not indexes, f"module indexes in package docstrings (say what the package is instead): {indexes}"
