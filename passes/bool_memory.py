"""`kope-bool-vector-memory`: vectors of i1 move through memory as one byte per element.

A memref of i1 holds one byte per element: that is how scalar loads and stores of i1 lower
(LLVM's i1 has a store size of one byte). A vector of i1, however, is bit-packed in LLVM's
memory layout (`<32 x i1>` is 4 bytes), so a vectorized `isnan`, comparison or boolean
`where` mask that `llvm.store`s a `vector<32xi1>` into a bool buffer writes 4 bytes of bits
where 32 bytes were meant, and a vector load reads bits from bytes. This pass, run on the
LLVM dialect, makes every vector load and store of i1 elements (plain and masked) go through
a vector of i8: `zext` before a store, `trunc` after a load. Accesses to memory whose element
type is itself a vector (a `getelementptr` over `vector<Nxi1>`) are packed on both sides and
are left alone. Gathers and scatters access each element as a scalar i1 and need nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir

from kope.passes.base import ModulePass, defining_op, nested_ops

_LOAD = "llvm.load"
_STORE = "llvm.store"
_MASKED_LOAD = "llvm.intr.masked.load"
_MASKED_STORE = "llvm.intr.masked.store"


def _bool_vector(t: ir.Type) -> bool:
    if not isinstance(t, ir.VectorType):
        return False
    element = t.element_type
    return isinstance(element, ir.IntegerType) and element.width == 1


def _bytes_of(t: ir.VectorType) -> ir.VectorType:
    return ir.VectorType.get(t.shape, ir.IntegerType.get_signless(8))


def _packed_memory(address: ir.Value) -> bool:
    """Whether `address` points into memory whose elements are vectors (packed on purpose)."""
    op = defining_op(address)
    if op is None or op.name not in ("llvm.getelementptr", "llvm.alloca"):
        return False
    element = op.attributes["elem_type"]
    return isinstance(ir.TypeAttr(element).value, ir.VectorType)


def _generic(
    name: str, results: list[ir.Type], operands: list[ir.Value], like: ir.Operation
) -> ir.Operation:
    """A copy of `like` (same attributes and operand segments) with new operand/result types."""
    attributes = {name: like.attributes[name] for name in like.attributes}
    return ir.Operation.create(name, results=results, operands=operands, attributes=attributes)


@dataclass
class BoolVectorMemory(ModulePass):
    """Widen vector<Nxi1> loads and stores to vector<Nxi8> in the LLVM dialect."""

    name = "kope-bool-vector-memory"
    summary = "Load and store i1 vectors as one byte per element (memref<...xi1> layout)"

    def run(self, module: ir.Operation) -> None:
        found = [
            op
            for op in nested_ops(module)
            if (op.name in (_LOAD, _MASKED_LOAD) and _bool_vector(op.results[0].type))
            or (op.name in (_STORE, _MASKED_STORE) and _bool_vector(op.operands[0].type))
        ]
        for op in found:
            with ir.InsertionPoint(op), op.location:
                self._widen(op)

    @staticmethod
    def _widen(op: ir.Operation) -> None:
        if op.name == _LOAD:
            if _packed_memory(op.operands[0]):
                return
            bools = op.results[0].type
            load = _generic(_LOAD, [_bytes_of(bools)], [op.operands[0]], op)
            narrow = ir.Operation.create("llvm.trunc", results=[bools], operands=load.results)
            op.results[0].replace_all_uses_with(narrow.results[0])
            op.erase()
        elif op.name == _MASKED_LOAD:
            # operands: address, mask, pass-through
            if _packed_memory(op.operands[0]):
                return
            bools = op.results[0].type
            wide = _bytes_of(bools)
            through = ir.Operation.create("llvm.zext", results=[wide], operands=[op.operands[2]])
            operands = [op.operands[0], op.operands[1], through.results[0]]
            load = _generic(_MASKED_LOAD, [wide], operands, op)
            narrow = ir.Operation.create("llvm.trunc", results=[bools], operands=load.results)
            op.results[0].replace_all_uses_with(narrow.results[0])
            op.erase()
        else:
            # llvm.store: value, address; llvm.intr.masked.store: value, address, mask
            if _packed_memory(op.operands[1]):
                return
            value = op.operands[0]
            wide = ir.Operation.create(
                "llvm.zext", results=[_bytes_of(value.type)], operands=[value]
            )
            _generic(op.name, [], [wide.results[0], *list(op.operands)[1:]], op)
            op.erase()
