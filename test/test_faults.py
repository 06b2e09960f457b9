"""Planted faulty candidates: each is a recorded failure; the compiler and the store carry on.

The kernels in `kernels/` are written as the LLM prompt asks (`@kope_kernel` on memrefs, no
attributes), and each test checks the verdict *and* the evidence that the kernel ran in the
worker (the phase of the failure, the trials run): a kernel refused at build must not pass
for one that was contained.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kope.frontend.partition import partition
from kope.memory.recorder import Recorder
from kope.memory.standing import winner
from kope.memory.store import ExperienceStore
from kope.targets.cpu import CpuTarget
from kope.vocabulary.events import AttemptEvaluated
from kope.vocabulary.evidence import SOURCE_AGENT
from kope.vocabulary.kernels import Kernel
from kope.vocabulary.specs import InputRef, OpCall, TaskSpec, TensorSpec

KERNELS = Path(__file__).parent / "kernels"
# Long enough for a build under load, short enough that a hang costs seconds.
HANG_TIMEOUT_S = 4.0
RELU = TaskSpec(
    "aten.relu(8x16xf32)",
    (TensorSpec((8, 16), "float32"),),
    (TensorSpec((8, 16), "float32"),),
    OpCall("aten.relu.default", (InputRef(0),)),
)


@pytest.fixture(scope="module")
def target():
    cpu = CpuTarget(workers=1, timeout_s=10.0)
    yield cpu
    cpu.close()


def kernel(name: str) -> Kernel:
    return Kernel((KERNELS / name).read_text())


def test_good_kernel_verifies(target: CpuTarget) -> None:
    result = target.evaluate(RELU, kernel("relu_good.mlir"))
    assert result.verdict == "verified", result.error
    assert result.trials >= 1
    assert result.kernel is not None and result.eager is not None
    assert result.eager.threads == torch.get_num_threads() and result.kernel.threads == 1


def test_segfault_is_a_runtime_error(target: CpuTarget) -> None:
    result = target.evaluate(RELU, kernel("relu_segfault.mlir"))
    assert result.verdict == "runtime_error", result.error
    assert "SIGSEGV" in result.error and "crashed during verify" in result.error


def test_hang_is_a_timeout(target: CpuTarget) -> None:
    hang = CpuTarget(workers=1, timeout_s=HANG_TIMEOUT_S)
    try:
        result = hang.evaluate(RELU, kernel("relu_hang.mlir"))
    finally:
        hang.close()
    assert result.verdict == "timeout", result.error
    assert f"timed out during verify: no answer within {HANG_TIMEOUT_S:g} s" in result.error


def test_silent_out_of_bounds_write_is_caught(target: CpuTarget) -> None:
    result = target.evaluate(RELU, kernel("relu_oob_write.mlir"))
    assert result.verdict == "runtime_error", result.error
    assert "out-of-bounds write after output 0" in result.error and result.trials == 1


def test_write_into_input_is_caught(target: CpuTarget) -> None:
    result = target.evaluate(RELU, kernel("relu_input_write.mlir"))
    assert result.verdict == "runtime_error", result.error
    assert "input 0" in result.error and result.trials == 1


def test_unwritten_output_is_caught(target: CpuTarget) -> None:
    result = target.evaluate(RELU, kernel("relu_partial.mlir"))
    assert result.verdict == "mismatch", result.error
    assert result.trials == 1
    assert "[7, " in result.error  # the first element of the unwritten last row


def test_nan_never_passes(target: CpuTarget) -> None:
    result = target.evaluate(RELU, kernel("relu_nan.mlir"))
    assert result.verdict == "mismatch", result.error
    assert "got nan" in result.error and result.trials == 1


def test_wrong_axis_is_a_mismatch(target: CpuTarget) -> None:
    x = torch.randn(8, 16)
    right = partition(make_fx(lambda t: torch.softmax(t, -1), tracing_mode="fake")(x), target)
    wrong = partition(make_fx(lambda t: torch.softmax(t, 0), tracing_mode="fake")(x), target)
    right, wrong = right.tasks[0], wrong.tasks[0]
    assert right.key != wrong.key
    result = target.evaluate(right.spec, Kernel(wrong.payload))
    assert result.verdict == "mismatch"
    assert result.max_abs_err is not None and result.max_abs_err > 1e-3
    good = target.evaluate(right.spec, Kernel(right.payload))
    assert good.verdict == "verified", good.error


def test_malformed_mlir_names_line_and_column(target: CpuTarget) -> None:
    source = (
        "func.func @kope_kernel(%in: memref<8x16xf32>) {\n  %0 = arith.addf %in, %nope : f32\n}\n"
    )
    result = target.evaluate(RELU, Kernel(source))
    assert result.verdict == "compile_error"
    assert "kernel.mlir:2:" in result.error


def test_wrong_signature_is_a_compile_error(target: CpuTarget) -> None:
    source = kernel("relu_good.mlir").source.replace("8x16xf32", "8x15xf32")
    result = target.evaluate(RELU, Kernel(source))
    assert result.verdict == "compile_error"
    assert "memref<8x16xf32>" in result.error and "signature" in result.error


def test_failures_are_recorded_and_the_store_carries_on(target: CpuTarget, tmp_path: Path) -> None:
    store = ExperienceStore(tmp_path)
    from kope.memory.schema import TaskRecord

    store.add_task(TaskRecord("relu-key", "aten.relu.default", RELU.label, "w", [], [], "cpu", "t"))
    names = ["relu_segfault.mlir", "relu_oob_write.mlir", "relu_nan.mlir", "relu_good.mlir"]
    for name in names:
        evaluation = target.evaluate(RELU, kernel(name))
        Recorder(store)(AttemptEvaluated("relu-key", SOURCE_AGENT, evaluation, kernel(name)))
    reopened = ExperienceStore(tmp_path)
    verdicts = [a.verdict for a in reopened.attempts("relu-key") if a.source == SOURCE_AGENT]
    assert verdicts == ["runtime_error", "runtime_error", "mismatch", "verified"]
    good = reopened.attempts("relu-key")[-1]
    assert good.verdict == "verified" and reopened.get_artifact(good.artifact) is not None
    assert reopened.get_artifact(reopened.attempts("relu-key")[0].artifact) is not None
    # Unconfirmed, the good kernel is a candidate, not yet the operator's kernel: a choice
    # pins only through a clean confirmation against eager (kope.tuner.selection).
    assert winner(reopened.attempts("relu-key")).best is None
