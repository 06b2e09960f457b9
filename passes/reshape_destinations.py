"""`kope-reshape-destinations`: compute a result returned through reshapes in its destination.

torch-mlir lowers an op over other dims than its result's through reshapes: group norm
computes over (groups, channels x positions) and expands that back to NCHW before it returns;
a 4-D op over its leading dims collapsed returns them expanded. Empty-tensor elimination puts
a result in the caller's buffer only where the op's destination traces back to an empty tensor
of the returned type; through a reshape it does not, so the result was computed in a buffer of
its own and then copied out (a group norm's kernel spent most of its time in that copy).

Here each value written to a destination (`bufferization.materialize_in_destination`, as
`kope-destination-abi` writes results) that is a chain of reshapes of an op's result, where
the op's destination (through loops and linalg ops writing it in place) starts from one empty
tensor that nothing else reads, has that empty tensor replaced by the destination buffer
reshaped back by the inverse chain: reshapes of a contiguous buffer are views, so the op
writes the caller's buffer and the final write is a copy onto itself, which folds away.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir
from torch_mlir.dialects import bufferization, tensor

from kope.passes.base import (
    COLLAPSE_SHAPE,
    EXPAND_SHAPE,
    ModulePass,
    defining_op,
    nested_ops,
)


@dataclass
class ReshapeDestinations(ModulePass):
    """Compute a result materialized through reshapes in its destination buffer."""

    name = "kope-reshape-destinations"
    summary = "Compute results written out through expand/collapse_shape in their destinations"

    def run(self, module: ir.Operation) -> None:
        for op in nested_ops(module):
            if op.name == "bufferization.materialize_in_destination":
                _reshape_destination(op)


def _only_use(value: ir.Value) -> bool:
    return len(list(value.uses)) == 1


def _reshape_destination(materialize: ir.Operation) -> None:
    value, destination = materialize.operands[0], materialize.operands[1]
    if not isinstance(destination.type, ir.MemRefType):
        return
    reshapes: list[ir.Operation] = []  # from the written value inwards
    op = defining_op(value)
    while op is not None and op.name in (EXPAND_SHAPE, COLLAPSE_SHAPE) and _only_use(op.results[0]):
        reshapes.append(op)
        value = op.operands[0]
        op = defining_op(value)
    if not reshapes:
        return  # empty-tensor elimination's own case
    empty = _empty_destination(value)
    if empty is None:
        return
    written = ir.RankedTensorType(reshapes[0].results[0].type)
    with ir.InsertionPoint(empty), empty.location:
        buffer = bufferization.ToTensorOp(written, destination, restrict=True, writable=True)
        current = buffer.result
        for reshape in reshapes:  # each undone, outermost first
            source = ir.RankedTensorType(reshape.operands[0].type)
            reassociation = reshape.attributes["reassociation"]
            if reshape.name == EXPAND_SHAPE:
                current = tensor.CollapseShapeOp(source, current, reassociation).result
            else:
                current = tensor.ExpandShapeOp(
                    source, current, reassociation, [], list(source.shape)
                ).result
    empty.results[0].replace_all_uses_with(current)
    empty.erase()


def _tied_init(op: ir.Operation, result: ir.OpResult) -> int | None:
    """Which operand `result` is written into: a linalg op's init, a loop's initial value."""
    n = result.result_number
    if op.name.startswith("linalg.") or op.name == "scf.forall":
        return len(op.operands) - len(op.results) + n
    if op.name == "scf.for":
        return 3 + n  # after lower bound, upper bound and step
    return None


def _empty_destination(value: ir.Value) -> ir.Operation | None:
    """The static `tensor.empty` that `value`'s destination starts from, through ops writing
    it in place, each value on the way read by its next op alone; None where there is none.

    An empty tensor that other ops start from too (CSE merges every `tensor.empty` of one
    type: a layer norm's centred values and its result) is cloned for this destination's op,
    since an empty tensor's contents are undefined anyway: left shared, a layer norm over
    1x28x28x96 computed its result in a buffer of its own and copied it out (35 us, against
    12 for the same over 784x96)."""
    reader: tuple[ir.Operation, int] | None = None  # the op reading `value` on the way
    while True:
        op = defining_op(value)
        if op is None:
            return None
        if op.name == "tensor.empty":
            shaped = ir.RankedTensorType(value.type)
            if not shaped.has_static_shape or op.operands:
                return None
            if _only_use(value):
                return op
            if reader is None:
                return None
            user, index = reader
            with ir.InsertionPoint(user), op.location:
                fresh = tensor.EmptyOp(list(shaped.shape), shaped.element_type)
            user.operands[index] = fresh.result
            return fresh.operation
        if not _only_use(value):
            return None
        tied = _tied_init(op, ir.OpResult(value))
        if tied is None:
            return None
        reader = (op, tied)
        value = op.operands[tied]
