"""Targets by name, from the `kope.targets` entry point group (`cpu` is KOPE's own; the
registry is `kope.vocabulary.registry.TARGETS`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kope.vocabulary.registry import TARGETS, target_key, target_names

if TYPE_CHECKING:
    from kope.targets.base import Target


def target_class(name: str) -> type[Target]:
    cls: type[Target] = TARGETS.load(name)
    return cls


def get_target(name: str, **config: Any) -> Target:
    """Instantiate the target registered as `name` with `config`."""
    return target_class(name)(**config)


__all__ = ["get_target", "target_class", "target_key", "target_names"]
