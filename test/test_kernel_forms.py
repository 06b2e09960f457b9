"""Every kernel form the LLM prompt offers builds and runs in the worker, the faulty ones too.

The forms: the payload `@main` on tensors (alone, or with a transform schedule beside it), and
`@kope_kernel` on memrefs (inputs, then one destination per output). For each, a correct row
sum verifies against the reference lowering through the real worker, and a faulty one is
contained there: the verdict and the phase in its error show that it was built and run, not
refused at build.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kope.frontend.partition import partition
from kope.targets.cpu import CpuTarget
from kope.vocabulary.kernels import Kernel
from kope.vocabulary.specs import TaskSpec

KERNELS = Path(__file__).parent / "kernels"
# Long enough for a build under load, short enough that a hang costs seconds.
HANG_TIMEOUT_S = 4.0


@pytest.fixture(scope="module")
def rowsum() -> tuple[TaskSpec, Kernel]:
    """The row sum of an 8x16 matrix: its spec and its reference lowering (the oracle)."""
    graph = make_fx(lambda x: x.sum(1), tracing_mode="fake")(torch.randn(8, 16))
    task = partition(graph, CpuTarget()).tasks[0]
    return task.spec, Kernel(task.payload)


@pytest.fixture(scope="module")
def target() -> Iterator[CpuTarget]:
    cpu = CpuTarget(workers=1, timeout_s=60.0)
    yield cpu
    cpu.close()


def source(name: str) -> str:
    return (KERNELS / name).read_text()


def _memref_good(spelling: str) -> str:
    text = source("rowsum_memref_good.mlir")
    head = "func.func @kope_kernel("
    if spelling == "with its C interface already":
        return text.replace(") {\n", ") attributes {llvm.emit_c_interface} {\n", 1)
    if spelling == "private":
        return text.replace(head, "func.func private @kope_kernel(")
    return text


@pytest.mark.parametrize(
    "spelling", ["as the prompt asks", "with its C interface already", "private"]
)
def test_memref_form_verifies(rowsum, target: CpuTarget, spelling: str) -> None:
    spec, reference = rowsum
    result = target.evaluate(spec, Kernel(_memref_good(spelling)), oracle=reference)
    assert result.verdict == "verified", result.error
    assert result.oracle == "reference lowering" and result.trials >= 1
    assert result.kernel is not None  # verified, then timed: it ran many times


def test_memref_form_with_tensor_code_inside_verifies(rowsum, target: CpuTarget) -> None:
    spec, reference = rowsum
    kernel = Kernel(source("rowsum_memref_tensor_good.mlir"))
    result = target.evaluate(spec, kernel, oracle=reference, measure=False)
    assert result.verdict == "verified", result.error
    assert result.trials >= 1


@pytest.mark.parametrize("name", ["payload", "rowsum_schedule_good.mlir"])
def test_payload_form_verifies(rowsum, target: CpuTarget, name: str) -> None:
    spec, reference = rowsum
    kernel = reference if name == "payload" else Kernel(source(name))
    result = target.evaluate(spec, kernel, oracle=reference, measure=False)
    assert result.verdict == "verified", result.error
    assert result.trials >= 1


def test_memref_form_wrong_value_is_a_mismatch(rowsum, target: CpuTarget) -> None:
    spec, reference = rowsum
    kernel = Kernel(source("rowsum_memref_nofill.mlir"))
    result = target.evaluate(spec, kernel, oracle=reference, measure=False)
    assert result.verdict == "mismatch", result.error
    assert result.trials == 1 and "random trial" in (result.error or "")


def test_memref_form_out_of_bounds_write_is_a_runtime_error(rowsum, target: CpuTarget) -> None:
    spec, reference = rowsum
    kernel = Kernel(source("rowsum_memref_oob.mlir"))
    result = target.evaluate(spec, kernel, oracle=reference, measure=False)
    assert result.verdict == "runtime_error", result.error
    # The canary after the destination caught it: the kernel ran in the worker.
    assert "out-of-bounds write after output 0" in (result.error or "")
    assert result.trials == 1


def test_payload_form_wrong_value_is_a_mismatch(rowsum, target: CpuTarget) -> None:
    spec, reference = rowsum
    kernel = Kernel(source("rowsum_schedule_wrong.mlir"))
    result = target.evaluate(spec, kernel, oracle=reference, measure=False)
    assert result.verdict == "mismatch", result.error
    assert result.trials == 1 and result.max_abs_err is not None and result.max_abs_err > 1


@pytest.mark.parametrize("name", ["rowsum_memref_hang.mlir", "rowsum_payload_hang.mlir"])
def test_hang_in_either_form_times_out_while_it_runs(rowsum, name: str) -> None:
    spec, reference = rowsum
    hang = CpuTarget(workers=1, timeout_s=HANG_TIMEOUT_S)
    try:
        result = hang.evaluate(spec, Kernel(source(name)), oracle=reference, measure=False)
    finally:
        hang.close()
    assert result.verdict == "timeout", result.error
    assert "during verify" in (result.error or "")


def test_memref_form_that_returns_a_result_is_refused_at_build(rowsum, target: CpuTarget) -> None:
    spec, reference = rowsum
    text = source("rowsum_memref_good.mlir")
    text = text.replace("%out: memref<8xf32>) {", "%out: memref<8xf32>) -> memref<8xf32> {")
    text = text.replace("  return\n", "  return %out : memref<8xf32>\n")
    result = target.evaluate(spec, Kernel(text), oracle=reference, measure=False)
    assert result.verdict == "compile_error"
    assert "@kope_kernel must return nothing" in (result.error or "")
