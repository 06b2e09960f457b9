"""bfloat16 kernels build and agree with eager (`kope-emulate-bf16` in `kope-lower-cpu`).

LLVM rounds a bf16 result with a call of compiler-rt's `__truncsfbf2`, which the JIT cannot
resolve: every bf16 reference lowering failed with "JIT-compiled module has no @kope_kernel
entry point", and a bf16 model ran wholly eagerly. The pass computes bf16 in f32, as eager
does, and rounds in integer operations.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kope.partition import partition
from kope.passes.emulate_bf16 import has_bf16
from kope.targets import verify
from kope.targets.cpu import CpuTarget, build_kernel
from kope.vocabulary.evidence import VERIFIED
from kope.vocabulary.kernels import Kernel

BF16 = torch.bfloat16


def _kernel(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> Callable[..., torch.Tensor]:
    (task,) = partition(make_fx(fn, tracing_mode="fake")(*args), CpuTarget()).tasks
    kernel = build_kernel(task.spec, Kernel(task.payload))
    return lambda *inputs: kernel(*inputs)[0]


def test_bf16_elementwise_is_bit_exact_with_eager_nan_and_inf_included() -> None:
    """Eager computes bf16 in f32 and rounds to nearest even; so does the kernel, bit for bit
    (NaN payloads aside)."""
    x = torch.randn(33, 65).to(BF16)
    y = torch.randn(33, 65).to(BF16)
    x[0, :4] = torch.tensor([math.nan, math.inf, -math.inf, -0.0])
    fn = lambda a, b: (a + b) * b / (a - 0.5 * b)  # noqa: E731
    got, want = _kernel(fn, x, y)(x, y), fn(x, y)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    same = ~torch.isnan(want)
    assert torch.equal(got[same].view(torch.int16), want[same].view(torch.int16))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, w, b: F.linear(x, w, b),
        lambda x, w, b: F.gelu(F.linear(x, w, b)),
        lambda x, w, b: (x * 2).softmax(-1),
    ],
    ids=["linear", "linear_gelu", "softmax"],
)
def test_bf16_contractions_and_math_build_and_agree_with_eager(
    fn: Callable[..., torch.Tensor],
) -> None:
    """A bf16 matmul accumulating in f32 (a named op, generalized first), bf16 math (erf,
    exp) and a row reduction."""
    args = (torch.randn(16, 64), torch.randn(32, 64) / 8, torch.randn(32))
    (task,) = partition(
        make_fx(fn, tracing_mode="fake")(*(a.to(BF16) for a in args)), CpuTarget()
    ).tasks
    kernel = build_kernel(task.spec, Kernel(task.payload))
    inputs = verify.make_inputs(task.spec.inputs, verify.Trial("random", 0))
    got = kernel(*inputs)[0]
    want = task.spec.eager(inputs)[0]
    assert got.dtype == BF16
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


@pytest.fixture(scope="module")
def cpu() -> CpuTarget:
    target = CpuTarget(workers=1, timeout_s=120)
    yield target
    target.close()


def test_bf16_reference_lowering_verifies(cpu: CpuTarget) -> None:
    graph = make_fx(lambda a: (a * a + 1).softmax(-1), tracing_mode="fake")(
        torch.randn(4, 48).to(BF16)
    )
    (task,) = partition(graph, cpu).tasks
    result = cpu.evaluate(task.spec, task.reference, measure=False, seed=0)
    assert result.verdict == VERIFIED, result.error


def test_modules_without_bf16_are_left_alone() -> None:
    from torch_mlir import ir

    context = ir.Context()
    f32 = ir.Module.parse(
        "func.func @main(%a: f32, %b: f32) -> f32 {\n"
        "  %0 = arith.maximumf %a, %b : f32\n  return %0 : f32\n}",
        context,
    )
    bf16 = ir.Module.parse(
        "func.func @main(%a: tensor<4xbf16>) -> tensor<4xbf16> {\n  return %a : tensor<4xbf16>\n}",
        context,
    )
    assert not has_bf16(f32.operation) and has_bf16(bf16.operation)
