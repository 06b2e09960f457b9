"""The passes against the backend and the store: keys agree, kernels apply, models still run.

These are the must-show tests of the compiler-integration issue:
- a matmul Task made as the backend makes it, given a verified agent kernel in a store, is found
  by `kope-apply-kernels` in an IR file holding the same matmul, and the result computes mm;
- a small MLP imported whole by torch-mlir runs through
  `kope-opt --kope-outline-operators --kope-apply-kernels=... --kope-lower-cpu` and the JIT-ed
  result matches eager;
- the passes are the backend's own: its lowering is `kope-lower-cpu` (same output as kope-opt),
  and its Task keys are the outlining pass's keys.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch_mlir import fx as torch_mlir_fx
from torch_mlir import ir

from kope.core.task import Task
from kope.frontend.partition import partition
from kope.memory import AttemptRecord, ExperienceStore, TaskRecord
from kope.passes import pass_class
from kope.passes.lower_cpu import LowerCpu
from kope.passes.pipeline import parse_pipeline, run_pipeline
from kope.targets import get_target
from kope.targets.cpu import CpuTarget, lower_kernel
from kope.targets.jit import JitKernel
from kope.vocabulary.kernels import Kernel
from kope.vocabulary.specs import TensorSpec

# A tile + vectorize schedule (`transform.named_sequence @__transform_main`), as the agents
# write for CPU matmuls. The tile sizes must divide the matmul's M, N and K.
SCHEDULE = """
  transform.named_sequence @__transform_main(%root: !transform.any_op {{transform.readonly}}) {{
    %mm = transform.structured.match ops{{["linalg.matmul"]}} in %root : (!transform.any_op) -> !transform.any_op
    %tiled, %loops:3 = transform.structured.tile_using_for %mm tile_sizes [{m}, {n}, {k}] : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
    %func = transform.structured.match ops{{["func.func"]}} in %root : (!transform.any_op) -> !transform.any_op
    %v = transform.structured.vectorize_children_and_apply_patterns %func : (!transform.any_op) -> !transform.any_op
    transform.yield
  }}
"""


def mm_task(m: int, k: int, n: int) -> Task:
    """The Task the backend makes of `torch.mm` on (m, k) x (k, n) float32 inputs."""
    gm = make_fx(torch.mm, tracing_mode="fake")(torch.empty(m, k), torch.empty(k, n))
    tasks = partition(gm, get_target("cpu")).tasks
    assert len(tasks) == 1
    return tasks[0]


def scheduled_kernel(task: Task, tiles: tuple[int, int, int]) -> str:
    """An agent kernel: the Task's payload with a tiling + vectorization schedule beside it."""
    payload = ir.Module.parse(task.payload, ir.Context())
    main = str(payload.body.operations[0])
    m, n, k = tiles
    return (
        "module attributes {transform.with_named_sequence} {\n"
        + main
        + "\n"
        + SCHEDULE.format(m=m, n=n, k=k)
        + "}\n"
    )


def record_verified_agent_kernel(store: ExperienceStore, task: Task, kernel: str) -> AttemptRecord:
    """Verify `kernel` against the Task's reference lowering on the CPU target, then record it.

    Only the agent's attempt is recorded, without timings (measure=False): which kernel is
    fastest is the backend's business, and timings would make the test depend on the machine.
    """
    target = CpuTarget()
    try:
        evaluation = target.evaluate(
            task.spec, Kernel(kernel), oracle=Kernel(task.payload), measure=False
        )
    finally:
        target.close()
    assert evaluation.verified, evaluation.error
    store.add_task(
        TaskRecord(
            key=task.key,
            op=task.op,
            label=task.label,
            workload=task.workload,
            inputs=[[list(s.shape), s.dtype] for s in task.spec.inputs],
            outputs=[[list(s.shape), s.dtype] for s in task.spec.outputs],
            target="cpu",
            target_key=get_target("cpu").key(),
        )
    )
    attempt = AttemptRecord(
        task=task.key,
        source="agent",
        verdict=evaluation.verdict,
        agent="test",
        decision="tile + vectorize the matmul",
        max_abs_err=evaluation.max_abs_err,
        max_rel_err=evaluation.max_rel_err,
    )
    return store.add_attempt(attempt, artifact=kernel)


