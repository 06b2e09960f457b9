"""`kope-destination-abi`: give a tensor payload KOPE's one safe calling convention.

`func.func @main(tensors) -> tensors` gains a public wrapper
`func.func @kope_kernel(input memrefs..., output memrefs...)` with `llvm.emit_c_interface`:
inputs enter through `bufferization.to_tensor restrict`, results leave through
`bufferization.materialize_in_destination ... restrict writable` into caller-allocated outputs.
No tensor result crosses the boundary, so nothing is returned through aliasing descriptors.

A module that already has `@kope_kernel` (a memref kernel, as people and language models write
it) is put into the same convention: the entry must take static identity-layout memrefs and
return nothing; it is made public (else `symbol-dce` deletes it) and given
`llvm.emit_c_interface` (else no `_mlir_ciface_kope_kernel` exists and the invoker finds no
entry point). Writers of such kernels need not know either attribute.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir

from kope.passes.base import ModulePass, PassError
from kope.vocabulary.layouts import LAYOUT_ATTR

ENTRY = "kope_kernel"
PAYLOAD = "main"


def _functions(module: ir.Operation) -> dict[str, ir.Operation]:
    """The module's top-level functions by name, in order."""
    return {
        ir.StringAttr(op.attributes["sym_name"]).value: op.operation
        for op in module.regions[0].blocks[0].operations
        if op.operation.name == "func.func"
    }


def find_func(module: ir.Operation, name: str) -> ir.Operation | None:
    return _functions(module).get(name)


def function_type(func: ir.Operation) -> ir.FunctionType:
    return ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)


def argument_layouts(module: ir.Operation) -> dict[int, str]:
    """The layouts the entry (`@kope_kernel`, else `@main`) names on its arguments and results
    (`{kope.layout = "..."}`, see `kope.vocabulary.layouts`), by `@kope_kernel`'s argument
    index: the inputs, then the outputs (a result of `@main` numbered after its inputs)."""
    func = find_func(module, ENTRY) or find_func(module, PAYLOAD)
    if func is None:
        return {}
    found: dict[int, str] = {}
    inputs = len(function_type(func).inputs)
    for name, first in (("arg_attrs", 0), ("res_attrs", inputs)):
        if name not in func.attributes:
            continue
        for index, attrs in enumerate(ir.ArrayAttr(func.attributes[name])):
            entries = ir.DictAttr(attrs)
            if LAYOUT_ATTR in entries:
                found[first + index] = ir.StringAttr(entries[LAYOUT_ATTR]).value
    return found


def _memref_of(t: ir.Type) -> str:
    if not isinstance(t, ir.RankedTensorType):
        raise PassError(f"@{PAYLOAD} must take and return ranked tensors, got {t}")
    rt = t
    if not rt.has_static_shape:
        raise PassError(f"@{PAYLOAD} must have static shapes, got {t}")
    return str(ir.MemRefType.get(rt.shape, rt.element_type))


def plain_memref(t: ir.Type) -> bool:
    """A memref of static shape in the default (contiguous, row-major) layout and memory
    space: what the invoker's descriptors describe, and what `memcpy` copies whole."""
    return (
        isinstance(t, ir.MemRefType)
        and t.has_static_shape
        and str(t) == str(ir.MemRefType.get(t.shape, t.element_type))
    )


def adopt_entry(entry: ir.Operation) -> None:
    """Give a hand-written `@kope_kernel` the calling convention the invoker relies on."""
    if not entry.regions[0].blocks:
        raise PassError(f"@{ENTRY} is only declared; it needs a body", entry.location)
    ftype = function_type(entry)
    if list(ftype.results):
        results = ", ".join(str(t) for t in ftype.results)
        raise PassError(
            f"@{ENTRY} must return nothing, got ({results}): write each output into its "
            "destination memref, passed after the inputs",
            entry.location,
        )
    for index, t in enumerate(ftype.inputs):
        # The invoker passes contiguous descriptors built once from static shapes; any other
        # layout, a dynamic size or a memory space would be read through the wrong strides.
        if not plain_memref(t):
            raise PassError(
                f"@{ENTRY} argument {index} is {t}; arguments must be memrefs with static "
                "shapes and the default (contiguous) layout",
                entry.location,
            )
    entry.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get(entry.context)
    if "sym_visibility" in entry.attributes:
        del entry.attributes["sym_visibility"]


@dataclass
class DestinationAbi(ModulePass):
    """Wrap `@main` into `@kope_kernel(inputs..., outputs...)`, or adopt a `@kope_kernel`."""

    name = "kope-destination-abi"
    summary = "Wrap @main (tensors) into @kope_kernel (memref inputs, memref destinations)"

    def run(self, module: ir.Operation) -> None:
        entry = find_func(module, ENTRY)
        if entry is not None:
            adopt_entry(entry)
            return
        payload = find_func(module, PAYLOAD)
        if payload is None:
            names = ["@" + name for name in _functions(module)]
            raise PassError(
                f"module has neither @{ENTRY} nor a @{PAYLOAD} payload function (it has "
                f"{', '.join(names) or 'no function'}): name the function to lower @{PAYLOAD}"
            )
        ftype = function_type(payload)
        ins = [str(t) for t in ftype.inputs]
        outs = [str(t) for t in ftype.results]
        in_mem = [_memref_of(t) for t in ftype.inputs]
        out_mem = [_memref_of(t) for t in ftype.results]
        payload.attributes["sym_visibility"] = ir.StringAttr.get("private")

        params = [f"%in{i}: {m}" for i, m in enumerate(in_mem)]
        params += [f"%out{j}: {m}" for j, m in enumerate(out_mem)]
        body = [
            f"%t{i} = bufferization.to_tensor %in{i} restrict : {m} to {t}"
            for i, (m, t) in enumerate(zip(in_mem, ins, strict=True))
        ]
        call_args = ", ".join(f"%t{i}" for i in range(len(ins)))
        results = f"%r:{len(outs)} = " if outs else ""
        signature = f"({', '.join(ins)}) -> ({', '.join(outs)})"
        body.append(f"{results}func.call @{PAYLOAD}({call_args}) : {signature}")
        body += [
            f"bufferization.materialize_in_destination %r#{j} in restrict writable %out{j}"
            f" : ({t}, {m}) -> ()"
            for j, (t, m) in enumerate(zip(outs, out_mem, strict=True))
        ]
        body.append("func.return")
        text = (
            f"func.func @{ENTRY}({', '.join(params)}) attributes {{llvm.emit_c_interface}} {{\n  "
            + "\n  ".join(body)
            + "\n}"
        )
        # A declaration of @main lets the wrapper verify on its own; only the wrapper moves.
        declaration = f"func.func private @{PAYLOAD}({', '.join(ins)}) -> ({', '.join(outs)})"
        wrapper = ir.Module.parse(declaration + "\n" + text, module.context)
        entry = wrapper.body.operations[1]
        module.regions[0].blocks[0].append(entry.operation)
