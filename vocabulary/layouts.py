"""Input layouts a kernel may ask for: an argument it takes in another layout than the
operator's, converted by the caller once per distinct tensor.

A matmul's B operand in a model is a weight: the same tensor on every call. Read as the operator
has it (K x N, each k a row N floats apart), a register tile's B columns lie a row stride apart,
one cache line per k, and a cold cache or TLB pays for every one of them; in panels of `nr`
columns (N/nr x K x nr, each panel contiguous) the k loop reads one stream. MKL packs B this way
inside every call; a kernel that asks for the layout gets it packed once, because the caller
reuses the packed copy while the weight's storage and version counter are unchanged (see
`JitKernel`), and re-packs after an in-place write.

A kernel names the layout on its `@main` argument: `%arg: tensor<JxKxNRxf32> {kope.layout =
"panels:NR"}`, the operator's argument being K x N with N = J * NR.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the passes read the attribute's name without importing torch
    import torch

    from kope.vocabulary.specs import TensorSpec

# The argument attribute that names a layout.
LAYOUT_ATTR = "kope.layout"
PANELS = "panels"


class LayoutError(ValueError):
    pass


def panels(width: int) -> str:
    """The layout name for B in panels of `width` columns."""
    return f"{PANELS}:{width}"


def _width(layout: str) -> int:
    kind, _, width = layout.partition(":")
    if kind != PANELS or not width.isdigit() or int(width) < 1:
        raise LayoutError(f"unknown input layout {layout!r}; the one layout is 'panels:<width>'")
    return int(width)


def laid_out(spec: TensorSpec, layout: str) -> TensorSpec:
    """The argument's shape in `layout` (what the kernel's signature must say)."""
    from kope.vocabulary.specs import TensorSpec

    width = _width(layout)
    if len(spec.shape) != 2 or spec.shape[1] % width:
        raise LayoutError(
            f"layout {layout!r} needs a 2-D argument whose columns divide into panels of "
            f"{width}; this one is {spec}"
        )
    k, n = spec.shape
    return TensorSpec((n // width, k, width), spec.dtype)


def lay_out(tensor: torch.Tensor, layout: str) -> torch.Tensor:
    """`tensor` (the operator's layout, any strides) copied into `layout`, contiguous."""
    width = _width(layout)
    k, n = tensor.shape
    # Splitting the columns is a view at any strides; the permuted copy is the packing.
    return tensor.reshape(k, n // width, width).permute(1, 0, 2).contiguous()
