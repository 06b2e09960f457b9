"""What the optimization loop and selection announce, and how listeners hear it.

The loop evaluates candidates and makes choices; it does not write memory. It emits events,
and listeners act on them: the experience store's recorder (`kope.memory.recorder.Recorder`)
turns each `AttemptEvaluated` into an attempt with its edges, a progress bar counts them, a
test collects them. This is the shape of Triton's autotuner listener and TVM's measure
callbacks. Events are plain data (no tensors, no store records), so a listener in another
process or package needs nothing but this module.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kope.vocabulary.evidence import Evaluation
from kope.vocabulary.kernels import Kernel


def new_id(prefix: str) -> str:
    """A fresh stable id; random, so that processes writing at once never collide."""
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class TaskSeen:
    """An operator the loop or selection is about to work on, on one target."""

    key: str  # sha256 of the canonical IR + the target key
    op: str
    label: str
    workload: str  # sha256 of the canonical IR alone
    inputs: tuple[tuple[tuple[int, ...], str], ...]  # (shape, dtype name) per input
    outputs: tuple[tuple[tuple[int, ...], str], ...]
    target: str
    target_key: str
    eager: dict[str, Any] | None = None  # the eager call as JSON, to re-measure without a model
    payload: str = ""  # the reference lowering's text, to lower it again without a model
    strides: tuple[tuple[int, ...], ...] = ()  # per input, as the model passes it; () unknown


@dataclass(frozen=True)
class AttemptEvaluated:
    """A candidate kernel was evaluated (or refused before it ran: `evaluation` says which).

    `id` is the attempt's id wherever it is recorded; agents name earlier attempts by it
    (`parent`). A reference lowering's evaluation carries eager ATen's timing beside it, which
    is also the task's eager baseline unless `baseline` is false (a confirmation)."""

    task: str  # the task key
    source: str  # SOURCE_EAGER | SOURCE_REFERENCE | SOURCE_AGENT
    evaluation: Evaluation
    kernel: Kernel | None  # None: eager ATen itself was timed
    id: str = field(default_factory=lambda: new_id("attempt"))
    created: float = field(default_factory=time.time)
    decision: str = ""
    agent: str = ""
    model: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    config: dict[str, Any] | None = None
    parent: str | None = None  # the attempt this one refines
    transferred_from: str | None = None  # an attempt of another task whose kernel it reuses
    confirms: str | None = None  # the attempt whose figure it re-measured against eager
    baseline: bool = True


@dataclass(frozen=True)
class ChoiceMade:
    """Which kernel an operator runs, and why: at the end of its loop, or at compile."""

    task: str
    label: str
    kernel: str  # SOURCE_EAGER | SOURCE_REFERENCE | SOURCE_AGENT
    reason: str
    attempt: str | None = None  # the attempt the choice rests on
    quality: str = ""  # of the figures it rests on


Event = TaskSeen | AttemptEvaluated | ChoiceMade
Listener = Callable[[Event], None]


class Events:
    """The listeners of one run; `emit` hands each event to every one of them, in order."""

    def __init__(self, *listeners: Listener):
        self.listeners: list[Listener] = list(listeners)

    def listen(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def emit(self, event: Event) -> None:
        for listener in self.listeners:
            listener(event)
