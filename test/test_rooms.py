"""Data flows one way between the rooms: no import runs back up, and no import goes round.

The lower rooms: memory knows nothing of targets, passes or the driver; passes may read memory;
targets never import memory or the driver; passes take target names and keys from the
vocabulary, never from `targets/`; the vocabulary imports no room.

The driver (`kope`) is rooms by job, in the order of the flow: the core (a Task, its reference
lowering, the options, errors and logs) imports none of the others; the spaces (what kernels can
be written for an operator, per target family) may import the core; the agents (which propose
kernels: a space searched) the spaces and the core; the tuner (the loop, measuring, selection)
the agents, the spaces and the core; the front end (from a dynamo graph to the compiled graph)
the tuner, the agents, the spaces and the core; the tools (the command line and what it drives)
every room. Each driver room may import the lower rooms. `kope` itself (its `__init__`, the
public face, and the `kope.suite` alias) may import any room.

Imports inside functions and under `TYPE_CHECKING` count too: a lazy import is still an arrow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Import package -> its folder (pyproject.toml's package-dir).
FOLDERS = {
    "kope": "kope_compiler",
    "kope.passes": "passes",
    "kope.memory": "memory",
    "kope.targets": "targets",
    "kope.vocabulary": "vocabulary",
}
LOWER = {"vocabulary", "memory", "passes", "targets"}
DRIVER = {"core", "spaces", "agents", "tuner", "frontend", "tools", "testing"}
# What each room may import of KOPE, by room name ("kope" is the package's own face).
ALLOWED = {
    "vocabulary": {"vocabulary"},
    "memory": {"memory", "vocabulary"},
    "passes": {"passes", "memory", "vocabulary"},
    "targets": {"targets", "passes", "vocabulary"},
    "core": {"core"} | LOWER,
    "spaces": {"spaces", "core"} | LOWER,
    "agents": {"agents", "spaces", "core"} | LOWER,
    "tuner": {"tuner", "agents", "spaces", "core"} | LOWER,
    "frontend": {"frontend", "tuner", "agents", "spaces", "core"} | LOWER,
    "tools": {"kope", "tools", "frontend", "tuner", "agents", "spaces", "core", "testing"} | LOWER,
    "testing": {"testing", "core"} | LOWER,
}


def room_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "kope":
        return None
    if len(parts) > 1 and parts[1] in LOWER | DRIVER:
        return parts[1]
    return "kope"


def kope_modules() -> dict[str, Path]:
    """Every module of KOPE by its import name."""
    found: dict[str, Path] = {}
    for package, folder in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join((package, *parts))
            if package == "kope" and room_of(name) in LOWER:
                continue  # not under kope_compiler/, whatever a stray folder says
            found[name] = path
    return found


MODULES = kope_modules()


def _module(name: str) -> str:
    """The module `name` names: itself, or the module that defines it."""
    while name not in MODULES and "." in name:
        name = name.rpartition(".")[0]
    return name


def kope_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of each import of a KOPE module in `path`, at any depth: `from a import b`
    imports the module `a.b` where there is one, else `a`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                inner = f"{node.module}.{alias.name}"
                found.append((node.lineno, inner if inner in MODULES else node.module))
    return [(line, _module(name)) for line, name in found if name.split(".")[0] == "kope"]


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_no_import_runs_back_up(room: str) -> None:
    paths = sorted(path for name, path in MODULES.items() if room_of(name) == room)
    assert paths, f"room {room} has no modules: is its folder gone?"
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in paths
        for line, name in kope_imports(path)
        if room_of(name) not in ALLOWED[room]
    ]
    assert not wrong, "\n".join(wrong)


def import_circles() -> list[list[str]]:
    """Each set of modules that import one another round (a strongly connected component of
    the import graph with more than one module, or a module that imports itself)."""
    arrows = {
        name: sorted({m for _, m in kope_imports(path) if m in MODULES})
        for name, path in MODULES.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []
    for start in sorted(arrows):
        if start in index:
            continue
        # Tarjan's algorithm, iteratively: (module, its next arrow to follow).
        work = [(start, 0)]
        while work:
            module, next_arrow = work.pop()
            if next_arrow == 0:
                index[module] = low[module] = len(index)
                stack.append(module)
            if next_arrow < len(arrows[module]):
                work.append((module, next_arrow + 1))
                other = arrows[module][next_arrow]
                if other not in index:
                    work.append((other, 0))
                elif other in stack:
                    low[module] = min(low[module], index[other])
                continue
            if low[module] == index[module]:
                component = stack[stack.index(module) :]
                del stack[stack.index(module) :]
                if len(component) > 1 or module in arrows[module]:
                    circles.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
    return circles


def test_no_import_goes_round() -> None:
    """No two modules of KOPE import each other, at any distance: a circle is one room split in
    two files, or an arrow that runs back up."""
    assert not import_circles(), "\n".join(" <-> ".join(c) for c in import_circles())


def test_the_circle_check_sees_a_circle(tmp_path: Path) -> None:
    """The check itself finds a circle through a lazy import."""
    global MODULES
    (tmp_path / "a.py").write_text("from kope.b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    import kope.a\n")
    saved = MODULES
    MODULES = {"kope.a": tmp_path / "a.py", "kope.b": tmp_path / "b.py"}
    try:
        assert import_circles() == [["kope.a", "kope.b"]]
    finally:
        MODULES = saved


def test_the_store_never_applies_the_rule() -> None:
    """The store records and answers queries; which kernel runs is `kope.memory.standing`'s
    rule, over the attempts the store returns (the database never decides what runs)."""
    imported = {name for _, name in kope_imports(MODULES["kope.memory.store"])}
    assert "kope.memory.standing" not in imported
