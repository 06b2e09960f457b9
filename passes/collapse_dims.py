"""`kope-collapse-dims`: each linalg.generic over as few loops as its indexing allows.

Adjacent loops that every operand indexes the same way (both or neither, the second right
after the first, both parallel or both reduced) are one loop in all but name: a SiLU over
8x64x7x7 is a SiLU over 25088 elements, and a batch norm's scale and shift (indexed by the
channel alone) leave height and width one loop of 49. A rows schedule vectorizes along an
op's last loop, so a 7-wide row took vectors of 7 floats, and a group norm's statistics and
epilogue refined to rows of 28 (`kope-refine-reshapes`) took vectors of 28, where the
collapsed rows are 196 or 784 floats: whole vectors on every ISA.

Only the innermost such loops collapse: the loops outside them are the row loops a rows
schedule shares between ops (a group norm's statistics and its epilogue both walk (batch,
group)), and collapsing them in one op and not in the next (the statistics index batch and
group alike, the epilogue's weight does not) would leave the two no loop to share. For the
same reason a producer and its consumer must collapse the value between them alike, or
neither does (`_agree`).

Each such op is rewritten over the collapsed loops, its operands collapsed (`collapse_shape`
of a contiguous tensor: a view) and its results expanded back. Run after elementwise fusion
(which would expand the ops again) and before a canonicalization, which folds the collapse of
an expand with the same grouping where one collapsed op feeds another. An op whose body reads
its loop indices (`linalg.index`), or whose maps or shapes are not static projections, is
left as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch_mlir import ir
from torch_mlir.dialects import tensor

from kope.passes.base import (
    ModulePass,
    consecutive_runs,
    defining_op,
    nested_ops,
    reassociation_attr,
)

GENERIC = "linalg.generic"


@dataclass
class CollapseDims(ModulePass):
    """Collapse the innermost loops each linalg.generic indexes alike into one."""

    name = "kope-collapse-dims"
    summary = "Collapse the innermost loops every operand of a linalg.generic indexes alike"

    def run(self, module: ir.Operation) -> None:
        generics = [_Generic.of(op) for op in nested_ops(module) if op.name == GENERIC]
        candidates = {g.op: g for g in generics if g is not None}
        _agree(candidates)
        for generic in candidates.values():
            if generic.first < generic.count - 1:
                _collapse(generic)


@dataclass
class _Generic:
    """A linalg.generic the pass may collapse, and where its collapsed run begins (`first`:
    the loops from there on become one; `count - 1`: none collapse)."""

    op: ir.Operation
    maps: list[list[int]]  # each operand's dims as loop positions
    iterators: list[str]
    first: int

    @classmethod
    def of(cls, op: ir.Operation) -> _Generic | None:
        types = [v.type for v in op.operands]
        if not all(isinstance(t, ir.RankedTensorType) and t.has_static_shape for t in types):
            return None
        found_maps = [_map_dims(attr) for attr in ir.ArrayAttr(op.attributes["indexing_maps"])]
        maps = [m for m in found_maps if m is not None]
        iterators = [str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
        if len(maps) < len(found_maps) or not iterators or _reads_indices(op):
            return None
        kinds = ["reduction" if "reduction" in kind else "parallel" for kind in iterators]
        found = cls(op, maps, iterators, len(kinds) - 1)
        while found.first > 0 and _adjacent(found.first - 1, found.first, found.maps, kinds):
            found.first -= 1
        return found

    @property
    def count(self) -> int:
        return len(self.iterators)

    def loop(self, dim: int) -> int:
        """The collapsed loop that loop `dim` falls in: itself, or the run from `first` on."""
        return min(dim, self.first)

    def runs(self, operand: int) -> list[list[int]]:
        """How operand number `operand` (inputs, then inits) collapses."""
        return consecutive_runs([self.loop(d) for d in self.maps[operand]])

    def init(self, result: int) -> int:
        """The operand number of result number `result`'s init."""
        return len(self.maps) - len(self.op.results) + result

    def collapses(self, operand: int) -> bool:
        return len(self.runs(operand)) != len(self.maps[operand])

    def narrow(self) -> bool:
        """Take the outermost loop out of the run; whether there was one to take."""
        if self.first >= self.count - 1:
            return False
        self.first += 1
        return True


