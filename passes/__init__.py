"""KOPE's MLIR passes, by name. Third parties add passes under the `kope.passes` entry point."""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import entry_points

from kope.passes.base import ModulePass, PassError, PipelinePass

_BUILTIN = {
    "kope-approximate-math": "kope.passes.approximate_math:ApproximateMath",
    "kope-annotate-experience": "kope.passes.experience:AnnotateExperience",
    "kope-apply-kernels": "kope.passes.apply_kernels:ApplyKernels",
    "kope-apply-schedule": "kope.passes.schedule:ApplySchedule",
    "kope-bool-vector-memory": "kope.passes.bool_memory:BoolVectorMemory",
    "kope-destination-abi": "kope.passes.abi:DestinationAbi",
    "kope-expand-powers": "kope.passes.integer_powers:ExpandPowers",
    "kope-hoist-allocs": "kope.passes.hoist_allocs:HoistAllocs",
    "kope-lower-cpu": "kope.passes.lower_cpu:LowerCpu",
    "kope-memref-copy-to-linalg": "kope.passes.memref_copy:MemrefCopyToLinalg",
    "kope-outline-operators": "kope.passes.outline:OutlineOperators",
}


def _registry() -> dict[str, str]:
    found = dict(_BUILTIN)
    for ep in entry_points(group="kope.passes"):
        found.setdefault(ep.name, ep.value)
    return found


def pass_names() -> list[str]:
    return sorted(_registry())


def pass_class(name: str) -> type[ModulePass]:
    """The pass class registered as `name`; `KeyError` lists the known ones."""
    registry = _registry()
    if name not in registry:
        raise KeyError(name)
    module, _, attr = registry[name].partition(":")
    cls: type[ModulePass] = getattr(import_module(module), attr)
    return cls


__all__ = ["ModulePass", "PassError", "PipelinePass", "pass_class", "pass_names"]
