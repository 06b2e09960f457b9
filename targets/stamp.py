"""Whether a tensor kept across calls still holds what it held when a result was made from it.

KOPE keeps results made from a model's weights between calls: a strided weight's contiguous
or packed copy (`kope.targets.jit`), batch norms folded into a convolution's weights
(`kope.rewrites`). PyTorch bumps a tensor's version counter on every in-place write through
it or a view of it, and a stamp compares that. Some writes bypass the counter: through
`.data` (`p.data.mul_(0.5)`, old-style weight updates and EMA code) and through memory shared
with numpy or DLPack. So a stamp of a CPU tensor also holds `SAMPLES` words of its memory
spread evenly over it, and its last, read again on every check (one C call: about 0.6 µs a
tensor on a 2-core AVX2 machine, beside 0.6 µs for the version check): a write that changes
any of them (a rescale, a refill, a loaded checkpoint) is seen.
A write through `.data` to a few elements between the samples is not; such code must bump the
version (`with torch.no_grad(): p.mul_(…)`, as optimizers and `load_state_dict` do).
"""

from __future__ import annotations

import ctypes
import functools
import operator
from collections.abc import Callable
from typing import Any

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


def _sampler(storage: torch.UntypedStorage) -> Callable[[], Any] | None:
    """A call that reads `SAMPLES` words spread over `storage`'s memory (bytes where it is
    smaller than a word)."""
    size = storage.nbytes()
    if size == 0:
        return None
    word = ctypes.c_uint64 if size >= 8 else ctypes.c_uint8
    count = size // ctypes.sizeof(word)
    memory = (word * count).from_address(storage.data_ptr())
    places = sorted({i * count // SAMPLES for i in range(SAMPLES)} | {count - 1})
    get = operator.itemgetter(*places)
    return functools.partial(get, memory)
