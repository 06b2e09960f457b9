"""One registry helper for what KOPE finds by name: agents, passes, targets and target keys.

Every entry, KOPE's own included, is an entry point in `pyproject.toml` (groups `kope.agents`,
`kope.passes`, `kope.targets`, `kope.target_keys`), so a third-party package adds an agent, a
pass or a target exactly as KOPE does. A program (or a test) may also `add` an entry at run
time, as `torch._dynamo.register_backend` does for backends. Entries are "module:attribute"
strings, loaded when first asked for, so listing names imports nothing. Entry points are read
once per process: a package installed while a process runs is seen by the next one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Names to objects of one kind, from the entry point group `group` and from `add`."""

    def __init__(self, group: str, kind: str):
        self.group = group
        self.kind = kind  # "agent", "pass", ...: what error messages call an entry
        self._added: dict[str, str | T] = {}

    def _entries(self) -> dict[str, str | T]:
        found: dict[str, str | T] = dict(_declared(self.group))
        found.update(self._added)
        return found

    def names(self) -> list[str]:
        return sorted(self._entries())

    def __contains__(self, name: str) -> bool:
        return name in self._entries()

    def add(self, name: str, entry: str | T) -> None:
        """Register `entry` ("module:attribute", or the object itself) as `name`; it takes
        precedence over an entry point of the same name."""
        self._added[name] = entry

    def remove(self, name: str) -> None:
        """Forget what `add` registered as `name` (entry points stay)."""
        self._added.pop(name, None)

    def load(self, name: str) -> T:
        """The object registered as `name`; `KeyError` names the known ones and the fix."""
        entries = self._entries()
        if name not in entries:
            known = ", ".join(sorted(entries)) or "none"
            hint = (
                ""
                if entries
                else " (no entry points found: install KOPE with `pip install -e .`, which "
                "declares KOPE's own; a stale kope.egg-info in the working directory can hide "
                "them: remove it)"
            )
            raise KeyError(f"unknown {self.kind} {name!r}; known {self.kind}s: {known}{hint}")
        entry = entries[name]
        if not isinstance(entry, str):
            return entry
        module, _, attribute = entry.partition(":")
        found: Any = import_module(module)
        for part in attribute.split("."):
            found = getattr(found, part)
        loaded: T = found
        return loaded


@functools.cache
def _declared(group: str) -> tuple[tuple[str, str], ...]:
    """The entry points of `group`, read once per process: scanning every installed
    distribution's metadata takes milliseconds, and names are asked for at every compile."""
    return tuple((ep.name, ep.value) for ep in entry_points(group=group))


# What KOPE finds by name. The entry point groups are the public seam.
AGENTS: Registry[type[Any]] = Registry("kope.agents", "agent")
PASSES: Registry[type[Any]] = Registry("kope.passes", "pass")
TARGETS: Registry[type[Any]] = Registry("kope.targets", "target")
# A target's key computed without loading the target (and torch): `kope-opt` and the passes
# need only the key. A target without one here is loaded and asked (`target_key`).
TARGET_KEYS: Registry[Callable[[], str]] = Registry("kope.target_keys", "target key")

# The target a user gets without naming one. `kope.core.options.Options.target` is the default
# users see (the CLI and `torch.compile` read it there); it is this name, kept here because the
# passes, which may not import the driver, default to it too.
DEFAULT_TARGET = "cpu"


def target_names() -> list[str]:
    return TARGETS.names()


def target_key(name: str) -> str:
    """The key of target `name`: everything about it that can change a kernel's result or
    speed (as `Target.key()`, cheaply when the target registers a key function)."""
    if name in TARGET_KEYS:
        return TARGET_KEYS.load(name)()
    target: Any = TARGETS.load(name)()
    key: str = target.key()
    return key
