"""Triton kernels through Triton's real compiler for GPU architectures this machine lacks
(`kope.targets.device_compile`): a verified CUDA kernel is compiled for sm_80 and sm_90 in a
compile worker, its registers, spills and shared memory recorded with a roofline estimate;
what the interpreter runs but the compiler refuses is a compile error naming the
architecture, and never enters a kernel pack."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kope.agents import make_agent
from kope.core.task import Task
from kope.frontend.partition import partition
from kope.memory.store import ExperienceStore
from kope.targets import get_target
from kope.targets.cuda import CudaTarget
from kope.targets.device_compile import (
    ARCH_VARIABLE,
    ARCHITECTURES,
    DEFAULT_ARCHITECTURES,
    estimate_us,
    occupancy,
    parse_architectures,
    refusal,
)
from kope.targets.measure import Work
from kope.targets.triton import TritonTarget
from kope.testing import Reply, ScriptedOpenAIServer
from kope.tools.kernel_pack import export_pack
from kope.tuner.optimize import Budget, optimize_task
from kope.vocabulary.evidence import COMPILE_ERROR, TIMEOUT, VERIFIED
from kope.vocabulary.kernels import FORM_TRITON, Kernel

pytest.importorskip("triton")

# One block of a float16 16x8 @ 8x16 matmul. The interpreter multiplies any shapes; Triton's
# compiler wants a float16 tl.dot's K at least 16.
MATMUL = """\
import triton
import triton.language as tl


