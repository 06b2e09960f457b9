"""What the LLM agent is told it may write is what its screen lets through and the build takes.

The prompt renders the memref signature and the allowed dialects from the build's own rules,
the agent's screen asks the build's screen, and a memref kernel answered by a (scripted)
model goes all the way to a verified attempt, or to a failure contained in the worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kope.agents import make_agent
from kope.agents.screen import screen_mlir
from kope.core.task import Task
from kope.frontend.partition import partition
from kope.memory.store import ExperienceStore
from kope.targets.cpu import KERNEL_DIALECTS, BuildError, CpuTarget, lower_kernel
from kope.testing import Reply, ScriptedOpenAIServer
from kope.tuner.optimize import Budget, optimize_task
from kope.vocabulary.kernels import Kernel

KERNELS = Path(__file__).parent / "kernels"
GOOD = (KERNELS / "rowsum_memref_good.mlir").read_text()


@pytest.fixture(scope="module")
def rowsum() -> Task:
    graph = make_fx(lambda x: x.sum(1), tracing_mode="fake")(torch.randn(8, 16))
    return partition(graph, CpuTarget()).tasks[0]


@pytest.fixture(scope="module")
def target() -> Iterator[CpuTarget]:
    cpu = CpuTarget(workers=1, timeout_s=60.0)
    yield cpu
    cpu.close()


def _answer(kernel: str) -> Reply:
    return Reply(content=f"Decision: fill the rows, then reduce them\n```mlir\n{kernel}\n```\n")


def test_memref_answers_are_built_verified_and_contained(
    rowsum: Task, target: CpuTarget, tmp_path: Path
) -> None:
    with_interface = GOOD.replace(") {\n", ") attributes {llvm.emit_c_interface} {\n", 1)
    out_of_bounds = (KERNELS / "rowsum_memref_oob.mlir").read_text()
    script = [_answer(k) for k in (GOOD, with_interface, out_of_bounds)]
    store = ExperienceStore(tmp_path)
    with ScriptedOpenAIServer(script) as server:
        agent = make_agent("llm", base_url=server.base_url, model="scripted", max_retries=0)
        summary = optimize_task(rowsum, target, store, agent, Budget(attempts=3))
        agent.close()
    attempts = [a for a in store.attempts(rowsum.key) if a.source == "agent" and not a.confirms]
    verdicts = [a.verdict for a in attempts]
    assert verdicts == ["verified", "verified", "runtime_error"], [a.error for a in attempts]
    assert attempts[0].decision.startswith("fill the rows")
    assert "out-of-bounds write after output 0" in (attempts[2].error or "")
    assert summary.verified
    system = server.requests[0]["messages"][0]["content"]
    assert "func.func @kope_kernel(%in0: memref<8x16xf32>, %out0: memref<8xf32>)" in system
    assert "Only these dialects are allowed: " + ", ".join(KERNEL_DIALECTS) + "." in system


OMP = "  omp.parallel {\n    omp.terminator\n  }\n"
INDIRECT = "  %f = func.constant @helper : () -> ()\n  func.call_indirect %f() : () -> ()\n"


@pytest.mark.parametrize(
    "kernel, refused",
    [
        (GOOD, None),
        (GOOD.replace(") {\n", ") attributes {llvm.emit_c_interface} {\n", 1), None),
        (GOOD.replace("  return\n", OMP + "  return\n"), "dialect 'omp' is not allowed"),
        (
            GOOD.replace("  return\n", "  %u = llvm.mlir.undef : i32\n  return\n"),
            "dialect 'llvm' is not allowed",
        ),
        (
            "func.func @helper() {\n  return\n}\n"
            + GOOD.replace("  return\n", INDIRECT + "  return\n"),
            "an indirect call",
        ),
        ("func.func private @system(i64) -> i32\n" + GOOD, "external functions (@system)"),
    ],
)
def test_screen_and_build_refuse_the_same_kernels(
    rowsum: Task, kernel: str, refused: str | None
) -> None:
    screened = screen_mlir(kernel)
    try:
        lower_kernel(rowsum.spec, Kernel(kernel))
        built = None
    except BuildError as err:
        built = str(err)
    if refused is None:
        assert screened is None and built is None, (screened, built)
    else:
        assert screened is not None and refused in screened, screened
        assert built is not None and refused in built, built
