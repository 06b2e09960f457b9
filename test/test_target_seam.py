"""A target defined here alone runs KOPE's whole loop: the seam the cuda and ascend targets use.

`torchfn` builds kernels written as Python functions over torch tensors (a kernel form of its
own) and takes float32 tensors only. With an agent that writes such kernels, both registered
through the same registry a third-party package's entry points feed, `torch.compile(...,
backend="kope")` partitions for it (an int64 operator stays eager, with the target's reason),
proposes, builds in an isolated worker, verifies against eager (this target cannot run the
reference lowering), times, records, chooses and dispatches, with nothing outside this file
knowing it exists.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo
from torch.fx.experimental.proxy_tensor import make_fx

import kope
from kope.agents.base import Agent, Proposal, ProposalRequest
from kope.frontend.partition import partition
from kope.frontend.whole_graph import GRAPH_OP
from kope.memory.recorder import Recorder
from kope.memory.standing import winner
from kope.memory.store import ExperienceStore
from kope.targets.base import BuildError, Target
from kope.tuner.optimize import Budget, optimize_task
from kope.vocabulary.events import AttemptEvaluated, ChoiceMade, Event, Events, TaskSeen
from kope.vocabulary.evidence import MISMATCH, RUNTIME_ERROR, SOURCE_AGENT, SOURCE_EAGER, VERIFIED
from kope.vocabulary.kernels import Kernel
from kope.vocabulary.registry import AGENTS, TARGETS
from kope.vocabulary.specs import TaskSpec

FORM = "torch-function"  # Python source defining `kernel(*inputs) -> tuple of tensors`
HERE = Path(__file__).resolve().parent


class TorchFunctionKernel:
    """A built `torch-function` kernel: calls the function, copies into the destinations."""

    def __init__(self, fn: Callable[..., Sequence[torch.Tensor]]):
        self.fn = fn

    def run(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        for out, value in zip(outputs, self.fn(*inputs), strict=True):
            out.copy_(value)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.fn(*inputs))


class TorchFunctionTarget(Target):
    """Kernels as Python functions of torch tensors, on the host, float32 only."""

    name = "torchfn"
    kernel_forms = (FORM,)
    dtypes = frozenset({"float32"})

    def key(self) -> str:
        return f"torchfn|{platform.machine()}|{os.cpu_count()}cores|torch-{torch.__version__}"

    @classmethod
    def build(cls, task: TaskSpec, kernel: Kernel) -> TorchFunctionKernel:
        namespace: dict[str, Any] = {"torch": torch}
        try:
            exec(compile(kernel.source, "<kernel>", "exec"), namespace)  # test code only
        except SyntaxError as err:
            raise BuildError(f"kernel is not Python: {err}") from None
        if not callable(namespace.get("kernel")):
            raise BuildError("the source defines no `kernel` function")
        return TorchFunctionKernel(namespace["kernel"])

    def describe(self, task: TaskSpec | None = None) -> str:
        return "Answer with a ```python block defining `kernel(*inputs)` returning a tuple."


SOFTMAX_WRONG_AXIS = "def kernel(x):\n    return (torch.softmax(x, 0),)\n"
SOFTMAX_RAISES = "def kernel(x):\n    raise RuntimeError('unfinished kernel')\n"
SOFTMAX_BY_HAND = (
    "def kernel(x):\n"
    "    e = torch.exp(x - x.amax(-1, keepdim=True))\n"
    "    return (e / e.sum(-1, keepdim=True),)\n"
)


class TorchFunctionAgent(Agent):
    """Writes `torch-function` kernels for softmax: a wrong one, a crashing one, a right one."""

    name = "torchfn-agent"
    SCRIPT = (SOFTMAX_WRONG_AXIS, SOFTMAX_RAISES, SOFTMAX_BY_HAND)

    def __init__(self, **config: Any):
        self.config = config

    def propose(self, request: ProposalRequest) -> Proposal | None:
        task = request.task
        if FORM not in task.kernel_forms or task.op != "aten._softmax.default":
            return None
        index = len(request.history)
        if index >= len(self.SCRIPT):
            return None
        parent = request.history[-1].attempt_id if request.history else None
        return Proposal(self.SCRIPT[index], f"script step {index}", form=FORM, parent=parent)


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.softmax(x, -1), n * 3


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The target and agent registered as a package's entry points would be; workers find
    this module on PYTHONPATH as they would find an installed package."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    TARGETS.add(TorchFunctionTarget.name, TorchFunctionTarget)
    AGENTS.add(TorchFunctionAgent.name, TorchFunctionAgent)
    yield
    TARGETS.remove(TorchFunctionTarget.name)
    AGENTS.remove(TorchFunctionAgent.name)


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(64, 256, generator=gen), torch.arange(12).reshape(3, 4)


def test_a_target_and_agent_of_this_file_run_the_whole_loop(
    registered: None, tmp_path: Path
) -> None:
    torch._dynamo.reset()
    kope.reset_report()
    options = {
        "target": "torchfn",
        "agent": "torchfn-agent",
        "optimize": True,
        "budget": 4,
        "store": str(tmp_path / "store"),
    }
    kope.check_options(options)  # both names are known to the registry
    model = Model()
    compiled = torch.compile(model, backend="kope", options=options)
    x, n = inputs()
    got, want = compiled(x, n), model(x, n)
    torch.testing.assert_close(got[0], want[0])
    assert torch.equal(got[1], want[1])

    # Partitioning asked the target: the int64 multiply runs eagerly, with its reason.
    (graph,) = kope.report().graphs
    (eager,) = [e for e in graph.eager if e.compute]
    assert "int64" in eager.reason and "torchfn kernels do not support" in eager.reason

    # The loop proposed, built, verified (against eager: no reference lowering here) and timed.
    store = ExperienceStore(tmp_path / "store")
    (task,) = [t for t in store.tasks() if t.op != GRAPH_OP]  # the graph's decision is one too
    assert task.target == "torchfn" and task.target_key.startswith("torchfn|")
    attempts = store.attempts(task.key)
    baseline = [a for a in attempts if a.source == SOURCE_EAGER]
    assert (
        baseline
        and baseline[0].latency_us
        and "does not run the reference" in (baseline[0].decision)
    )
    proposals = [a for a in attempts if a.source == SOURCE_AGENT and a.confirms is None]
    assert [a.verdict for a in proposals] == [MISMATCH, RUNTIME_ERROR, VERIFIED]
    assert "unfinished kernel" in (proposals[1].error or "")
    right = proposals[2]
    assert right.form == FORM and right.latency_us and right.speedup_vs_eager
    assert right.parent == proposals[1].id  # the agent's decision order, recorded as edges
    assert store.get_artifact(right.artifact or "") == SOFTMAX_BY_HAND

    # The choice follows the store's one rule, and dispatch ran what it chose.
    (chosen,) = graph.tasks
    standing = winner(store.attempts(task.key), torch.get_num_threads())
    assert chosen.kernel == (standing.pinned.source if standing.pinned else SOURCE_EAGER)


def test_the_loop_announces_what_it_does_and_the_store_is_one_listener(
    registered: None, tmp_path: Path
) -> None:
    target = TorchFunctionTarget(timeout_s=60)
    try:
        x, _ = inputs()
        (task,) = partition(make_fx(lambda t: torch.softmax(t, -1))(x), target).tasks
        store = ExperienceStore(tmp_path / "store")
        heard: list[Event] = []
        events = Events(Recorder(store), heard.append)
        summary = optimize_task(task, target, store, TorchFunctionAgent(), Budget(4), events=events)
        assert isinstance(heard[0], TaskSeen) and heard[0].target == "torchfn"
        assert isinstance(heard[-1], ChoiceMade) and heard[-1].kernel == summary.winner
        evaluated = [e for e in heard if isinstance(e, AttemptEvaluated)]
        assert [e.evaluation.verdict for e in evaluated if e.source == SOURCE_AGENT][:3] == [
            MISMATCH,
            RUNTIME_ERROR,
            VERIFIED,
        ]
        # Everything heard was recorded, under the ids the events carry; nothing else was.
        recorded = {a.id for a in store.attempts(task.key)}
        assert {e.id for e in evaluated} <= recorded
        assert len(recorded) == len(evaluated)

        # The verified kernel loads into this process and computes softmax.
        kernel = target.load(task.spec, Kernel(SOFTMAX_BY_HAND, FORM))
        torch.testing.assert_close(kernel(x)[0], torch.softmax(x, -1))
    finally:
        target.close()


def test_a_kernel_in_a_form_the_target_does_not_build_is_refused_before_any_worker(
    registered: None,
) -> None:
    target = TorchFunctionTarget()
    x, _ = inputs()
    (task,) = partition(make_fx(lambda t: torch.softmax(t, -1))(x), target).tasks
    result = target.evaluate(task.spec, task.reference)
    assert result.verdict == "compile_error"
    assert "builds torch-function kernels, not mlir" in (result.error or "")
    assert target._pool is None  # no worker was started for it
