"""Data flows one way between the rooms: no import runs back up.

The driver (`kope`) may import every room; passes may read memory; memory knows nothing of
targets, passes or the driver; targets never import memory or the driver; passes take target
names and keys from the vocabulary, never from `targets/`; the vocabulary imports no room.
Imports inside functions count too: a lazy import is still an arrow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOMS = {"passes": "passes", "memory": "memory", "targets": "targets", "vocabulary": "vocabulary"}
# What each room may import of KOPE, by room name ("driver" is `kope` itself).
ALLOWED = {
    "vocabulary": {"vocabulary"},
    "memory": {"memory", "vocabulary"},
    "passes": {"passes", "memory", "vocabulary"},
    "targets": {"targets", "passes", "vocabulary"},
}


def room_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "kope":
        return None
    if len(parts) > 1 and parts[1] in ROOMS:
        return parts[1]
    return "driver"


def kope_imports(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name.split(".")[0] == "kope"]


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_no_import_runs_back_up(room: str) -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sorted((ROOT / ROOMS[room]).rglob("*.py"))
        for line, name in kope_imports(path)
        if room_of(name) not in ALLOWED[room]
    ]
    assert not wrong, "\n".join(wrong)
