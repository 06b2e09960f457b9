"""Targets by name. `cpu` ships with KOPE; others register under the `kope.targets` entry point."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kope.targets.base import Target

_BUILTIN = {"cpu": "kope.targets.cpu:CpuTarget"}
# Target keys that can be computed without loading the target (and torch): for kope-opt.
_LIGHT_KEYS: dict[str, str] = {"cpu": "kope.targets.host:cpu_target_key"}


def _registry() -> dict[str, str]:
    found = dict(_BUILTIN)
    for ep in entry_points(group="kope.targets"):
        found.setdefault(ep.name, ep.value)
    return found


def target_names() -> list[str]:
    return sorted(_registry())


def target_key(name: str) -> str:
    """The key of target `name` (as `get_target(name).key()`, cheaply when possible)."""
    if name in _LIGHT_KEYS:
        module, _, attr = _LIGHT_KEYS[name].partition(":")
        key: Callable[[], str] = getattr(import_module(module), attr)
        return key()
    return get_target(name).key()


def target_class(name: str) -> type[Target]:
    registry = _registry()
    if name not in registry:
        raise KeyError(f"unknown target {name!r}; known targets: {', '.join(sorted(registry))}")
    module, _, attr = registry[name].partition(":")
    cls: type[Target] = getattr(import_module(module), attr)
    return cls


def get_target(name: str, **config: Any) -> Target:
    """Instantiate the target registered as `name` with `config`."""
    return target_class(name)(**config)


__all__ = ["get_target", "target_class", "target_key", "target_names"]
