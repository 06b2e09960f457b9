"""KOPE's MLIR passes, by name: entry points of the `kope.passes` group, KOPE's own and third
parties' alike (`kope.vocabulary.registry.PASSES`)."""

from __future__ import annotations

from kope.passes.base import ModulePass, PassError, PipelinePass
from kope.vocabulary.registry import PASSES


def pass_names() -> list[str]:
    return PASSES.names()


def pass_class(name: str) -> type[ModulePass]:
    """The pass class registered as `name`; `KeyError` lists the known ones."""
    cls: type[ModulePass] = PASSES.load(name)
    return cls


__all__ = ["ModulePass", "PassError", "PipelinePass", "pass_class", "pass_names"]
