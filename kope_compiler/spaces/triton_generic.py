"""A `linalg.generic` evaluated at coordinates: its loops bound, and its reductions.

The op's output map binds its loops to the coordinates asked for; a parallel op is its body
evaluated once there (`Body`), unless the family gives the op's value itself (a matmul's
accumulator: `Frame.contraction`). A reduction either lies along a block of the family
(`Frame.reduction`: one `tl.sum`/`tl.max`/`tl.argmax`) or, when the family loops
(`Frame.looped`), runs the op's body itself over the reduced loops with its accumulators
carried in variables: any body, in the sequential order linalg defines.
"""

from __future__ import annotations

import math
from dataclasses import replace

from torch_mlir import ir

from kope.spaces.triton_index import ZERO, Index, delinearize, linearize
from kope.spaces.triton_ir import (
    Unsupported,
    dim_positions,
    element_type,
    iterators,
    maps,
    owner,
    ranges,
)
from kope.spaces.triton_ops import BINARY, FLOATS, Body, literal
from kope.spaces.triton_scope import Looped, Scalar, Scope

UNROLL = 64  # most iterations of a looped reduction's static (unrolled) inner loops
# Reductions by their combining op: the tl reduction, its identity, and how to fold an init.
COMBINERS: dict[str, tuple[str, float, str]] = {
    "arith.addf": ("tl.sum", 0.0, "({0} + {1})"),
    "arith.addi": ("tl.sum", 0, "({0} + {1})"),
    "arith.maximumf": ("tl.max", -math.inf, BINARY["arith.maximumf"]),
    "arith.maxnumf": ("tl.max", -math.inf, "tl.maximum({0}, {1})"),
    "arith.minimumf": ("tl.min", math.inf, BINARY["arith.minimumf"]),
    "arith.minnumf": ("tl.min", math.inf, "tl.minimum({0}, {1})"),
    "arith.maxsi": ("tl.max", -math.inf, "tl.maximum({0}, {1})"),
    "arith.minsi": ("tl.min", math.inf, "tl.minimum({0}, {1})"),
}
# Combiners whose result is NaN when a term is, which tl.max and tl.min (maxnum) are not.
NAN_PROPAGATING = {"arith.maximumf", "arith.minimumf"}


def generic(low: Scope, op: ir.Operation, result: int, idx: tuple[Index, ...]) -> Scalar:
    """Result `result` of the `linalg.generic` `op` at `idx`, computed in the scope `low`."""
    special = low.frame.contraction(op, idx)
    if special is not None:
        return special
    kinds = iterators(op)
    loops: list[Index | None] = [None] * len(kinds)
    inputs = len(op.operands) - len(op.results)
    for position, index in zip(dim_positions(maps(op)[inputs + result]), idx, strict=True):
        if position is not None:
            loops[position] = index
    reduced = [d for d, kind in enumerate(kinds) if kind == "reduction"]
    if any(loops[d] is None for d, kind in enumerate(kinds) if kind == "parallel"):
        raise Unsupported("a parallel loop that the op's result does not address")
    body = op.regions[0].blocks[0]
    yielded = list(body.operations)[-1].operands[result]
    if not reduced:
        return Body(low, op, [i or ZERO for i in loops]).scalar(yielded)
    looped = low.frame.looped([ranges(op)[d] for d in reduced])
    if looped is not None:
        loop_reduce(low, op, loops, reduced, idx, looped)
        return low.memo[(op.results[result], idx, False)]
    return reduce(low, op, result, loops, reduced, yielded, idx)


