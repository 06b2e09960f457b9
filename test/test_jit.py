"""The CPU calling convention: descriptors for every rank and dtype, destinations, no copies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch_mlir import ir

from kope.frontend.partition import partition
from kope.targets.cpu import BuildError, CpuTarget, build_kernel
from kope.targets.jit import JitKernel
from kope.targets.stamp import Stamp
from kope.vocabulary.kernels import Kernel

KERNELS = Path(__file__).parent / "kernels"


def _task(fn, *args):
    tasks = partition(make_fx(fn, tracing_mode="fake")(*args), CpuTarget()).tasks
    assert len(tasks) == 1, "each case must be a single operator"
    return tasks[0]


@pytest.mark.parametrize(
    "fn, args",
    [
        (lambda x: x.sum(), (torch.randn(7, 3),)),  # rank-0 output
        (lambda x: x * 2, (torch.randn(()),)),  # rank-0 input
        (lambda x: x + 1, (torch.arange(12, dtype=torch.int64).reshape(3, 4),)),
        (lambda x: x > 0, (torch.randn(3, 5, dtype=torch.float64),)),  # bool output
        (torch.where, (torch.rand(4, 4) > 0.5, torch.randn(4, 4), torch.randn(4, 4))),  # bool input
        (lambda x: torch.max(x, 1), (torch.randn(5, 6),)),  # two outputs
        (lambda x: x.to(torch.float16), (torch.randn(8),)),
        (lambda x: torch.nn.functional.pad(x, (1, 2)), (torch.randn(3, 4),)),  # copies
        (lambda x: x[:, :0] + 1, (torch.randn(3, 4),)),  # zero elements
    ],
)
def test_kernels_match_eager(fn, args) -> None:
    task = _task(fn, *args)
    kernel = build_kernel(task.spec, Kernel(task.payload))
    got = kernel(*args)
    want = fn(*args)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w)


def test_non_contiguous_input_is_made_contiguous() -> None:
    x = torch.randn(6, 4)
    task = _task(lambda t: t * 3, x.t().contiguous())
    kernel = build_kernel(task.spec, Kernel(task.payload))
    torch.testing.assert_close(kernel(x.t())[0], x.t() * 3)


def test_a_call_outlives_the_kernel_it_was_taken_from() -> None:
    """`build(...).bind().call` keeps the engine whose code it enters: once nothing else held
    the kernel, the call entered freed code (a segfault), so it runs in a child process."""
    script = (
        "import gc, torch\n"
        "from torch.fx.experimental.proxy_tensor import make_fx\n"
        "from kope.frontend.partition import partition\n"
        "from kope.targets.cpu import CpuTarget, build_kernel\n"
        "from kope.vocabulary.kernels import Kernel\n"
        "x = torch.randn(1001)\n"
        "(task,) = partition(make_fx(torch.exp, tracing_mode='fake')(x), CpuTarget()).tasks\n"
        "call = build_kernel(task.spec, Kernel(task.payload)).bind().call\n"
        "gc.collect()\n"
        "torch.testing.assert_close(call(x)[0], torch.exp(x))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_call_with_the_wrong_number_of_tensors_says_what_the_kernel_takes() -> None:
    x, y = torch.randn(6, 4), torch.randn(6, 4)
    task = _task(torch.add, x, y)
    kernel = build_kernel(task.spec, Kernel(task.payload))
    with pytest.raises(ValueError, match="takes 2 inputs and 1 outputs, not 1 and 1"):
        kernel(x)


def test_no_memref_copy_runtime_call_remains() -> None:
    from kope.targets.cpu import lower_kernel

    task = _task(
        lambda x, w: torch.nn.functional.conv2d(x, w, padding=1),
        torch.randn(1, 2, 5, 5),
        torch.randn(3, 2, 3, 3),
    )
    text = str(lower_kernel(task.spec, Kernel(task.payload)))
    assert "memrefCopy" not in text


def test_build_error_is_raised_for_a_kernel_that_does_not_parse() -> None:
    task = _task(torch.relu, torch.randn(3))
    with pytest.raises(BuildError, match="kernel.mlir:1:"):
        build_kernel(task.spec, Kernel("func.func @kope_kernel(%a: memref<3xf32>) { oops }"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8, torch.int64])
@pytest.mark.parametrize("numel", [1, 3, 32, 4609])
def test_a_stamp_sees_writes_to_the_first_and_last_elements(dtype: torch.dtype, numel: int) -> None:
    """Through `.data`, where no version counter moves: the sampled memory includes the first
    and the last element whatever the size (no evenly spaced sample of 4609 elements lands on
    the last, which is read apart)."""
    t = torch.arange(numel).to(dtype)
    for index in (0, -1):
        stamp = Stamp(t)
        assert stamp.holds(t)
        t.data[index] = 5 if t[index] == 7 else 7
        assert not stamp.holds(t)


def test_packed_strided_input_follows_in_place_writes() -> None:
    """A contiguous copy of a strided weight is reused only while it is unchanged: written in
    place, through `.data` (no version bump) or as numpy's memory; an activation's is made on
    every call, whatever wrote it."""
    x = torch.nn.Parameter(torch.randn(6, 4), requires_grad=False)
    task = _task(lambda t: t * 3, x.t().contiguous())
    kernel = build_kernel(task.spec, Kernel(task.payload))
    torch.testing.assert_close(kernel(x.t())[0], x.t() * 3)
    torch.testing.assert_close(kernel(x.t())[0], x.t() * 3)  # reused copy
    x.add_(1.0)  # an in-place write bumps the version counter
    torch.testing.assert_close(kernel(x.t())[0], x.t() * 3)
    x.data.mul_(0.5)  # a write through .data does not
    torch.testing.assert_close(kernel(x.t())[0], x.t() * 3)
    y = torch.randn(6, 4)
    torch.testing.assert_close(kernel(y.t())[0], y.t() * 3)
    staging = np.random.default_rng(0).random((6, 4), dtype=np.float32)
    z = torch.from_numpy(staging)
    torch.testing.assert_close(kernel(z.t())[0], z.t() * 3)
    staging[:] = 7.0  # a new batch written by numpy: no version counter sees it
    torch.testing.assert_close(kernel(z.t())[0], z.t() * 3)


def test_two_sites_of_one_kernel_keep_their_own_packed_weight(monkeypatch) -> None:
    """Two call sites of one kernel (a SwiGLU's gate and up projections) each pack their
    strided weight once, instead of evicting each other's copy on every call."""
    task = _task(lambda t: t * 3, torch.randn(4, 6))
    kernel = build_kernel(task.spec, Kernel(task.payload))
    gate, up = kernel.bind(), kernel.bind()
    copies = []
    contiguous = torch.Tensor.contiguous

    def counted(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        copies.append(self.shape)
        return contiguous(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "contiguous", counted)
    w_gate, w_up = (torch.nn.Parameter(torch.randn(6, 4)) for _ in range(2))
    for _ in range(3):
        torch.testing.assert_close(gate(w_gate.t())[0], w_gate.t() * 3)
        torch.testing.assert_close(up(w_up.t())[0], w_up.t() * 3)
    assert len(copies) == 2


def test_memref_kernel_needs_no_attributes_to_be_called() -> None:
    """`@kope_kernel` on memrefs as the LLM prompt describes it: no `llvm.emit_c_interface`."""
    x = torch.randn(8, 16)
    task = _task(lambda t: t.sum(1), x)
    kernel = build_kernel(task.spec, Kernel((KERNELS / "rowsum_memref_good.mlir").read_text()))
    torch.testing.assert_close(kernel(x)[0], x.sum(1))


def test_module_without_the_c_interface_says_what_is_missing() -> None:
    module = ir.Module.parse("llvm.func @kope_kernel() {\n  llvm.return\n}", ir.Context())
    with pytest.raises(RuntimeError, match="_mlir_ciface_kope_kernel.*kope-destination-abi"):
        JitKernel(module, (), ())


def test_an_entry_point_that_did_not_link_is_told_from_a_missing_one() -> None:
    """A float64-to-float16 conversion links to compiler-rt's __truncdfhf2, which the JIT
    lacks: the message said the module had no entry point and to lower it with kope-lower-cpu,
    which KOPE's own pipeline had done."""
    from kope.targets.jit import _no_entry_point

    assert "lower it with kope-lower-cpu" in _no_entry_point("llvm.func @other()")
    linked = (
        "llvm.func @_mlir_ciface_kope_kernel(%arg0: !llvm.ptr) {\n"
        "  %1 = llvm.fptrunc %0 : vector<8xf64> to vector<8xf16>\n"
    )
    message = _no_entry_point(linked)
    assert message.startswith("JIT linking failed") and "__truncdfhf2" in message
