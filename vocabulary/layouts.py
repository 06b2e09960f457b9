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
"panels:NR"}`, the operator's argument being K x N with N = J * NR; or `"panels:NR:J"` for
J panels holding N <= J * NR columns, the rest zeros.

The other way round, an argument that reaches the operator as a view of a larger tensor (q, k
and v of attention, permuted out of one projection) is copied contiguous for a kernel on every
call: the copy can cost more than the kernel gains. A kernel that reads the view where it lies
names `"strided:S0,S1,..."` (the view's strides, in elements) and takes a 1-D
`tensor<EXTENTxf32>`: the memory from the view's first element to its last, which the caller
passes without a copy where the argument arrives with those strides (and lays out with them
where it does not).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the passes read the attribute's name without importing torch
    import torch

    from kope.vocabulary.specs import TensorSpec

# The argument attribute that names a layout.
LAYOUT_ATTR = "kope.layout"
PANELS = "panels"
STRIDED = "strided"


class LayoutError(ValueError):
    pass


def panels(width: int, count: int | None = None) -> str:
    """The layout name for B in panels of `width` columns; with `count`, that many panels,
    the columns past the operator's zero (a ragged last panel, or whole panels more, so
    that threads share them evenly)."""
    return f"{PANELS}:{width}" if count is None else f"{PANELS}:{width}:{count}"


def panel_geometry(layout: str) -> tuple[int, int | None]:
    """A panels layout's width and panel count (None: as many as the columns divide into);
    a `LayoutError` for any other layout."""
    kind, *numbers = layout.split(":")
    if kind != PANELS or len(numbers) not in (1, 2) or not all(v.isdigit() for v in numbers):
        raise LayoutError(
            f"unknown input layout {layout!r}; the layouts are 'panels:<width>[:<count>]' and "
            "'strided:<s0>,<s1>,...'"
        )
    width, count = int(numbers[0]), int(numbers[1]) if len(numbers) == 2 else None
    if width < 1 or count == 0:
        raise LayoutError(f"layout {layout!r} needs a width and a count of at least 1")
    return width, count


def strided(strides: tuple[int, ...] | list[int]) -> str:
    """The layout name for a view with `strides` (elements), read where it lies."""
    return f"{STRIDED}:{','.join(str(int(s)) for s in strides)}"


@functools.cache  # read on every call of a kernel that takes a view
def layout_strides(layout: str) -> tuple[int, ...] | None:
    """A strided layout's strides; None for another kind; a `LayoutError` if malformed."""
    kind, _, rest = layout.partition(":")
    if kind != STRIDED:
        return None
    try:
        strides = tuple(int(s) for s in rest.split(","))
    except ValueError:
        strides = ()
    if not strides or min(strides) < 0:
        raise LayoutError(f"layout {layout!r} needs strides: 'strided:<s0>,<s1>,...' (elements)")
    return strides


def span(shape: tuple[int, ...] | list[int], strides: tuple[int, ...]) -> int:
    """The elements from a view's first to its last (what a strided layout passes)."""
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))


def has_strides(tensor: torch.Tensor, strides: tuple[int, ...]) -> bool:
    """Whether `tensor` lies in memory as `strides` say (a dim of one element any way)."""
    given = zip(tensor.shape, tensor.stride(), strides, strict=True)
    return all(n == 1 or a == b for n, a, b in given)


def laid_out(spec: TensorSpec, layout: str) -> TensorSpec:
    """The argument's shape in `layout` (what the kernel's signature must say)."""
    from kope.vocabulary.specs import TensorSpec

    strides = layout_strides(layout)
    if strides is not None:
        if len(strides) != len(spec.shape):
            raise LayoutError(
                f"layout {layout!r} gives {len(strides)} strides for a {len(spec.shape)}-D "
                f"argument ({spec})"
            )
        return TensorSpec((span(spec.shape, strides),), spec.dtype)
    width, count = panel_geometry(layout)
    fits = len(spec.shape) == 2 and (
        spec.shape[1] % width == 0 if count is None else count * width >= spec.shape[1]
    )
    if not fits:
        need = "divide into" if count is None else f"fit in {count}"
        raise LayoutError(
            f"layout {layout!r} needs a 2-D argument whose columns {need} panels of "
            f"{width}; this one is {spec}"
        )
    k, n = spec.shape
    return TensorSpec((count or n // width, k, width), spec.dtype)


def lay_out(tensor: torch.Tensor, layout: str) -> torch.Tensor:
    """`tensor` (the operator's layout, any strides) copied into `layout`, contiguous.

    One copy into the panels, the zero columns past the operator's written in place: padding
    first (`F.pad`, then the permuted copy) took a 256x688 B into 44 panels of 16 119-128 us,
    one copy 50-52 (transposed: 254 and 98); a B that is not a kept weight (a buffer, a tensor
    made under inference_mode) is packed on every call.

    A strided layout is a view of the tensor's own memory where its strides are the layout's
    (dims of one element aside): no copy."""
    import torch

    strides = layout_strides(layout)
    if strides is not None:
        if len(strides) != tensor.dim():
            raise LayoutError(f"layout {layout!r} does not fit a {tensor.dim()}-D tensor")
        extent = span(tensor.shape, strides)
        if has_strides(tensor, strides):
            return tensor.as_strided((extent,), (1,))
        out = torch.empty(extent, dtype=tensor.dtype, device=tensor.device)
        out.as_strided(tensor.shape, strides).copy_(tensor)
        return out
    width, count = panel_geometry(layout)
    k, n = tensor.shape
    count = count or n // width
    # Splitting the columns is a view at any strides; the permuted copy is the packing.
    if count * width == n:
        return tensor.reshape(k, count, width).permute(1, 0, 2).contiguous()
    # Zero columns up to whole panels (a ragged last panel, or panels that share threads).
    out = torch.empty((count, k, width), dtype=tensor.dtype, device=tensor.device)
    whole, rest = divmod(n, width)
    if whole:
        out[:whole].copy_(tensor[:, : whole * width].reshape(k, whole, width).permute(1, 0, 2))
    out[whole:].zero_()
    if rest:
        out[whole, :, :rest].copy_(tensor[:, whole * width :])
    return out
