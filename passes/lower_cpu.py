"""`kope-lower-cpu`: the fixed pipeline from linalg-on-tensors to the LLVM dialect for the CPU JIT.

This is the reference lowering's pipeline; speedups are quoted against what it produces at
`opt_level=3`. The order encodes lessons from DESIGN.md: outputs are destinations (no tensor
results cross the boundary, and empty-tensor elimination computes them in place),
`memref.copy` never reaches the `memrefCopy` runtime call, `lower-affine` runs again after
`expand-strided-metadata`, and vector transfers unroll fully (the partial form allocates on
the stack inside loops and overflows it). Two legalizations make vectorized forms lower
correctly: integer powers become multiplications (`kope-expand-powers`: a vector
`math.fpowi` lowers to invalid `llvm.intr.powi`), and vectors of i1 are stored one byte per
element (`kope-bool-vector-memory`: LLVM packs them in bits). `log1p` and `expm1` keep their
digits near zero (`kope-expand-log1p-expm1`: math-to-llvm computes `log(1 + x)`). bf16
arithmetic is computed in f32 (`kope-emulate-bf16`): LLVM would round each result with
`__truncsfbf2`, which the JIT lacks; and it rounds a bfloat it merely holds in a register
too, so bf16 values move as i16 (`kope-bf16-bits`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kope.passes.abi import DestinationAbi
from kope.passes.base import PipelineElement, PipelinePass
from kope.passes.bf16_bits import Bf16Bits
from kope.passes.bool_memory import BoolVectorMemory
from kope.passes.defined_padding import DefinedPadding
from kope.passes.emulate_bf16 import EmulateBf16
from kope.passes.hoist_allocs import HoistAllocs
from kope.passes.integer_powers import ExpandPowers
from kope.passes.memref_copy import MemrefCopyToLinalg
from kope.passes.reshape_destinations import ReshapeDestinations
from kope.passes.schedule import ApplySchedule
from kope.passes.small_arguments import ExpandLog1pExpm1

BUFFERIZE = (
    "one-shot-bufferize{bufferize-function-boundaries "
    "function-boundary-type-conversion=identity-layout-map}"
)

TO_LLVM = [
    "func.func(convert-linalg-to-loops)",
    "convert-bufferization-to-memref",
    "func.func(convert-vector-to-scf{full-unroll=true})",
    # Parallel loops of a schedule (scf.forall) run on OpenMP threads; the reference has none.
    "func.func(scf-forall-to-parallel)",
    "convert-scf-to-openmp",
    "lower-affine",
    "expand-strided-metadata",
    "lower-affine",
    # Math before vectors: what has no LLVM intrinsic (erf, exact or of bf16, has no
    # polynomial form) becomes libm calls per lane, unrolled through vector.extract/insert,
    # which must still be lowered; intrinsics first, so libm takes only the rest.
    "convert-math-to-llvm",
    "convert-math-to-libm",
    # Vectorized reductions may reassociate (the verifier bounds the rounding difference);
    # strict order would make every vector reduction a chain of scalar adds.
    "convert-vector-to-llvm{reassociate-fp-reductions=true}",
    # Before scf-to-cf: it lowers the alloca scopes that wrap OpenMP loop bodies, which must
    # stay single-block until then.
    "finalize-memref-to-llvm",
    "convert-scf-to-cf",
    "convert-openmp-to-llvm",
    "convert-arith-to-llvm",
    "convert-ub-to-llvm",
    "convert-func-to-llvm",
    "convert-cf-to-llvm",
    "convert-index-to-llvm",
    "reconcile-unrealized-casts",
]


@dataclass
class LowerCpu(PipelinePass):
    """linalg-on-tensors (`@main`, optionally scheduled, or `@kope_kernel`) to LLVM dialect."""

    name = "kope-lower-cpu"
    summary = "Lower a linalg-on-tensors kernel to the LLVM dialect for the CPU JIT"

    def expand(self) -> list[PipelineElement]:
        return [
            ApplySchedule(),  # a kernel's own schedule, on its tensor payload
            ExpandPowers(),  # before math-to-llvm: powi takes no vector exponent
            ExpandLog1pExpm1(),  # math-to-llvm would compute log(1 + x), exp(x) - 1
            EmulateBf16(),  # bf16 computed in f32: LLVM's bf16 rounding is a libcall
            DestinationAbi(),
            "inline",
            "symbol-dce",
            ReshapeDestinations(),  # results written out through reshapes: computed in place
            "eliminate-empty-tensors",  # results are computed in the destinations, not copied
            BUFFERIZE,
            "buffer-deallocation-pipeline",
            "canonicalize",
            HoistAllocs(),  # one allocation per call, not per iteration, for fused temporaries
            DefinedPadding(),  # no lane of a vector reads bytes nothing wrote (denormal assists)
            MemrefCopyToLinalg(),
            *TO_LLVM,
            Bf16Bits(),  # bf16 values as i16: LLVM rounds a bfloat it holds in a register
            BoolVectorMemory(),  # on the LLVM dialect, where i1 vectors meet memory
        ]
