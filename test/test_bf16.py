"""bfloat16 kernels build and agree with eager (`kope-emulate-bf16` and `kope-bf16-bits` in
`kope-lower-cpu`).

LLVM rounds a bf16 result with a call of compiler-rt's `__truncsfbf2`, which the JIT cannot
resolve: every bf16 reference lowering failed with "JIT-compiled module has no @kope_kernel
entry point", and a bf16 model ran wholly eagerly. The first pass computes bf16 in f32, as eager
does, and rounds in integer operations; the second moves bf16 values as i16 in the LLVM
dialect, since LLVM also rounds a bfloat that its vectorizers keep in a register.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import kope
from kope.agents.base import ProposalRequest
from kope.agents.heuristic import HeuristicAgent
from kope.core.task import Task
from kope.frontend.partition import partition
from kope.passes.analysis import analyze, prepare_payload
from kope.passes.emulate_bf16 import has_bf16
from kope.spaces.kernels import kernel_source
from kope.spaces.schedules import Config
from kope.targets import jit, verify
from kope.targets.cpu import CpuTarget, build_kernel
from kope.tuner.optimize import task_view
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
    inputs = verify.task_inputs(task.spec, verify.Trial("random", 0))
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


def _bf16_task(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> Task:
    graph = make_fx(fn, tracing_mode="fake")(*(a.to(BF16) for a in args))
    (task,) = partition(graph, CpuTarget()).tasks
    return task


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (256,), w, b)


def _layer_norm_task() -> Task:
    return _bf16_task(_layer_norm, torch.randn(32, 256), torch.randn(256), torch.randn(256))


@pytest.mark.parametrize("opt_level", [0, 1, 2, 3])
def test_bf16_layer_norm_builds_and_agrees_at_every_llvm_opt_level(
    opt_level: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From opt level 2 LLVM's loop vectorizer splats each row's mean, broadcast along the row,
    into a vector of bfloat, which x86 without AVX512-BF16 rounds with `__truncsfbf2`: the
    layer norm's reference lowering built at levels 0 and 1 only, and the target builds at 3."""
    monkeypatch.setattr(jit, "OPT_LEVEL", opt_level)
    task = _layer_norm_task()
    kernel = build_kernel(task.spec, Kernel(task.payload))
    inputs = verify.task_inputs(task.spec, verify.Trial("random", 0))
    comparison = verify.compare(kernel(*inputs)[0], task.spec.eager(inputs)[0], reduction=256)
    assert comparison.ok, comparison.message


def test_bf16_layer_norm_reference_and_first_proposal_verify(cpu: CpuTarget) -> None:
    task = _layer_norm_task()
    reference = cpu.evaluate(task.spec, task.reference, measure=False, seed=0)
    assert reference.verdict == VERIFIED, reference.error
    proposal = HeuristicAgent(seed=0).propose(ProposalRequest(task_view(task, cpu)))
    assert proposal is not None and proposal.config["family"] == "rows", proposal
    result = cpu.evaluate(
        task.spec, Kernel(proposal.source), oracle=Kernel(task.payload), measure=False
    )
    assert result.verdict == VERIFIED, f"{proposal.config}: {result.error}"


def _linear_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.linear(x, w, b))


#: Threaded contraction schedules that failed to build in bf16: GELU's exact erf (bf16 has no
#: polynomial form), unrolled to libm calls after the vector lowering had run ("LLVM
#: Translation failed for operation: omp.wsloop"), and a register tile of 6 rows, which pads
#: the 64 rows (a bfloat held in a register again: `__truncsfbf2`).
Case = tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...], Config]
THREADED_CONTRACTIONS: dict[str, Case] = {
    "linear_gelu": (
        _linear_gelu,
        (torch.randn(64, 128), torch.randn(96, 128) / 8, torch.randn(96)),
        {"family": "contraction", "threads": 2, "cache": [64, 128, 256], "register": [8, 32, 1],
         "approximate_math": True},
    ),
    "mm_padded_rows": (
        torch.mm,
        (torch.randn(64, 128), torch.randn(128, 96) / 8),
        {"family": "contraction", "threads": 2, "cache": [64, 128, 256], "register": [6, 32, 1]},
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(THREADED_CONTRACTIONS))
def test_threaded_bf16_contraction_schedules_verify(name: str, cpu: CpuTarget) -> None:
    fn, args, config = THREADED_CONTRACTIONS[name]
    task = _bf16_task(fn, *args)
    payload = prepare_payload(task.payload, approximate_math=config.get("approximate_math", False))
    source = kernel_source(payload, analyze(payload), config)
    assert "tile_using_forall" in source  # threads: an scf.forall on OpenMP
    result = cpu.evaluate(task.spec, Kernel(source), oracle=Kernel(task.payload), measure=False)
    assert result.verdict == VERIFIED, result.error


def test_a_bf16_product_before_a_float32_add_is_judged_at_bf16_precision() -> None:
    """Under autocast a residual linear is a bfloat16 addmm whose result a float32 add reads:
    one fused Task with a float32 output. Eager rounds the product to bfloat16 and the kernel
    keeps it in float32; judged at float32's tolerance, the reference lowering was a mismatch
    and the group ran eagerly."""

    class Residual(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(64, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.linear(x)

    torch.manual_seed(0)
    model, x = Residual().eval(), torch.randn(32, 64)
    kope.reset_report()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        compiled = torch.compile(model, backend="kope", options={"kernels": "reference"})
        # At bfloat16's tolerance: the product was not rounded on its way to the sum.
        torch.testing.assert_close(compiled(x), model(x), rtol=2e-2, atol=2e-2)
    ran = {t.label: t.kernel for g in kope.report().graphs for t in g.tasks}
    assert any("addmm" in label for label in ran), ran
    assert all(kernel == "reference" for kernel in ran.values()), ran
