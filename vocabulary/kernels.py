"""A candidate kernel as every room sees it: its text and the form the text is in."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

# The forms a kernel's text can take; a target says which it builds (`Target.kernel_forms`),
# the store keeps the form beside the text, and the LLM agent asks for one the target builds.
FORM_MLIR = "mlir"  # an MLIR module: linalg `@main` (+ transform schedule) or memref `@kope_kernel`
FORM_TRITON = "triton"  # Python source of `@triton.jit` kernels and a launcher


@dataclass(frozen=True)
class Kernel:
    """A candidate kernel: its text and the form the text is in (a `FORM_*` name, or
    a third-party target's own).

    An MLIR kernel holds either `func.func @main` on tensors (a linalg payload, maybe with a
    transform schedule; the target wraps it in its calling convention) or `func.func
    @kope_kernel` on memrefs, inputs then outputs, with outputs as destinations. The reference
    lowering is an MLIR kernel of the first kind.
    """

    source: str
    form: str = FORM_MLIR

    @property
    def digest(self) -> str:
        return hashlib.sha256(f"{self.form}\n{self.source}".encode()).hexdigest()
