"""The agent interface: what an agent is shown, and what it proposes.

An agent proposes one candidate kernel at a time for one operator (a Task), with the decision
it made and why. It is shown the operator's reference lowering, the target's capabilities and
kernel forms, the relevant experience retrieved from memory (ACMI), and the feedback of its
previous attempts on this operator. It never builds, runs or times anything: the loop does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kope.targets.triton_rules import TritonRules
from kope.vocabulary.kernels import FORM_MLIR
from kope.vocabulary.specs import TensorSpec


@dataclass(frozen=True)
class TaskView:
    """The operator as an agent sees it."""

    key: str
    op: str  # aten overload, e.g. aten.mm.default
    label: str
    payload: str  # the reference lowering: linalg-on-tensors func.func @main
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    target: str
    capabilities: dict[str, Any]
    kernel_forms: tuple[str, ...] = (FORM_MLIR,)  # what the target builds, preferred first
    description: str = ""  # the target's own account of its kernel forms, for prompts
    rules: TritonRules | None = None  # a Triton target's rules for its kernels (`kernel_rules`)


@dataclass(frozen=True)
class Experience:
    """One past attempt judged relevant to the current operator."""

    attempt_id: str
    task_key: str
    task_label: str
    task_op: str
    shapes: tuple[tuple[int, ...], ...]
    similarity: float  # 1 = the same operator
    decision: str
    config: dict[str, Any] | None
    verdict: str
    speedup_vs_eager: float | None
    speedup_vs_reference: float | None
    error: str | None = None
    # What its operator's cost depends on, for a learned cost model: output shapes, and the
    # loop trip counts of the op a schedule tiles and the payload's linalg op count (empty / 0
    # where its payload is not stored).
    outputs: tuple[tuple[int, ...], ...] = ()
    loop_ranges: tuple[int, ...] = ()
    linalg_ops: int = 0
    work: int = 0  # the iterations of its payload's largest linalg op (0: unknown)
    same_target: bool = True  # measured on this target and hardware (a merged store's may not)
    # Where no device timed it: a roofline estimate of its device time in microseconds from
    # its compiled resources (`kope.targets.device_compile.estimate_of`), never a timing.
    estimate_us: float | None = None


@dataclass(frozen=True)
class Feedback:
    """What happened to one of this session's attempts."""

    attempt_id: str
    decision: str
    config: dict[str, Any] | None
    verdict: str
    error: str | None
    latency_us: float | None
    eager_us: float | None
    speedup_vs_eager: float | None
    speedup_vs_reference: float | None
    source: str = ""  # the kernel text the attempt proposed (what a passive context replays)
    estimate_us: float | None = None  # a roofline estimate where untimed (see `Experience`)


@dataclass
class ProposalRequest:
    task: TaskView
    experience: list[Experience] = field(default_factory=list)
    context: str = ""  # the rendered experience (for language models)
    history: list[Feedback] = field(default_factory=list)
    attempts_left: int = 1
    seed: int = 0
    # The store's measured records of the nearest operators
    # (`kope.tuner.experience.measured_evidence`): what a learned cost model trains on, beyond
    # what ACMI packs into the context.
    evidence: list[Experience] = field(default_factory=list)


@dataclass
class Proposal:
    """A candidate kernel (its text, in `form`) and the decision behind it."""

    source: str
    decision: str
    form: str | None = None  # one of the target's kernel forms; None: the first of them
    config: dict[str, Any] | None = None
    parent: str | None = None  # the attempt this one refines
    transferred_from: str | None = None  # an attempt of another operator it reuses
    model: str = ""
    tokens_in: int = 0
    tokens_out: int = 0


@dataclass
class Rejected:
    """An answer that held no usable kernel: recorded as a failed attempt, never run."""

    reason: str
    decision: str = ""
    source: str = ""  # the refused kernel text, if the answer held one (recorded, never run)
    form: str | None = None
    model: str = ""
    tokens_in: int = 0
    tokens_out: int = 0


class Agent(ABC):
    """Proposes kernels for one operator at a time."""

    name: ClassVar[str]
    # Whether the agent takes `prior=` ("static" | "flat"): a hand-written ranking to flatten.
    has_prior: ClassVar[bool] = False

    # Why the last `propose` returned None, where the agent says (the report's stop reason).
    stop_reason: str = ""

    @abstractmethod
    def propose(self, request: ProposalRequest) -> Proposal | Rejected | None:
        """The next candidate, a rejected answer, or None to stop (nothing better to try)."""

    def close(self) -> None:  # noqa: B027 (an optional hook: most agents hold nothing)
        """Release connections and other resources."""