@triton.jit
def _mm(a, b, c, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rk = tl.arange(0, BK)
    x = tl.load(a + rm[:, None] * K + rk[None, :], mask=rk[None, :] < K, other=0.0)
    y = tl.load(b + rk[:, None] * N + rn[None, :], mask=rk[:, None] < K, other=0.0)
    tl.store(c + rm[:, None] * N + rn[None, :], tl.dot(x, y).to(tl.float16))


def launch(in0, in1, out0):
    _mm[(1,)](in0, in1, out0, M=16, N=16, K=8, BK=BK)
"""
FITS = MATMUL.replace("BK=BK", "BK=16")
# The same product in one 256x256x128 float32 tile: moments for the interpreter, minutes of
# Triton's compiler (float32 dots are FMA loops here).
HUGE = """\
import triton
import triton.language as tl


@triton.jit
def _mm(a, b, c, BLOCK: tl.constexpr, BK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    k = tl.arange(0, BK)
    rows = r[:, None] < 16
    cols = r[None, :] < 16
    x = tl.load(a + r[:, None] * 8 + k[None, :], mask=rows & (k[None, :] < 8), other=0.0)
    y = tl.load(b + k[:, None] * 16 + r[None, :], mask=(k[:, None] < 8) & cols, other=0.0)
    acc = tl.dot(x.to(tl.float32), y.to(tl.float32), input_precision="ieee")
    tl.store(c + r[:, None] * 16 + r[None, :], acc.to(tl.float16), mask=rows & cols)


def launch(in0, in1, out0):
    _mm[(1,)](in0, in1, out0, BLOCK=256, BK=128)
"""
REFUSED = MATMUL.replace("BK=BK", "BK=8")


@pytest.fixture(scope="module")
def matmul() -> Task:
    a, b = torch.randn(16, 8).half(), torch.randn(8, 16).half()
    graph = make_fx(torch.mm, tracing_mode="fake")(a, b)
    return partition(graph, get_target("cuda")).tasks[0]


@pytest.fixture(scope="module")
def cuda() -> Iterator[TritonTarget]:
    made = get_target("cuda", workers=1, timeout_s=60.0)
    assert isinstance(made, TritonTarget)
    yield made
    made.close()


def test_a_verified_kernel_is_compiled_for_each_architecture(
    matmul: Task, cuda: TritonTarget
) -> None:
    result = cuda.evaluate(matmul.spec, Kernel(FITS, FORM_TRITON), oracle=matmul.reference)
    assert result.verdict == VERIFIED, result.error
    compiled = result.device_compile
    assert compiled is not None and sorted(compiled) == sorted(DEFAULT_ARCHITECTURES)
    for arch, record in compiled.items():
        assert record["ok"] and record["error"] is None, (arch, record)
        assert 0 < record["registers"] <= 255 and record["spills"] == 0
        assert record["shared_bytes"] >= 0 and record["programs"] == 1
        assert record["num_warps"] == 4 and record["launches"] == 1
        assert record["estimate_us"] > 0  # an estimate, kept apart from any timing
    assert result.kernel is None  # nothing was timed: the interpreter runs here


def test_what_the_interpreter_runs_and_the_compiler_refuses_is_a_compile_error(
    matmul: Task, cuda: TritonTarget
) -> None:
    result = cuda.evaluate(matmul.spec, Kernel(REFUSED, FORM_TRITON), oracle=matmul.reference)
    assert result.verdict == COMPILE_ERROR
    assert result.trials >= 2  # it verified under the interpreter first
    assert "sm_80:" in result.error and "sm_90:" in result.error
    assert "K >= 16" in result.error and "tl.dot" in result.error
    assert result.device_compile is not None
    assert not any(r["ok"] for r in result.device_compile.values())


def test_the_ascend_target_compiles_nothing_it_cannot(matmul: Task) -> None:
    """triton-ascend's compiler needs Ascend's toolkit: the target says so by compiling
    nothing, and keeps its interpreter checks."""
    ascend = get_target("ascend", workers=1, timeout_s=60.0)
    assert isinstance(ascend, TritonTarget)
    try:
        assert ascend.architectures == ()
        result = ascend.evaluate(matmul.spec, Kernel(FITS, FORM_TRITON), oracle=matmul.reference)
    finally:
        ascend.close()
    assert result.verdict == VERIFIED and result.device_compile is None


def test_architectures_are_named_as_users_write_them(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_architectures("sm_90, 80,sm86") == ("sm_90", "sm_80", "sm_86")
    assert parse_architectures("none") == ()
    with pytest.raises(ValueError, match="unknown GPU architecture 'sm_99'; KOPE knows sm_75"):
        parse_architectures("sm_99")
    monkeypatch.setenv(ARCH_VARIABLE, "sm_89")
    assert CudaTarget().architectures == ("sm_89",)
    monkeypatch.setenv(ARCH_VARIABLE, "none")
    assert CudaTarget().architectures == ()
    assert CudaTarget(architectures=["sm_75"]).architectures == ("sm_75",)
    monkeypatch.setenv(ARCH_VARIABLE, "hopper")
    with pytest.raises(ValueError, match="KOPE_CUDA_ARCH='hopper': unknown GPU architecture"):
        CudaTarget()


def test_what_does_not_fit_an_architecture_is_refused_with_the_reason() -> None:
    h100 = ARCHITECTURES["sm_90"]
    fits = {"ok": True, "registers": 64, "spills": 0, "shared_bytes": 64 << 10, "num_warps": 4}
    assert refusal(fits, h100) is None
    shared = {**fits, "shared_bytes": 300 << 10}
    assert "307200 bytes of shared memory" in (refusal(shared, h100) or "")
    assert "232448" in (refusal(shared, h100) or "")
    registers = {**fits, "registers": 255, "num_warps": 16}
    assert "255 registers x 512 threads" in (refusal(registers, h100) or "")
    assert "spills 128 bytes" in (refusal({**fits, "spills": 128}, h100) or "")
    assert refusal({**fits, "num_warps": 64}, h100) == "2048 threads per block; sm_90 allows 1024"


def test_the_estimate_follows_the_kernel_s_share_of_the_gpu() -> None:
    """More programs fill more of the GPU until it is full; more work takes longer; a kernel
    that cannot run has no estimate; a part with more bandwidth is faster on memory."""
    work = Work(iterations=1 << 20, bytes=64 << 20, reduction=1)
    record = {"ok": True, "registers": 32, "spills": 0, "shared_bytes": 0, "num_warps": 4}
    a100, h100 = ARCHITECTURES["sm_80"], ARCHITECTURES["sm_90"]
    times = [estimate_us({**record, "programs": p}, h100, work, False) for p in (1, 64, 10**6)]
    assert times[0] > times[1] > times[2]
    bigger = Work(iterations=1 << 20, bytes=128 << 20, reduction=1)
    assert estimate_us({**record, "programs": 10**6}, h100, bigger, False) > times[2]
    assert estimate_us({**record, "programs": 10**6}, a100, work, False) > times[2]
    assert estimate_us({**record, "ok": False}, h100, work, False) is None
    assert occupancy(record, h100) == 1.0
    assert occupancy({**record, "shared_bytes": 200 << 10}, h100) == 4 / 64


def test_only_kernels_that_compile_enter_a_pack(
    matmul: Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two kernels verified where nothing was compiled (as an older KOPE recorded them): the
    export compiles them now, keeps the one that compiles, names why the other stays out,
    and every kernel entry of the manifest carries its compile records."""
    monkeypatch.setenv(ARCH_VARIABLE, "none")
    target = get_target("cuda", workers=1, timeout_s=60.0)
    store = ExperienceStore(tmp_path / "store")
    answers = [Reply(content=f"```python\n{k}```\n") for k in (REFUSED, FITS)]
    with ScriptedOpenAIServer(answers) as server:
        agent = make_agent("llm", base_url=server.base_url, model="scripted", max_retries=0)
        optimize_task(matmul, target, store, agent, Budget(attempts=2))
        agent.close()
    target.close()
    attempts = [a for a in store.attempts(matmul.key) if a.source == "agent"]
    assert [a.verdict for a in attempts] == [VERIFIED, VERIFIED]
    assert all(a.device_compile is None for a in attempts)

    monkeypatch.delenv(ARCH_VARIABLE)
    summary = export_pack(store, "cuda", tmp_path / "pack")
    assert (summary.tasks, summary.kernels) == (1, 1)
    assert len(summary.skipped) == 1 and "K >= 16" in summary.skipped[0][1]
    manifest = json.loads((tmp_path / "pack" / "manifest.json").read_text())
    assert manifest["architectures"] == list(DEFAULT_ARCHITECTURES)
    (entry,) = manifest["kernels"]
    assert entry["attempt"] == attempts[1].id
    assert all(entry["device_compile"][a]["ok"] for a in DEFAULT_ARCHITECTURES)


def test_memory_show_names_each_architecture_s_resources_and_refusals() -> None:
    from kope.memory.cli import _line
    from kope.memory.schema import AttemptRecord

    compiled = {
        "sm_80": {"ok": True, "registers": 40, "spills": 0, "shared_bytes": 6144},
        "sm_90": {"ok": False, "registers": None, "spills": None, "shared_bytes": None},
    }
    compiled["sm_80"]["estimate_us"] = 4.25
    line = _line(AttemptRecord("t", "agent", COMPILE_ERROR, device_compile=compiled))
    assert "[sm_80 40 regs, 0 B spilled, 6144 B shared, est 4.25 us; sm_90 refused]" in line


def test_a_compiler_that_runs_past_the_limit_is_a_timeout(matmul: Task) -> None:
    """Past the target's limit the compile worker is killed and the attempt is a timeout (a
    loaded machine may be the cause, not the kernel), never a verified kernel; the next
    kernel compiles in a new worker."""
    cuda = get_target("cuda", workers=1, timeout_s=20.0)
    assert isinstance(cuda, TritonTarget)
    try:
        result = cuda.evaluate(matmul.spec, Kernel(HUGE, FORM_TRITON), oracle=matmul.reference)
        again = cuda.evaluate(matmul.spec, Kernel(FITS, FORM_TRITON), oracle=matmul.reference)
    finally:
        cuda.close()
    assert result.verdict == TIMEOUT and result.trials >= 2, result.error
    assert "the compiler ran past 20 s" in (result.error or "")
    assert again.verdict == VERIFIED, again.error
