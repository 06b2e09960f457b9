"""The payload as the Triton kernels read it, and how they refuse one.

`Payload` is an operator's function cleaned by `prepare_payload` and generalized (named linalg
ops become `linalg.generic`), with its arguments, results and ops at hand; the helpers read a
generic's indexing maps, loops and the shapes of its values. Everything in the Triton lowering
that meets a form it does not translate raises `Unsupported`, whose message is the reason
`unsupported_reason` reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir
from torch_mlir.passmanager import PassManager

from kope.passes.analysis import _loops, main_function, prepare_payload

RESHAPES = {"tensor.expand_shape", "tensor.collapse_shape"}
FUNC_LEVEL = RESHAPES | {
    "arith.constant",
    "tensor.empty",
    "tensor.pad",
    "linalg.generic",
    "func.return",
}


class Unsupported(Exception):
    """The payload needs something these kernel templates do not do; the message says what."""


@dataclass
class Payload:
    """A payload cleaned by `prepare_payload` and generalized, with its function's values."""

    context: ir.Context
    module: ir.Module
    func: ir.Operation
    arguments: list[ir.Value]
    results: list[ir.Value]
    ops: list[ir.Operation]  # the function's ops in program order

    @classmethod
    def parse(cls, text: str) -> Payload:
        try:
            prepared = prepare_payload(text)
        except Exception as err:  # a pipeline failure is a reason, not a crash
            raise Unsupported(f"the payload does not clean up: {err}") from err
        context = ir.Context()
        context.enable_multithreading(False)
        module = ir.Module.parse(prepared, context)
        with context:
            PassManager.parse("builtin.module(func.func(linalg-generalize-named-ops))").run(
                module.operation
            )
        func = main_function(module)
        block = func.regions[0].blocks[0]
        ops = [op.operation for op in block.operations]
        return cls(context, module, func, list(block.arguments), list(ops[-1].operands), ops)

    def generics(self) -> list[ir.Operation]:
        return [op for op in self.ops if op.name == "linalg.generic"]

    def is_argument(self, value: ir.Value) -> bool:
        return isinstance(value, ir.BlockArgument) and value.owner == self.func_block

    @property
    def func_block(self) -> ir.Block:
        return self.func.regions[0].blocks[0]


def maps(op: ir.Operation) -> list[ir.AffineMap]:
    return [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]


def iterators(op: ir.Operation) -> list[str]:
    return _loops(op)[0]


def ranges(op: ir.Operation) -> list[int]:
    return _loops(op)[1]


def dim_positions(amap: ir.AffineMap) -> list[int | None]:
    """The loop each result of a map reads (None for a constant)."""
    found: list[int | None] = []
    for expr in amap.results:
        if isinstance(expr, ir.AffineDimExpr):
            found.append(expr.position)
        elif isinstance(expr, ir.AffineConstantExpr):
            found.append(None)
        else:
            raise Unsupported(f"an indexing map with a compound expression ({amap})")
    return found


def plain(amap: ir.AffineMap) -> bool:
    """Whether every result of a map is a loop or a constant (no window arithmetic)."""
    return all(isinstance(e, ir.AffineDimExpr | ir.AffineConstantExpr) for e in amap.results)


def shape(value: ir.Value) -> tuple[int, ...]:
    shaped = ir.ShapedType(value.type)
    if not shaped.has_static_shape:
        raise Unsupported(f"a dynamic shape ({value.type})")
    return tuple(shaped.shape)


def element_type(value: ir.Value) -> str:
    kind = value.type
    return str(ir.ShapedType(kind).element_type if isinstance(kind, ir.ShapedType) else kind)


def owner(value: ir.Value) -> ir.Operation | None:
    if isinstance(value, ir.BlockArgument):
        return None
    op = value.owner
    return op.operation if hasattr(op, "operation") else op


def strip_reshapes(value: ir.Value) -> ir.Value:
    """The value a chain of reshapes starts from (row-major order is the same memory)."""
    while (op := owner(value)) is not None and op.name in RESHAPES:
        value = op.operands[0]
    return value


def reassociation(op: ir.Operation) -> list[list[int]]:
    groups = ir.ArrayAttr(op.attributes["reassociation"])
    return [[ir.IntegerAttr(i).value for i in ir.ArrayAttr(group)] for group in groups]
