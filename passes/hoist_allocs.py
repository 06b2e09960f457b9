"""`kope-hoist-allocs`: move fixed-size buffers out of sequential loops.

A schedule that fuses producers into a loop over rows leaves one temporary buffer per
intermediate per iteration: a `malloc` and a `free` per row. A buffer of static shape that
is allocated and freed within one iteration of an `scf.for` is moved out: allocated before
the loop and freed after it, so each kernel call allocates it once. Parallel loops
(`scf.forall`, `scf.parallel`) are never crossed, since their iterations need buffers of
their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir

from kope.passes.base import ModulePass, nested_ops


def _hoistable(alloc: ir.Operation, body: ir.Block) -> ir.Operation | None:
    """The dealloc of `alloc` if the pair can leave the loop, else None."""
    if alloc.operands:  # dynamic sizes may depend on the iteration
        return None
    result = alloc.results[0]
    users = [use.owner.operation for use in result.uses]
    deallocs = [user for user in users if user.name == "memref.dealloc"]
    if len(deallocs) != 1 or deallocs[0].block != body:
        return None
    return deallocs[0]


@dataclass
class HoistAllocs(ModulePass):
    """Allocate static-shape temporaries once per call, not once per loop iteration."""

    name = "kope-hoist-allocs"
    summary = "Move static-shape memref.alloc/dealloc pairs out of scf.for loops"

    def run(self, module: ir.Operation) -> None:
        # Post-order: inner loops first, so that buffers bubble up.
        for loop in [op for op in nested_ops(module) if op.name == "scf.for"]:
            body = loop.regions[0].blocks[0]
            for op in list(body.operations):
                op = op.operation
                if op.name != "memref.alloc":
                    continue
                dealloc = _hoistable(op, body)
                if dealloc is None:
                    continue
                op.move_before(loop)
                dealloc.move_after(loop)