def _agree(generics: dict[ir.Operation, _Generic]) -> None:
    """Narrow the runs until every value passed between two linalg ops is collapsed alike on
    both sides: a reshape between a producer and its consumer leaves a rows schedule no slice
    of the producer to fuse (an f64 copy of a group norm's input, collapsed whole where the
    statistics it feeds kept their rows, would be computed whole as a temporary). A value
    that a linalg op other than these reads or writes (a fill's result only initializes)
    is not collapsed at all."""
    changed = True
    while changed:
        changed = False
        for consumer in generics.values():
            for index, value in enumerate(consumer.op.operands):
                producer_op = defining_op(value)
                if producer_op is None or not producer_op.name.startswith("linalg."):
                    continue
                producer = generics.get(producer_op)
                wanted = consumer.runs(index)
                if producer is None:
                    if producer_op.name != "linalg.fill" and consumer.collapses(index):
                        changed |= consumer.narrow()
                    continue
                given = producer.runs(producer.init(ir.OpResult(value).result_number))
                if given != wanted:
                    # The one collapsing more of this value gives way first.
                    if len(given) <= len(wanted):
                        changed |= producer.narrow()
                    if len(wanted) <= len(given):
                        changed |= consumer.narrow()
        for generic in generics.values():  # a value read by a linalg op of another kind
            for result in generic.op.results:
                readers = [_operation(use.owner) for use in result.uses]
                foreign = any(r.name.startswith("linalg.") and r not in generics for r in readers)
                if foreign and generic.collapses(generic.init(result.result_number)):
                    changed |= generic.narrow()


def _adjacent(a: int, b: int, maps: list[list[int]], iterators: list[str]) -> bool:
    if iterators[a] != iterators[b]:
        return False
    for dims in maps:
        if (a in dims) != (b in dims):
            return False
        if a in dims and dims.index(b) != dims.index(a) + 1:
            return False
    return True


def _map_dims(attr: ir.Attribute) -> list[int] | None:
    """A projected permutation's result dims as loop positions; None for any other map."""
    affine = ir.AffineMapAttr(attr).value
    if not affine.is_projected_permutation:
        return None
    return [ir.AffineDimExpr(expr).position for expr in affine.results]


def _collapsed_type(shaped: ir.RankedTensorType, runs: list[list[int]]) -> ir.RankedTensorType:
    shape = list(shaped.shape)
    sizes = [math.prod(shape[k] for k in run) for run in runs]
    return ir.RankedTensorType.get(sizes, shaped.element_type)


def _reads_indices(op: ir.Operation) -> bool:
    return any(inner.name == "linalg.index" for inner in nested_ops(op))


def _operation(owner: ir.Operation | ir.OpView) -> ir.Operation:
    return owner.operation if isinstance(owner, ir.OpView) else owner


def _collapse(generic: _Generic) -> None:
    """Rewrite `generic` over its collapsed loops: operands collapsed, results expanded."""
    op, loops = generic.op, generic.first + 1
    with ir.InsertionPoint(op), op.location:
        for index, value in enumerate(list(op.operands)):
            if not generic.collapses(index):
                continue
            runs = generic.runs(index)
            fine = _collapsed_type(ir.RankedTensorType(value.type), runs)
            producer = defining_op(value)
            if producer is not None and producer.name == "tensor.empty":
                collapsed = tensor.EmptyOp(list(fine.shape), fine.element_type).result
            else:
                collapsed = tensor.CollapseShapeOp(fine, value, reassociation_attr(runs)).result
            op.operands[index] = collapsed
        new_maps = []
        for operand, dims in enumerate(generic.maps):
            kept = [generic.loop(dims[run[0]]) for run in generic.runs(operand)]
            results = [ir.AffineExpr.get_dim(loop) for loop in kept]
            new_maps.append(ir.AffineMapAttr.get(ir.AffineMap.get(loops, 0, results)))
        op.attributes["indexing_maps"] = ir.ArrayAttr.get(new_maps)
        op.attributes["iterator_types"] = ir.ArrayAttr.get(
            [ir.Attribute.parse(kind) for kind in generic.iterators[:loops]]
        )
    for number, result in enumerate(op.results):
        init = generic.init(number)
        if not generic.collapses(init):
            continue
        original = ir.RankedTensorType(result.type)
        uses = [(use.owner, use.operand_number) for use in result.uses]
        result.set_type(_collapsed_type(original, generic.runs(init)))
        with ir.InsertionPoint.after(op), op.location:
            expanded = tensor.ExpandShapeOp(
                original, result, reassociation_attr(generic.runs(init)), [], list(original.shape)
            ).result
        for user, operand in uses:
            user.operands[operand] = expanded