def loop_reduce(
    low: Scope,
    op: ir.Operation,
    loops: list[Index | None],
    reduced: list[int],
    idx: tuple[Index, ...],
    looped: Looped,
) -> None:
    """Every result of the reduction `op` at `idx`, by running its body over the reduced
    loops (outermost first, unit ones skipped) with the accumulators carried in variables;
    inner loops whose iterations multiply to at most UNROLL are static (unrolled)."""
    inputs = len(op.operands) - len(op.results)
    body = op.regions[0].blocks[0]
    extents = ranges(op)
    accumulators: list[Scalar] = []
    for k, result in enumerate(op.results):
        kind = element_type(result)
        init = low.element(op.operands[inputs + k], idx)
        name = low.fresh("acc")
        low.lines.append(f"{name} = {low.block(init, kind, looped)}")
        accumulators.append(Scalar(name, kind, looped.axes | init.axes))
    static: dict[int, bool] = {}
    unrolled = 1
    for d in reversed([d for d in reduced if extents[d] != 1]):
        static[d] = unrolled * extents[d] <= UNROLL and all(static.values())
        unrolled *= extents[d] if static[d] else 1
    headers: list[str] = []
    scopes: list[Scope] = []
    scope = low
    for d in reduced:
        if extents[d] == 1:
            loops[d] = ZERO
            continue
        var = low.fresh("r")
        low.loop_vars.add(var)
        loops[d] = Index(var, frozenset({var}))
        loop = "tl.static_range" if static[d] else "range"
        headers.append(f"for {var} in {loop}({extents[d]}):")
        scope = scope.child(frozenset({var}))
        scopes.append(scope)
    # In the loop an accumulator varies along its variables: nothing that reads it leaves.
    carried = frozenset().union(*(s.loop_axes for s in scopes))
    bound = {
        argument: replace(accumulator, axes=accumulator.axes | carried)
        for argument, accumulator in zip(list(body.arguments)[inputs:], accumulators, strict=True)
    }
    step = Body(scope, op, [i or ZERO for i in loops], bound)
    values = [step.scalar(v) for v in list(body.operations)[-1].operands]
    names = {a.code for a in accumulators}
    updates = []
    for accumulator, value in zip(accumulators, values, strict=True):
        code = scope.block(value, accumulator.type, looped)
        if code in names and code != accumulator.code:  # all read before any is written
            code = scope.emit(code, value.type, value.axes).code
        updates.append(f"{accumulator.code} = {code}")
    nested = [*scope.lines, *updates]
    for k in reversed(range(len(headers))):
        nested = [headers[k], *("    " + line for line in nested)]
        if k:
            nested = [*scopes[k - 1].lines, *nested]
    if headers:
        low.lines += nested
    else:
        low.lines += updates
    for result, accumulator in zip(op.results, accumulators, strict=True):
        low.memo[(result, idx, False)] = accumulator


def reduce(
    low: Scope,
    op: ir.Operation,
    result: int,
    loops: list[Index | None],
    reduced: list[int],
    yielded: ir.Value,
    idx: tuple[Index, ...],
) -> Scalar:
    """Result `result` of the reduction `op` at `idx`, reduced along the family's block by the
    tl reduction of the op that combines `yielded`."""
    combine = owner(yielded)
    body = op.regions[0].blocks[0]
    inputs = len(op.operands) - len(op.results)
    accumulator = body.arguments[inputs + result]
    if combine is not None and combine.name == "arith.select":
        return arg_reduce(low, op, result, loops, reduced, combine, idx)
    if combine is None or combine.name not in COMBINERS:
        raise Unsupported(f"a reduction combined by {combine.name if combine else 'nothing'}")
    operands = list(combine.operands)
    if accumulator not in operands:
        raise Unsupported("a reduction that does not accumulate into its result")
    term = operands[1 - operands.index(accumulator)]
    outs = list(body.arguments)[inputs:]
    if _depends(term, outs):
        raise Unsupported("a reduction whose term reads an accumulator (an argmax?)")
    bound, mask = along_block(low, op, loops, reduced)
    value = Body(low, op, bound).scalar(term)
    reduction, identity, fold = COMBINERS[combine.name]
    kind = element_type(op.results[result])
    neutral = literal(float(identity) if kind in FLOATS else _integer(identity, kind), kind)
    masked = f"tl.where({mask}, {value.code}, {neutral.code})"
    if combine.name in NAN_PROPAGATING:
        lanes = low.emit(masked, kind, value.axes).code
        found = low.emit(f"{reduction}({lanes}, axis=0)", kind, frozenset())
        nan = f"tl.max(tl.where({lanes} != {lanes}, 1, 0), axis=0) > 0"
        code = f'tl.where({nan}, float("nan"), {found.code})'
        reduced_value = low.emit(code, kind, frozenset())
    else:
        reduced_value = low.emit(f"{reduction}({masked}, axis=0)", kind, frozenset())
    init = low.element(op.operands[inputs + result], idx)
    if init.literal and init.value == neutral.value:
        return reduced_value
    code = fold.format(low.tensor_of(init), reduced_value.code)
    return low.emit(code, kind, init.axes)


def _integer(identity: float, kind: str) -> int:
    """`identity` as an integer of MLIR type `kind` (`i64`): ±inf as its extreme values."""
    if math.isfinite(identity):
        return int(identity)
    bits = int(kind.removeprefix("i"))
    return 2 ** (bits - 1) - 1 if identity > 0 else -(2 ** (bits - 1))


