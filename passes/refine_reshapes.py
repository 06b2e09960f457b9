"""`kope-refine-reshapes`: reshapes between ops written so that elementwise fusion lifts the
ops on both sides to one shape.

torch-mlir lowers group norm over (batch, groups, channels x positions) and reshapes its
result back to NCHW for the affine step and what follows (a SiLU, a residual): a
`collapse_shape` to (batch, channels x positions) then an `expand_shape` to (batch,
channels, height, width). The two regroup the same dims differently, so no upstream pattern
moves ops across them: the statistics stayed 3-D, the epilogue 4-D, and no row loop fused
the two (a fused group norm + SiLU read and wrote its input twice more than it needed and
ran at eager's speed).

This pass rewrites every such `expand_shape(collapse_shape(x))` of static shapes as
`collapse_shape(expand_shape(x))` through the two shapes' common refinement (batch, groups,
channels per group, height, width), and gives each reshape one use per user (upstream's
elementwise fusion expands an op through a reshape only where the reshape has one use). Run
before `linalg-fuse-elementwise-ops`, which then expands the ops on both sides to the
refined shape: every op of a group norm shares the (batch, group) loops, and one row loop
fuses them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir
from torch_mlir.dialects import tensor

from kope.passes.base import (
    COLLAPSE_SHAPE,
    EXPAND_SHAPE,
    ModulePass,
    consecutive_runs,
    defining_op,
    nested_ops,
    reassociation_attr,
)


@dataclass
class RefineReshapes(ModulePass):
    """Rewrite collapse-then-expand through the common refinement; one reshape per use."""

    name = "kope-refine-reshapes"
    summary = "Reshape chains through their shapes' common refinement, one reshape per use"

    def run(self, module: ir.Operation) -> None:
        for op in nested_ops(module):
            if op.name == EXPAND_SHAPE:
                _refine(op)
        for op in nested_ops(module):
            if op.name in (EXPAND_SHAPE, COLLAPSE_SHAPE):
                _one_per_use(op)


def common_refinement(a: list[int], b: list[int]) -> tuple[list[int], list[int], list[int]] | None:
    """The coarsest shape that both static shapes `a` and `b` (of one element count) are
    regroupings of, with the dim of `a` and of `b` each of its dims falls in; None where
    there is none (a dim of one straddles two of the other without dividing them) or a unit
    dim of one side meets a larger dim of the other (its group would be ambiguous)."""
    refined: list[int] = []
    in_a: list[int] = []
    in_b: list[int] = []
    i = j = 0
    left_a = a[0] if a else 0
    left_b = b[0] if b else 0
    while i < len(a) and j < len(b):
        if left_a == left_b:
            step = left_a
        elif left_a == 1 or left_b == 1:
            return None
        elif left_b % left_a == 0:
            step = left_a
        elif left_a % left_b == 0:
            step = left_b
        else:
            return None
        refined.append(step)
        in_a.append(i)
        in_b.append(j)
        left_a //= step
        left_b //= step
        if left_a == 1 or step == 1:
            i += 1
            left_a = a[i] if i < len(a) else 0
        if left_b == 1 or step == 1:
            j += 1
            left_b = b[j] if j < len(b) else 0
    if i != len(a) or j != len(b):
        return None
    return refined, in_a, in_b


def _refine(expand: ir.Operation) -> None:
    collapse = defining_op(expand.operands[0])
    if collapse is None or collapse.name != COLLAPSE_SHAPE:
        return
    source = ir.RankedTensorType(collapse.operands[0].type)
    result = ir.RankedTensorType(expand.results[0].type)
    if not (source.has_static_shape and result.has_static_shape):
        return
    refinement = common_refinement(list(source.shape), list(result.shape))
    if refinement is None:
        return
    refined, in_source, in_result = refinement
    if refined == list(result.shape):
        return  # a plain collapse, or the two undo each other: canonicalization folds them
    value = collapse.operands[0]
    with ir.InsertionPoint(expand), expand.location:
        if refined != list(source.shape):
            fine = ir.RankedTensorType.get(refined, source.element_type)
            grouping = reassociation_attr(consecutive_runs(in_source))
            value = tensor.ExpandShapeOp(fine, value, grouping, [], refined).result
        grouping = reassociation_attr(consecutive_runs(in_result))
        value = tensor.CollapseShapeOp(result, value, grouping).result
    expand.results[0].replace_all_uses_with(value)
    expand.erase()
    if not list(collapse.results[0].uses):
        collapse.erase()


def _one_per_use(reshape: ir.Operation) -> None:
    """A clone of `reshape` for each of its users after the first."""
    for use in list(reshape.results[0].uses)[1:]:
        with ir.InsertionPoint(reshape):
            clone = reshape.clone()
        use.owner.operands[use.operand_number] = clone.results[0]
