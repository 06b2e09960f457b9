"""`kope-memref-copy-to-linalg`: turn `memref.copy` into `linalg.copy`, lowered to loops later.

Strided `memref.copy` lowers to a call of the `memrefCopy` runtime function, which the
ExecutionEngine in the torch-mlir wheel does not provide (bufferizing a padded conv2d hits it).
Expressing the copy as a linalg op removes the runtime dependency and lets it be vectorized.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir
from torch_mlir.dialects import linalg

from kope.passes.base import ModulePass, nested_ops


@dataclass
class MemrefCopyToLinalg(ModulePass):
    """Rewrite every `memref.copy` into an equivalent `linalg.copy`."""

    name = "kope-memref-copy-to-linalg"
    summary = "Rewrite memref.copy as linalg.copy (no memrefCopy runtime symbol needed)"

    def run(self, module: ir.Operation) -> None:
        for copy in [op for op in nested_ops(module) if op.name == "memref.copy"]:
            with ir.InsertionPoint(copy), copy.location:
                linalg.copy(copy.operands[0], outs=[copy.operands[1]])
            copy.erase()
