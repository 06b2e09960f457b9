"""Whether a tensor kept across calls still holds what it held when a result was made from it.

KOPE keeps results made from a model's weights between calls: a strided weight's contiguous
or packed copy (`kope.targets.jit`), batch norms folded into a convolution's weights
(`kope.frontend.rewrites`). PyTorch bumps a tensor's version counter on every in-place write through
it or a view of it, and a stamp compares that. Some writes bypass the counter: through
`.data` (`p.data.mul_(0.5)`, old-style weight updates and EMA code) and through memory shared
with numpy or DLPack. So a stamp of a CPU tensor also holds about `SAMPLES` words of its
memory spread evenly over it, its first and last among them, read again on every check (one C call:
about 0.2 µs a tensor on a 2-core AVX2 machine, beside 0.3 µs for the version and address):
a write that changes any of them (a rescale, a refill, a loaded checkpoint) is seen.
A write through `.data` to a few elements between the samples is not; such code must bump the
version (`with torch.no_grad(): p.mul_(…)`, as optimizers and `load_state_dict` do).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Literal

import torch

SAMPLES = 8


class Stamp:
    """What `tensor` is and holds now; `holds(t)` says whether `t` is it, unchanged. With
    `layout`, `t` may be another view of the same memory (a weight's `t()`, fresh every call)
    and must have the same shape and strides; without it the caller holds `t` itself."""

    __slots__ = ("_ptr", "_read", "_shape", "_storage", "_stride", "_version", "_words")

    def __init__(self, tensor: torch.Tensor, layout: bool = False):
        self._version = tensor._version
        self._ptr = tensor.data_ptr()
        self._shape = tensor.shape if layout else None
        self._stride = tensor.stride() if layout else None
        # The storage stays alive with the stamp, so the addresses read stay its own.
        self._storage = tensor.untyped_storage()
        self._read = _sampler(self._storage) if tensor.device.type == "cpu" else None
        self._words = self._read() if self._read is not None else None

    def holds(self, tensor: torch.Tensor) -> bool:
        # Cheapest first: this runs on every call, for every kept tensor.
        if tensor._version != self._version or tensor.data_ptr() != self._ptr:
            return False
        if self._shape is not None and (
            tensor.shape != self._shape or tensor.stride() != self._stride
        ):
            return False
        return self._read is None or self._read() == self._words


# memoryview formats of unsigned words and their widths, the widest first.
_Format = Literal["Q", "I", "H", "B"]
_WORDS: tuple[tuple[_Format, int], ...] = (("Q", 8), ("I", 4), ("H", 2), ("B", 1))


def _sampler(storage: torch.UntypedStorage) -> Callable[[], bytes] | None:
    """A call that reads about `SAMPLES` words spread evenly over `storage`'s memory, its first
    and last among them, as one `bytes`: a strided memoryview copied in one C call (0.2 µs; an
    itemgetter making a Python int of each word took 0.67)."""
    size = storage.nbytes()
    if size == 0:
        return None
    # The widest word that tiles the memory, so that the last word ends where it does.
    fmt, width = next((f, w) for f, w in _WORDS if size % w == 0)
    count = size // width
    raw = (ctypes.c_char * (count * width)).from_address(storage.data_ptr())
    memory = memoryview(raw).cast("B").cast(fmt)
    # A step that reaches the last word from the first, if one of the few nearest
    # `SAMPLES` samples does: one view, one copy.
    step = max(1, -(-(count - 1) // SAMPLES))
    for near in range(step, max(1, step // 2, step - 64) - 1, -1):
        if (count - 1) % near == 0:
            return memory[::near].tobytes
    spread, last = memory[::step], memory[count - 1 :]
    return lambda: spread.tobytes() + last.tobytes()