def kope_opt(*args: str) -> str:
    proc = subprocess.run(["kope-opt", *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def function(text: str, name: str) -> str:
    """The text of `func.func ... @name` up to the next top-level function."""
    pattern = rf"^  func\.func (private )?@{name}\(.*?(?=^  func\.func |\Z)"
    match = re.search(pattern, text, re.DOTALL | re.MULTILINE)
    assert match, f"no @{name} in\n{text}"
    return match.group(0)


MATMUL_FILE = """\
// A 64x64 matmul as someone wrote it in an IR file.
func.func @main(%lhs: tensor<64x64xf32>, %rhs: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<64x64xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty : tensor<64x64xf32>) -> tensor<64x64xf32>
  %prod = linalg.matmul ins(%lhs, %rhs : tensor<64x64xf32>, tensor<64x64xf32>)
                        outs(%acc : tensor<64x64xf32>) -> tensor<64x64xf32>
  return %prod : tensor<64x64xf32>
}
"""


def test_apply_kernels_finds_the_kernel_recorded_for_the_backends_matmul_task(
    tmp_path: Path,
) -> None:
    task = mm_task(64, 64, 64)
    store = ExperienceStore(tmp_path / "store")
    kernel = scheduled_kernel(task, (8, 32, 4))
    attempt = record_verified_agent_kernel(store, task, kernel)
    source = tmp_path / "matmul.mlir"
    source.write_text(MATMUL_FILE)

    store_flag = f"--kope-apply-kernels=store={tmp_path / 'store'} target=cpu"
    annotate_flag = f"--kope-annotate-experience=store={tmp_path / 'store'}"
    out = kope_opt("--kope-outline-operators", annotate_flag, store_flag, str(source))
    op = function(out, "kope_op_0")
    assert f'kope.key = "{task.key}"' in op  # the same key, from an IR file
    assert "attempts = 1 : i64" in op and 'winner = "agent"' in op
    assert 'kope.kernel = "agent"' in op and f'kope.attempt = "{attempt.id}"' in op
    assert f'kope.artifact = "{hashlib.sha256(kernel.encode()).hexdigest()}"' in op
    assert "linalg.matmul ins" not in op and "vector.contract" in op and op.count("scf.for") == 3

    # The replaced operator still computes the matmul once lowered and JIT-compiled.
    lowered = kope_opt("--kope-outline-operators", store_flag, "--kope-lower-cpu", str(source))
    jit = JitKernel(ir.Module.parse(lowered, ir.Context()), task.spec.inputs, task.spec.outputs)
    lhs, rhs = torch.randn(64, 64), torch.randn(64, 64)
    torch.testing.assert_close(jit(lhs, rhs)[0], torch.mm(lhs, rhs), rtol=1e-4, atol=1e-4)


def test_whole_mlp_runs_through_outline_apply_kernels_and_lower_cpu(tmp_path: Path) -> None:
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)
    ).eval()
    x = torch.randn(8, 64)
    imported = torch_mlir_fx.export_and_import(model, x, output_type="linalg-on-tensors")
    source = tmp_path / "mlp.mlir"
    source.write_text(str(imported))

    # Kernels for the MLP's two matmuls, recorded under the keys of the backend's mm Tasks.
    store = ExperienceStore(tmp_path / "store")
    recorded = []
    for (m, k, n), tiles in [((8, 64, 64), (8, 32, 4)), ((8, 64, 32), (4, 16, 8))]:
        task = mm_task(m, k, n)
        recorded.append(record_verified_agent_kernel(store, task, scheduled_kernel(task, tiles)).id)

    apply_flag = f"--kope-apply-kernels=store={tmp_path / 'store'} target=cpu"
    passes = ["--kope-outline-operators", apply_flag]
    applied = kope_opt(*passes, str(source))
    attempts = re.findall(r'kope\.attempt = "([^"]+)"', applied)
    assert sorted(attempts) == sorted(recorded)
    assert "linalg.matmul ins" not in applied and applied.count("vector.contract") == 2

    output = tmp_path / "mlp.llvm.mlir"
    kope_opt(*passes, "--kope-lower-cpu", str(source), "-o", str(output))
    module = ir.Module.parse(output.read_text(), ir.Context())
    jit = JitKernel(module, [TensorSpec.of(x)], [TensorSpec((8, 32), "float32")])
    with torch.no_grad():
        for inputs in (x, torch.randn(8, 64)):
            torch.testing.assert_close(jit(inputs)[0], model(inputs), rtol=1e-4, atol=1e-5)


def test_backend_lowering_is_kope_lower_cpu(tmp_path: Path) -> None:
    """The CPU target lowers through the registered kope-lower-cpu: same IR as kope-opt's."""
    assert pass_class("kope-lower-cpu") is LowerCpu
    task = mm_task(8, 16, 4)
    for text in (task.payload, scheduled_kernel(task, (4, 4, 8))):
        source = tmp_path / "kernel.mlir"
        source.write_text(text)
        backend = str(lower_kernel(task.spec, Kernel(text)))
        assert backend == kope_opt("--kope-lower-cpu", str(source))


def _amax(x: torch.Tensor) -> torch.Tensor:
    return x.amax(-1)


@pytest.mark.parametrize(
    "fn, shapes",
    [
        (torch.mm, [(8, 16), (16, 4)]),
        (torch.bmm, [(2, 8, 16), (2, 16, 4)]),
        (torch.add, [(8, 16), (8, 16)]),
        (torch.relu, [(8, 16)]),
        (torch.exp, [(8, 16)]),
        (torch.nn.functional.gelu, [(8, 16)]),  # several constants: their order differs
        (_amax, [(8, 16)]),  # a two-result op whose second result is unused
    ],
    ids=["mm", "bmm", "add", "relu", "exp", "gelu", "amax"],
)
def test_task_key_is_the_outlined_key(fn: object, shapes: list[tuple[int, ...]]) -> None:
    """Outlining a Task's own payload (one linalg operator) gives back the Task's key."""
    gm = make_fx(fn, tracing_mode="fake")(*[torch.empty(s) for s in shapes])
    task = partition(gm, get_target("cpu")).tasks[0]
    module = ir.Module.parse(task.payload, ir.Context())
    run_pipeline(module, parse_pipeline("kope-outline-operators"), description="outline a payload")
    keys = [
        ir.StringAttr(op.attributes["kope.key"]).value
        for op in module.body.operations
        if "kope.key" in op.attributes
    ]
    assert keys == [task.key]
