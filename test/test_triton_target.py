"""The Triton targets (`cuda`, `ascend`) on a machine without their devices: kernels are
screened by an allow-list, built in the isolated worker, run under Triton's interpreter and
verified against the reference lowering; nothing is timed, and every failure is recorded.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kope.agents import make_agent
from kope.core.errors import KopeError
from kope.core.task import Task
from kope.frontend.partition import partition
from kope.memory.export import export
from kope.memory.store import ExperienceStore
from kope.targets import get_target, target_names
from kope.targets.triton import TritonTarget
from kope.targets.triton_sandbox import screen_triton
from kope.targets.worker import worker_environment
from kope.testing import Reply, ScriptedOpenAIServer
from kope.tuner.optimize import Budget, optimize_task
from kope.vocabulary.evidence import COMPILE_ERROR, MISMATCH, RUNTIME_ERROR, TIMEOUT, VERIFIED
from kope.vocabulary.kernels import FORM_TRITON, Kernel

pytest.importorskip("triton")

TRITON_TARGETS = ("cuda", "ascend")

SOFTMAX = """\
import triton
import triton.language as tl


@triton.jit
def _softmax(x, o, COLS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < COLS
    v = tl.load(x + row * COLS + cols, mask=m, other=float("-inf"))
    v = v - tl.max(v, axis=0)
    e = tl.exp(v)
    tl.store(o + row * COLS + cols, e / tl.sum(e, axis=0), mask=m)


def launch(in0, out0):
    rows, cols = in0.shape
    _softmax[(rows,)](in0, out0, COLS=cols, BLOCK=triton.next_power_of_2(cols))
"""
# Normalizes each column instead of each row: runs, and is wrong.
WRONG_AXIS = """\
import triton
import triton.language as tl


@triton.jit
def _softmax(x, o, ROWS: tl.constexpr, COLS: tl.constexpr, BLOCK: tl.constexpr):
    col = tl.program_id(0)
    rows = tl.arange(0, BLOCK)
    m = rows < ROWS
    v = tl.load(x + rows * COLS + col, mask=m, other=float("-inf"))
    e = tl.exp(v - tl.max(v, axis=0))
    tl.store(o + rows * COLS + col, e / tl.sum(e, axis=0), mask=m)


def launch(in0, out0):
    rows, cols = in0.shape
    _softmax[(cols,)](in0, out0, ROWS=rows, COLS=cols, BLOCK=triton.next_power_of_2(rows))
"""
NEAR_OUT_OF_BOUNDS = SOFTMAX.replace(
    "tl.store(o + row * COLS + cols,", "tl.store(o + row * COLS + cols + 4,"
)
FAR_OUT_OF_BOUNDS = SOFTMAX.replace(
    "tl.store(o + row * COLS + cols,", "tl.store(o + (1 << 40) + cols,"
)
HANG = SOFTMAX.replace(
    "    rows, cols = in0.shape\n",
    "    rows, cols = in0.shape\n    while True:\n        rows = rows + 0\n",
)
HOSTILE = SOFTMAX.replace(
    "    rows, cols = in0.shape\n",
    "    rows, cols = __builtins__['__import__']('os').system('true')\n",
)


@pytest.fixture(scope="module")
def softmax() -> Task:
    graph = make_fx(lambda x: torch.softmax(x, -1), tracing_mode="fake")(torch.randn(8, 37))
    return partition(graph, get_target("cuda")).tasks[0]


@pytest.fixture(scope="module", params=TRITON_TARGETS)
def target(request: pytest.FixtureRequest) -> Iterator[TritonTarget]:
    made = get_target(request.param, workers=1, timeout_s=12.0)
    assert isinstance(made, TritonTarget)
    yield made
    made.close()


def test_both_targets_are_registered_and_interpret_here() -> None:
    for name in TRITON_TARGETS:
        assert name in target_names()
        made = get_target(name)
        assert made.interpreting() and not made.timed()
        assert made.key().startswith(f"{name}|interpreter|triton-")
        assert made.kernel_forms == (FORM_TRITON,)


@pytest.mark.parametrize("name", TRITON_TARGETS)
def test_torch_compile_without_the_device_names_the_reason(name: str) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(torch.nn.Linear(4, 4), backend="kope", options={"target": name})
    with pytest.raises(Exception, match=f"target='{name}' cannot run a compiled model here") as err:
        compiled(torch.randn(2, 4))
    assert f"kope precompile --target {name}" in str(err.value)
    assert "not a known target" not in str(err.value)
    assert isinstance(err.value.__cause__ or err.value, KopeError | Exception)


def test_kernels_are_verified_against_the_reference_and_untimed(
    softmax: Task, target: TritonTarget
) -> None:
    result = target.evaluate(softmax.spec, Kernel(SOFTMAX, FORM_TRITON), oracle=softmax.reference)
    assert result.verdict == VERIFIED, result.error
    assert result.oracle == "reference lowering" and result.trials >= 2
    assert result.kernel is None and result.eager is None
    assert any("Triton's interpreter" in note for note in result.notes)


@pytest.mark.parametrize(
    "source, verdict, says",
    [
        (WRONG_AXIS, MISMATCH, "random trial"),
        (NEAR_OUT_OF_BOUNDS, RUNTIME_ERROR, "out-of-bounds write after output 0"),
        (FAR_OUT_OF_BOUNDS, RUNTIME_ERROR, "crashed during verify"),
        (HANG, TIMEOUT, "timed out"),
        (HOSTILE, COMPILE_ERROR, "kernel refused"),
    ],
    ids=["wrong-axis", "near-oob", "far-oob", "hang", "hostile"],
)
def test_bad_kernels_are_contained_failures(
    softmax: Task, target: TritonTarget, source: str, verdict: str, says: str
) -> None:
    result = target.evaluate(softmax.spec, Kernel(source, FORM_TRITON), oracle=softmax.reference)
    assert result.verdict == verdict, result.error
    assert says in (result.error or "")


def test_scripted_llm_answers_are_recorded_with_nothing_lost(
    softmax: Task, target: TritonTarget, tmp_path: Path
) -> None:
    """The LLM agent on a Triton target: its prompt is the target's, a correct kernel
    verifies, a wrong one mismatches, a hostile one is refused unrun; every answer is an
    attempt in the store, and an untimed kernel never wins."""
    answers = (SOFTMAX, WRONG_AXIS, NEAR_OUT_OF_BOUNDS, HOSTILE)
    script = [Reply(content=f"Decision: one program per row\n```python\n{a}```\n") for a in answers]
    store = ExperienceStore(tmp_path)
    with ScriptedOpenAIServer(script) as server:
        agent = make_agent("llm", base_url=server.base_url, model="scripted", max_retries=0)
        summary = optimize_task(softmax, target, store, agent, Budget(attempts=len(answers)))
        agent.close()
    attempts = [a for a in store.attempts(softmax.key) if a.source == "agent"]
    verdicts = [a.verdict for a in attempts]
    assert verdicts == [VERIFIED, MISMATCH, RUNTIME_ERROR, COMPILE_ERROR], [
        a.error for a in attempts
    ]
    assert all(a.form == FORM_TRITON for a in attempts)
    assert "`__builtins__` is not allowed" in (attempts[3].error or "")
    assert summary.verified and summary.winner == "eager" and summary.best_us is None
    system = server.requests[0]["messages"][0]["content"]
    assert "def launch(in0, out0):  # in0: 8x37xf32; out0: 8x37xf32" in system
    assert "```python" in system and "```mlir" not in system
    if target.name == "ascend":
        assert "1-D grid" in system and "num_warps" in system


@pytest.mark.parametrize(
    "source, refused",
    [
        (SOFTMAX, None),
        (
            SOFTMAX.replace("triton.next_power_of_2(cols)", "triton.testing.do_bench(0)"),
            "triton.testing",
        ),
        ("import os\n" + SOFTMAX, "imports os"),
        ("import torch\n" + SOFTMAX, "imports torch"),
        (SOFTMAX.replace("rows, cols = in0.shape", "rows, cols = in0.numpy().shape"), "`.numpy`"),
        (SOFTMAX.replace("rows, cols = in0.shape", "rows, cols = (1).__class__"), "`.__class__`"),
        (SOFTMAX.replace("tl.exp(v)", "tl.extra.cuda.libdevice.exp(v)"), "tl.extra"),
        (SOFTMAX.replace("tl.exp(v)", "tl.inline_asm_elementwise('', '', [v])"), "inline_asm"),
        (
            SOFTMAX.replace("rows, cols = in0.shape", "rows, cols = getattr(in0, 'shape')"),
            "`getattr`",
        ),
        (SOFTMAX.replace("def launch", "def run"), "no `def launch"),
        (SOFTMAX.replace("@triton.jit", "@triton.autotune([], [])"), "decorator"),
    ],
)
def test_the_screen_is_an_allow_list(source: str, refused: str | None) -> None:
    reason = screen_triton(source)
    if refused is None:
        assert reason is None
    else:
        assert reason is not None and refused in reason


def test_workers_start_without_secrets() -> None:
    env = worker_environment(
        {"PATH": "/bin", "OPENAI_API_KEY": "sk-x", "KOPE_LLM_TOKEN": "t", "KOPE_LOG": "debug"}
    )
    assert env == {"PATH": "/bin"}


class _Block(torch.nn.Module):
    """Unseen by the generator's tests: a gated MLP with a norm and a residual."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(24)
        self.up = torch.nn.Linear(24, 40)
        self.gate = torch.nn.Linear(24, 40)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return torch.nn.functional.silu(self.gate(h)) * self.up(h) + x.sum(-1, keepdim=True)


@pytest.mark.parametrize("name", TRITON_TARGETS)
def test_precompile_gives_every_operator_a_verified_triton_kernel(
    name: str, tmp_path: Path
) -> None:
    """The heuristic agent writes Triton kernels from each operator's own IR: all verify under
    the interpreter, a few per operator (nothing ranks them here), and none wins untimed."""
    from kope.tools.precompile import precompile

    made = get_target(name, workers=1, timeout_s=60.0)
    store = ExperienceStore(tmp_path)
    report = precompile(
        _Block().eval(), (torch.randn(3, 5, 24),), target=made, store=store, progress=False
    )
    made.close()
    rows = report["operators"]
    assert rows and report["summary"]["timed"] is False
    for row in rows:
        assert row["verdicts"].get("verified", 0) >= 1, row
        assert row["attempts"] <= 3 and row["winner"] == "eager", row
    attempts = [a for t in store.tasks() for a in store.attempts(t.key) if a.source == "agent"]
    assert attempts and all(a.form == FORM_TRITON and a.latency_us is None for a in attempts)
    # Each CUDA kernel went through Triton's real compiler for sm_80 and sm_90 too (the
    # record `kope memory export` carries); Ascend's compiler needs its toolkit: none ran.
    for attempt in attempts:
        if name == "ascend":
            assert attempt.device_compile is None
            continue
        assert attempt.device_compile is not None
        assert sorted(attempt.device_compile) == ["sm_80", "sm_90"]
        assert all(r["ok"] and r["registers"] > 0 for r in attempt.device_compile.values())
    if name == "cuda":  # `kope memory export`'s JSON carries them
        out = io.StringIO()
        export(store, "json", out)
        records = [n["record"] for n in json.loads(out.getvalue())["nodes"]]
        exported = [r for r in records if r.get("t") == "attempt" and r["source"] == "agent"]
        assert exported and all(r["device_compile"]["sm_90"]["ok"] for r in exported)
