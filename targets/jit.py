"""The CPU calling convention: LLVM-dialect kernels JIT-compiled, called through memref
descriptors.

A kernel `@kope_kernel(in..., out...)` (see `kope-destination-abi`) is JIT-compiled once by the
ExecutionEngine bundled in torch-mlir. Descriptors are built once per kernel (shapes are static);
a call only writes data pointers and enters the packed wrapper, so dispatch stays in the
microseconds.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import re
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch_mlir import ir
from torch_mlir.execution_engine import ExecutionEngine

# One name for the entry point, where the calling convention is made; re-exported for callers.
from kope.passes.abi import ENTRY as ENTRY
from kope.targets.stamp import Stamp
from kope.vocabulary.layouts import has_strides, laid_out, lay_out, layout_strides, span
from kope.vocabulary.specs import TensorSpec

# `llvm.emit_c_interface` (set by `kope-destination-abi`) names the wrapper that takes one
# pointer per memref descriptor; the packed form of that wrapper is what a call enters.
C_INTERFACE = "_mlir_ciface_" + ENTRY
# The ExecutionEngine's packed wrapper of a function `f`, which takes one `void**`, is `_mlir_f`.
PACKED_ENTRY = "_mlir_" + C_INTERFACE
OPT_LEVEL = 3

_DESCRIPTOR_TYPES: dict[int, type[ctypes.Structure]] = {}


def openmp_library() -> str | None:
    """The library parallel kernels link against, or None (see `kope.targets.openmp`)."""
    from kope.targets.openmp import openmp_runtime

    runtime = openmp_runtime()
    return runtime[1] if runtime else None


def set_openmp_threads(threads: int) -> None:
    from kope.targets.openmp import set_threads

    set_threads(threads)


def runtime_libraries(parallel: bool) -> list[str]:
    """The libraries a kernel links against: the OpenMP runtime if it runs parallel loops (its
    threads set to torch's count)."""
    if not parallel:
        return []
    library = openmp_library()
    if library is None:
        raise RuntimeError(
            "the kernel runs parallel loops but no OpenMP runtime is usable: install a "
            "C compiler (KOPE builds a shim over torch's libgomp) or libomp "
            "(Debian: apt-get install libomp5-19)"
        )
    set_openmp_threads(torch.get_num_threads())
    return [library]


def descriptor_type(rank: int) -> type[ctypes.Structure]:
    """The C struct of a ranked memref descriptor: {allocated, aligned, offset, sizes, strides}."""
    if rank not in _DESCRIPTOR_TYPES:
        fields: list[tuple[str, type]] = [
            ("allocated", ctypes.c_void_p),
            ("aligned", ctypes.c_void_p),
            ("offset", ctypes.c_int64),
        ]
        if rank:
            fields += [("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
        _DESCRIPTOR_TYPES[rank] = type(f"MemRef{rank}D", (ctypes.Structure,), {"_fields_": fields})
    return _DESCRIPTOR_TYPES[rank]


def contiguous_descriptor(spec: TensorSpec) -> ctypes.Structure:
    desc = descriptor_type(len(spec.shape))()
    stride = 1
    for dim in reversed(range(len(spec.shape))):
        desc.sizes[dim] = spec.shape[dim]
        desc.strides[dim] = stride
        stride *= max(spec.shape[dim], 1)
    return desc


# A call site's copies of its strided parameters: input index -> (stamp, view, copy).
PackedInputs = dict[int, tuple[Stamp, torch.Tensor, torch.Tensor]]


def _no_entry_point(text: str) -> str:
    """Why the engine found no entry point: the module has none, or it has one that did not
    link (code generation called a function this process lacks: a float64-to-float16
    conversion becomes compiler-rt's __truncdfhf2, which the JIT cannot resolve)."""
    if f"@{C_INTERFACE}(" not in text:
        return (
            f"JIT-compiled module has no @{ENTRY} entry point ({C_INTERFACE}): lower it with "
            f"kope-lower-cpu, whose kope-destination-abi gives @{ENTRY} its C interface"
        )
    hint = (
        " (it converts f64 to f16, which LLVM lowers to compiler-rt's __truncdfhf2)"
        if re.search(
            r"llvm\.fptrunc [^\n]*: (?:vector<\d+xf64>|f64) to (?:vector<\d+xf16>|f16)", text
        )
        else ""
    )
    return f"JIT linking failed: @{ENTRY} calls a function this process does not define{hint}"


class JitKernel:
    """A JIT-compiled kernel with fixed input/output specs; call it like a function of tensors.

    `layouts` maps an input's index to the layout the kernel takes it in
    (`kope.vocabulary.layouts`); callers pass every input in the operator's own layout. An
    output's index (after the inputs') maps to the strided layout the kernel writes it in: a
    call returns it as a view with those strides."""

    def __init__(
        self,
        llvm_module: ir.Module,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        layouts: dict[int, str] | None = None,
        object_file: str | None = None,
    ):
        """JIT-compile `llvm_module`; with `object_file`, as position-independent code, which
        is also written there (for `kope.targets.kernel_cache`)."""
        parallel = "omp.parallel" in str(llvm_module)
        libraries = runtime_libraries(parallel)
        engine = ExecutionEngine(
            llvm_module,
            opt_level=OPT_LEVEL,
            shared_libs=libraries,
            enable_object_dump=object_file is not None,
            enable_pic=object_file is not None,
        )
        address = engine.raw_lookup(C_INTERFACE)
        if not address:
            raise RuntimeError(_no_entry_point(str(llvm_module)))
        if object_file is not None:
            engine.dump_to_object_file(object_file)
        # The engine refers to the module; both must outlive the entry point.
        self._setup(inputs, outputs, layouts, parallel, address, (llvm_module, engine))

    @classmethod
    def from_library(
        cls,
        path: str,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        layouts: dict[int, str] | None,
        parallel: bool,
    ) -> JitKernel:
        """The kernel in a shared library built from a `JitKernel`'s object file."""
        runtime_libraries(parallel)
        library = ctypes.CDLL(path)
        address = ctypes.cast(getattr(library, PACKED_ENTRY), ctypes.c_void_p).value
        assert address is not None
        kernel = cls.__new__(cls)
        kernel._setup(inputs, outputs, layouts, parallel, address, (library,))
        return kernel

    def _setup(
        self,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        layouts: dict[int, str] | None,
        parallel: bool,
        address: int,
        keep: tuple[object, ...],
    ) -> None:
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        given = layouts or {}
        self._layouts = tuple(given.get(i) for i in range(len(self.inputs)))
        self._any_layout = any(self._layouts)
        # Per output written in a strided layout: its shape and strides (else None).
        self._written: tuple[tuple[tuple[int, ...], tuple[int, ...]] | None, ...] = tuple(
            _written_as(spec, given.get(len(self.inputs) + j)) for j, spec in enumerate(outputs)
        )
        self.parallel = parallel
        self._keep = keep
        # PYFUNCTYPE keeps the GIL held during the call: two threads never race on descriptors.
        self._fn = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)(address)
        self._in_desc = [
            contiguous_descriptor(laid_out(s, layout) if layout else s)
            for s, layout in zip(self.inputs, self._layouts, strict=True)
        ]
        out_specs = [
            s if w is None else TensorSpec((span(*w),), s.dtype)
            for s, w in zip(self.outputs, self._written, strict=True)
        ]
        self._out_desc = [contiguous_descriptor(s) for s in out_specs]
        descriptors = self._in_desc + self._out_desc
        # Each descriptor's first two words (allocated, aligned pointers) as integers: a call
        # writes them through these views, faster than through the struct's fields.
        self._pointer_words = [memoryview(d).cast("B").cast("Q") for d in descriptors]
        self._holders = [ctypes.c_void_p(ctypes.addressof(d)) for d in descriptors]
        self._packed = (ctypes.c_void_p * len(descriptors))(
            *[ctypes.addressof(h) for h in self._holders]
        )
        # Sizes as separate arguments: torch.empty parses them faster than one tuple (2.2
        # against 3.4 µs here); a 0-d output has none to pass.
        self._out_shapes = [(tuple(s.shape) or ((),), s.torch_dtype) for s in out_specs]
        self._packed_inputs: PackedInputs = {}
        self.call = self._specialized_call()

    def run(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        """Run on contiguous `inputs` (in the operator's layout; those the kernel takes in
        another are converted here), writing into the contiguous destinations `outputs`."""
        if self._any_layout:
            inputs = [
                t if layout is None else prepared_input(self._packed_inputs, i, t, layout)
                for i, (t, layout) in enumerate(zip(inputs, self._layouts, strict=True))
            ]
        if len(inputs) != len(self._in_desc) or len(outputs) != len(self._out_desc):
            raise self._arity_error(len(inputs), len(outputs))
        into = [_destination(t, w) for t, w in zip(outputs, self._written, strict=True)]
        for pointers, tensor in zip(self._pointer_words, [*inputs, *into], strict=True):
            pointers[0] = pointers[1] = tensor.data_ptr()
        self._fn(self._packed)
        for out, flat, written in zip(outputs, into, self._written, strict=True):
            if written is not None and not has_strides(out, written[1]):
                # Written in the layout's order: read back through its strides.
                out.copy_(flat.as_strided(*written).clone())

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Run on `inputs` (any strides, the operator's layout) into new outputs."""
        if len(inputs) != len(self.inputs):
            raise self._arity_error(len(inputs), len(self.outputs))
        return self.call(*inputs)

    def _arity_error(self, inputs: int, outputs: int) -> ValueError:
        return ValueError(
            f"the kernel takes {len(self.inputs)} inputs and {len(self.outputs)} outputs, "
            f"not {inputs} and {outputs}"
        )

    def _specialized_call(self) -> Callable[..., tuple[torch.Tensor, ...]]:
        """What a call does, written out for this kernel's inputs, layouts and outputs: each
        input made contiguous or laid out (`prepared_input`), the outputs allocated, every data
        pointer written, the entry point entered.

        This runs on every call of every kernel, and the general loop over them cost a
        4-input layer norm 5 of its 13 µs (the kernel itself: 4); unrolled, the loop's
        bookkeeping goes, as generated code removes it from an fx graph's `forward`.
        """
        names = [f"i{index}" for index in range(len(self.inputs))]
        outs = [f"o{index}" for index in range(len(self.outputs))]
        # The function refers to this kernel's parts, not to the kernel: no reference cycle
        # keeps an engine alive after its kernel is dropped (a worker loads hundreds). It
        # holds what owns the code (`keep`: the engine or library), so that a call taken from
        # a kernel nobody else holds (`build(...).bind().call`) never enters freed code.
        namespace: dict[str, Any] = {
            "prepared": functools.partial(prepared_input, self._packed_inputs),
            "empty": torch.empty,
            "fn": self._fn,
            "packed": self._packed,
            "keep": self._keep,
        }
        lines = [f"def call({', '.join(names)}):"]
        for index, (name, layout) in enumerate(zip(names, self._layouts, strict=True)):
            if layout is None:
                lines.append(
                    f"    if not {name}.is_contiguous(): {name} = prepared({index}, {name}, None)"
                )
            elif (strides := layout_strides(layout)) is not None:
                # A view already in the layout's strides is passed where it lies: its first
                # element's address is the span's. Checking that, not laying it out anew,
                # took a ViT's attention call (2x3x65x64, q, k and v permuted out of one
                # projection) from 78-97 µs to 50-63, where ATen's takes 83-115.
                namespace[f"s{index}"] = strides
                lines.append(
                    f"    if {name}.stride() != s{index}: "
                    f"{name} = prepared({index}, {name}, {layout!r})"
                )
            else:
                lines.append(f"    {name} = prepared({index}, {name}, {layout!r})")
        for name, (shape, dtype) in zip(outs, self._out_shapes, strict=True):
            namespace[f"{name}_dtype"] = dtype
            lines.append(f"    {name} = empty({', '.join(map(repr, shape))}, dtype={name}_dtype)")
        for index, (name, words) in enumerate(zip(names + outs, self._pointer_words, strict=True)):
            namespace[f"w{index}"] = words
            lines.append(f"    w{index}[0] = w{index}[1] = {name}.data_ptr()")
        lines.append("    fn(packed)")
        for name, written in zip(outs, self._written, strict=True):
            if written is not None:  # the flat output seen through the layout's strides
                namespace[f"{name}_view"] = written
                lines.append(f"    {name} = {name}.as_strided(*{name}_view)")
        lines.append(f"    return ({', '.join(outs)},)")
        exec(compile("\n".join(lines) + "\n", "<kope kernel call>", "exec"), namespace)
        return cast(Callable[..., tuple[torch.Tensor, ...]], namespace["call"])

    def bind(self) -> JitKernel:
        """This kernel for one call site: the engine and descriptors shared, the packed copies
        of strided inputs its own (two sites of one kernel, the gate and up projections of a
        SwiGLU, would otherwise evict each other's packed weight on every call)."""
        site = copy.copy(self)
        site._packed_inputs = {}
        site.call = site._specialized_call()
        return site


def _written_as(
    spec: TensorSpec, layout: str | None
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """An output's shape and the strides a kernel writes it with; None where contiguous."""
    strides = None if layout is None else layout_strides(layout)
    if layout is not None and strides is None:
        raise ValueError(f"an output is written in a strided layout, not {layout!r}")
    return None if strides is None else (tuple(spec.shape), strides)


def _destination(out: torch.Tensor, written: tuple[Any, Any] | None) -> torch.Tensor:
    """Where a kernel writes `out`: itself, unless it is written in a strided layout that `out`
    does not have: then `out`'s own memory where the layout covers as many elements (a
    permutation: any damage past it stays in sight of the caller's guards), else a buffer."""
    if written is None:
        return out
    extent = span(*written)
    if has_strides(out, written[1]) or (out.is_contiguous() and out.numel() == extent):
        return out
    return torch.empty(extent, dtype=out.dtype, device=out.device)


def prepared_input(
    packed: PackedInputs, index: int, view: torch.Tensor, layout: str | None
) -> torch.Tensor:
    """Input `index` of a kernel contiguous, or copied into the layout the kernel takes it in;
    for a parameter, the copy in `packed` (a call site's own) is reused while it is unchanged.

    A transposed weight arrives as a fresh view every call; copying it every call would
    cost more than many kernels. The copy of a view of a parameter is reused while the
    view's `Stamp` holds (its layout, version counter and sampled memory); the view is
    kept alive with it, so no other tensor can take its storage's address meanwhile. Any
    other input, an activation or a buffer the caller refills (from numpy, say, which no
    version counter sees), and an inference tensor (which counts no writes), is copied on
    every call.
    """
    base = view if view._base is None else view._base
    if not isinstance(base, torch.nn.Parameter) or view.is_inference():
        return lay_out(view, layout) if layout else view.contiguous()
    cached = packed.get(index)
    if cached is not None and cached[0].holds(view):
        return cached[2]
    laid = lay_out(view, layout) if layout else view.contiguous()
    packed[index] = (Stamp(view, layout=True), view, laid)
    return laid