def along_block(
    low: Scope, op: ir.Operation, loops: list[Index | None], reduced: list[int]
) -> tuple[list[Index], str]:
    """The loops with the reduced ones along the family's block, and the lanes' mask."""
    block, mask = low.frame.reduction([ranges(op)[d] for d in reduced])
    axes = frozenset().union(*(i.axes for i in block))
    if any(index is not None and index.axes & axes for index in loops):
        raise Unsupported("a reduction whose rows lie along the block")
    bound = [i or ZERO for i in loops]
    for d, index in zip(reduced, block, strict=True):
        bound[d] = index
    return bound, mask


def arg_reduce(
    low: Scope,
    op: ir.Operation,
    result: int,
    loops: list[Index | None],
    reduced: list[int],
    select: ir.Operation,
    idx: tuple[Index, ...],
) -> Scalar:
    """The index result of an argmax or argmin body along the block: `select(term > best,
    new, index)`, where another result keeps `best`, the running max (min) of the term.
    The strict comparison keeps the first position of the extreme, as tl.argmax's left
    tie break does; an extreme that does not beat the initial best keeps the initial
    index. NaN terms are ordered as the sequential body orders them."""
    body = op.regions[0].blocks[0]
    inputs = len(op.operands) - len(op.results)
    outs = list(body.arguments)[inputs:]
    refused = Unsupported("a reduction combined by arith.select other than an arg-max/min")
    cond, new, old = select.operands
    compare = owner(cond)
    if old != outs[result] or compare is None or compare.name != "arith.cmpf":
        raise refused
    predicate = ir.IntegerAttr(compare.attributes["predicate"]).value
    a, b = compare.operands
    if predicate not in (2, 4) or (a in outs) == (b in outs):  # ogt, olt
        raise refused
    term, best = (a, b) if b in outs else (b, a)
    larger = (predicate == 2) == (best == b)  # term > best: an argmax
    j = outs.index(best)
    keeper = owner(list(body.operations)[-1].operands[j])  # what result j yields
    if keeper is None or keeper.name not in COMBINERS:
        raise refused
    if COMBINERS[keeper.name][0] != ("tl.max" if larger else "tl.min"):
        raise refused
    if set(keeper.operands) != {term, best} or _depends(term, outs) or _depends(new, outs):
        raise refused
    kind = element_type(op.results[j])
    if kind not in FLOATS:
        raise refused
    bound, mask = along_block(low, op, loops, reduced)
    value = Body(low, op, bound).scalar(term)
    neutral = literal(-math.inf if larger else math.inf, kind)
    extents = [ranges(op)[d] for d in reduced]
    lanes = linearize([bound[d] for d in reduced], extents).code
    nan = f"({value.code} != {value.code})"
    if keeper.name in NAN_PROPAGATING:
        # From the first NaN on, the best is NaN and no term beats it: the lanes after
        # it do not count (nor does it, a NaN being greater than nothing).
        first = f"tl.min(tl.where({mask} & {nan}, {lanes}, {math.prod(extents)}), axis=0)"
        counted = f"{mask} & ({lanes} < {low.emit(first, 'index', frozenset()).code})"
    else:  # maxnum/minnum: a NaN term changes nothing
        counted = f"{mask} & ({value.code} == {value.code})"
    masked = low.emit(f"tl.where({counted}, {value.code}, {neutral.code})", kind, value.axes)
    which = "max" if larger else "min"
    extreme = low.emit(f"tl.{which}({masked.code}, axis=0)", kind, frozenset())
    position = low.emit(
        f"tl.arg{which}({masked.code}, axis=0, tie_break_left=True)", "index", frozenset()
    )
    at = list(bound)
    for d, index in zip(reduced, delinearize(Index(position.code), extents), strict=True):
        at[d] = index
    chosen = Body(low, op, at).scalar(new)
    first_best = low.tensor_of(low.element(op.operands[inputs + j], idx))
    first_index = low.element(op.operands[inputs + result], idx)
    beats = f"{extreme.code} {'>' if larger else '<'} {first_best}"
    code = f"tl.where({beats}, {low.tensor_of(chosen)}, {low.tensor_of(first_index)})"
    return low.emit(code, element_type(op.results[result]), first_index.axes)


def _depends(value: ir.Value, on: list[ir.Value]) -> bool:
    if value in on:
        return True
    op = owner(value)
    return op is not None and any(_depends(v, on) for v in op.operands)
