"""`kope-bf16-bits`: bf16 values carried as i16 in the LLVM dialect, so that LLVM never holds a
bfloat in a register.

After `kope-emulate-bf16` nothing computes on bf16: its values only move (loads, stores,
selects, vector inserts, extracts and shuffles, constants) between the integer operations that
widen and round them. LLVM's x86 backend has no bf16 registers without AVX512-BF16, though: a
bfloat value that stays in a register is promoted to float and rounded back with a call of
compiler-rt's `__truncsfbf2`, which the JIT cannot resolve. LLVM's own vectorizers (opt level 2
and up) make such values: a row statistic broadcast along its row became a splat of
`<N x bfloat>` (every bf16 layer norm failed to build, its reference lowering included), and so
did the masked tiles of a bf16 matmul whose register tile does not divide it. As i16 (a bitcast
of equal width) the same bits move by integer moves and shuffles, with no conversion.

The results of ops that only move bits, and the arguments of blocks they branch to, take the
i16 type; any other op that makes or takes a bf16 value (a constant, a call, a function's
arguments and results) meets them through a bitcast, which LLVM folds on a constant.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir
from torch_mlir.dialects import llvm

from kope.passes.base import ModulePass, nested_ops

_BITCAST = "llvm.bitcast"
# Ops that copy bf16 values without reading them as numbers, and the branches that pass them to
# a block's arguments.
_MOVES = frozenset(
    {
        _BITCAST,
        "llvm.load",
        "llvm.store",
        "llvm.intr.masked.load",
        "llvm.intr.masked.store",
        "llvm.intr.masked.gather",
        "llvm.intr.masked.scatter",
        "llvm.extractelement",
        "llvm.insertelement",
        "llvm.shufflevector",
        "llvm.extractvalue",
        "llvm.insertvalue",
        "llvm.select",
        "llvm.freeze",
        "llvm.mlir.poison",
        "llvm.mlir.undef",
        "llvm.mlir.zero",
        "llvm.br",
        "llvm.cond_br",
        "llvm.switch",
    }
)


def _parts(type_: ir.Type) -> list[ir.Type] | None:
    """The element types of an LLVM array or literal struct; None for any other type."""
    if isinstance(type_, llvm.ArrayType):
        return [type_.element_type] * type_.num_elements
    if isinstance(type_, llvm.StructType) and not type_.opaque and type_.name is None:
        return list(type_.body)
    return None


def bits_type(type_: ir.Type) -> ir.Type | None:
    """`type_` with i16 for each bf16 in it (a scalar, a vector, LLVM arrays and literal structs
    of those); None where it holds no bf16."""
    i16 = ir.IntegerType.get_signless(16, type_.context)
    if isinstance(type_, ir.BF16Type):
        return i16
    if isinstance(type_, ir.VectorType):
        bf16 = isinstance(type_.element_type, ir.BF16Type)
        return ir.VectorType.get(type_.shape, i16) if bf16 else None
    parts = _parts(type_)
    if not parts:
        return None
    bits = [bits_type(part) for part in parts]
    if not any(bits):
        return None
    if isinstance(type_, llvm.ArrayType):
        return llvm.ArrayType.get(bits[0], type_.num_elements)
    return llvm.StructType.get_literal(
        [new or old for new, old in zip(bits, parts, strict=True)], packed=type_.packed
    )


def _cast(value: ir.Value, to: ir.Type) -> ir.Value:
    """`value` as `to`, the same bits: a bitcast, element by element for an aggregate (which
    `llvm.bitcast` does not take)."""
    parts = _parts(to)
    if parts is None:
        return llvm.bitcast(to, value)
    sources = _parts(value.type)
    assert sources is not None
    result = llvm.mlir_poison(to)
    for index, (source, part) in enumerate(zip(sources, parts, strict=True)):
        element = llvm.extractvalue(source, value, [index])
        result = llvm.insertvalue(result, _cast(element, part), [index])
    return result


@dataclass
class Bf16Bits(ModulePass):
    """Give the bf16 values that only move through an LLVM-dialect module the type i16."""

    name = "kope-bf16-bits"
    summary = (
        "Carry bf16 values as i16 in the LLVM dialect (LLVM rounds a bfloat it holds in a "
        "register with __truncsfbf2, which the JIT cannot resolve)"
    )

    def run(self, module: ir.Operation) -> None:
        with module.context, ir.Location.unknown():  # where a literal struct type is made
            _carry_as_bits(module)


def _carry_as_bits(module: ir.Operation) -> None:
    moving: dict[ir.Value, ir.Type] = {}  # values that only move, with their i16 types
    others: list[ir.Operation] = []  # ops that make or take bf16 values and do not move them
    made: list[ir.Value] = []  # bf16 values those ops (and entry blocks) make

    def sort(value: ir.Value, moves: bool) -> None:
        bits = bits_type(value.type)
        if bits is not None and moves:
            moving[value] = bits
        elif bits is not None:
            made.append(value)

    for op in nested_ops(module):
        moves = op.name in _MOVES
        for result in op.results:
            sort(result, moves)
        for region in op.regions:
            for position, block in enumerate(region.blocks):
                for argument in block.arguments:
                    # An entry block's arguments are its function's (or op's) own; the others
                    # are what branches pass.
                    sort(argument, position > 0)
        if not moves and any(bits_type(v.type) for v in [*op.operands, *op.results]):
            others.append(op)
    # Where a moving value meets an op that takes it as bf16, and where a bf16 value made
    # elsewhere meets a moving op: bitcasts (recorded before any type changes).
    taken = [
        (op, index, operand.type)
        for op in others
        for index, operand in enumerate(op.operands)
        if operand in moving
    ]
    met = [
        (_operation(use.owner), use.operand_number, bits_type(value.type))
        for value in made
        for use in value.uses
        if _operation(use.owner).name in _MOVES
    ]
    if not (moving or met):
        return
    for value, bits in moving.items():
        value.set_type(bits)
    for op, index, bf16 in taken:
        with ir.InsertionPoint(op), op.location:
            op.operands[index] = _cast(op.operands[index], bf16)
    for user, index, bits in met:
        with ir.InsertionPoint(user), user.location:
            user.operands[index] = _cast(user.operands[index], bits)
    _fold_identity_bitcasts(module)


def _operation(owner: ir.Operation | ir.OpView) -> ir.Operation:
    return owner.operation if isinstance(owner, ir.OpView) else owner


def _fold_identity_bitcasts(module: ir.Operation) -> None:
    for op in nested_ops(module):
        if op.name != _BITCAST or op.operands[0].type != op.results[0].type:
            continue
        op.results[0].replace_all_uses_with(op.operands[0])
        op.erase()
