"""`kope precompile`: optimize each distinct operator of a model once, offline.

The model is traced the way the backend traces it (dynamo, aot_autograd, partition), its
distinct Tasks are optimized by the agent (in parallel when several workers are given), and
everything lands in the experience store, so a later `torch.compile(backend="kope")` runs the
best verified kernels with no agent calls. Re-running resumes: an operator whose budget is
spent is not redone, and one that was interrupted continues from its recorded attempts.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
from functorch.compile import make_boxed_func
from kope.agents import make_agent
from kope.errors import ModelLoadError
from kope.memory.schema import SOURCE_AGENT
from kope.memory.store import ExperienceStore
from kope.optimize import Budget, TaskSummary, optimize_task, summarize
from kope.partition import partition
from kope.targets.base import Target
from kope.task import Task
from torch._dynamo.backends.common import aot_autograd

log = logging.getLogger("kope.precompile")


def trace_tasks(model: torch.nn.Module, inputs: Sequence[Any], target_key: str) -> list[Task]:
    """The distinct Tasks the backend would make of `model` on `inputs` (in graph order)."""
    found: dict[str, Task] = {}

    def forward_compiler(gm: fx.GraphModule, _inputs: Sequence[Any]) -> Callable[..., Any]:
        # As the backend partitions by default: fused eager fast paths stay whole.
        for task in partition(gm, target_key, fast_paths=False).tasks:
            found.setdefault(task.key, task)
        return make_boxed_func(gm.forward)

    def backend(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        return aot_autograd(fw_compiler=forward_compiler)(gm, example_inputs)

    torch._dynamo.reset()
    with torch.no_grad():
        try:
            torch.compile(model, backend=backend, dynamic=False)(*inputs)
        except Exception as err:
            raise ModelLoadError(f"tracing the model failed: {type(err).__name__}: {err}") from err
    torch._dynamo.reset()
    return list(found.values())


@dataclass
class Progress:
    """A one-line progress bar on stderr (quiet when stderr is not a terminal)."""

    total_tasks: int
    budget: int
    stream: Any = sys.stderr
    done: int = 0
    lines: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def update(self, label: str, text: str) -> None:
        with self.lock:
            self.lines[label] = text
            self._draw()

    def finish(self, label: str, text: str) -> None:
        with self.lock:
            self.done += 1
            self.lines.pop(label, None)
            width = 30
            filled = int(width * self.done / max(self.total_tasks, 1))
            bar = "#" * filled + "-" * (width - filled)
            self.stream.write(
                f"\r\033[K[{bar}] {self.done}/{self.total_tasks} {label[:60]}: {text}\n"
            )
            self.stream.flush()

    def _draw(self) -> None:
        if not getattr(self.stream, "isatty", lambda: False)():
            return
        current = "; ".join(f"{k[:40]} {v}" for k, v in list(self.lines.items())[:2])
        self.stream.write(f"\r\033[K[{self.done}/{self.total_tasks}] {current}"[:160])
        self.stream.flush()


def already_done(store: ExperienceStore, key: str, agent: str, budget: Budget) -> bool:
    attempts = [a for a in store.attempts(key) if a.source == SOURCE_AGENT and a.agent == agent]
    return len(attempts) >= budget.attempts


def precompile(
    model: torch.nn.Module,
    inputs: Sequence[Any],
    *,
    target: Target,
    store: ExperienceStore,
    agent_name: str = "heuristic",
    agent_config: dict[str, Any] | None = None,
    budget: Budget = Budget(),
    workers: int = 1,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Optimize every distinct operator of `model`; returns the report (see `report_json`)."""
    start = time.monotonic()
    tasks = trace_tasks(model, inputs, target.key())
    bar = Progress(len(tasks), budget.attempts, stream=sys.stderr if progress else _Null())
    summaries: dict[str, TaskSummary] = {}

    def run(task: Task) -> None:
        store.refresh()
        if already_done(store, task.key, agent_name, budget):
            summaries[task.key] = summarize(task, store, stopped="done in an earlier run")
            bar.finish(task.label, "already optimized")
            return
        agent = make_agent(agent_name, seed=seed, **(agent_config or {}))
        try:

            def on_attempt(index: int, attempt: Any) -> None:
                speed = (
                    f"{attempt.speedup_vs_eager:.2f}x"
                    if attempt.speedup_vs_eager
                    else attempt.verdict
                )
                bar.update(task.label, f"attempt {index + 1}/{budget.attempts}: {speed}")

            summary = optimize_task(
                task, target, store, agent, budget, seed=seed, on_attempt=on_attempt
            )
        finally:
            agent.close()
        summaries[task.key] = summary
        best = f"{summary.speedup_vs_eager:.2f}x eager" if summary.speedup_vs_eager else "no timing"
        bar.finish(
            task.label, f"{summary.winner} {best} ({summary.attempts} attempts, {summary.stopped})"
        )

    if workers > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(run, tasks))
    else:
        for task in tasks:
            run(task)
    ordered = [summaries[t.key] for t in tasks]
    return report_json(ordered, time.monotonic() - start, agent_name, target, budget)


def geomean(values: list[float | None]) -> float | None:
    """Geometric mean of the positive, finite values (None if there are none)."""
    kept = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in kept) / len(kept)) if kept else None


def report_json(
    summaries: list[TaskSummary], wall_s: float, agent: str, target: Target, budget: Budget
) -> dict[str, Any]:
    """The report: per operator, and a summary with pass rate and geomean speedups."""
    operators = [s.as_json() for s in summaries]
    return {
        "operators": operators,
        "summary": {
            "operators": len(summaries),
            "pass_rate": (sum(1 for s in summaries if s.verified) / len(summaries))
            if summaries
            else 0.0,
            "geomean_speedup_vs_eager": geomean([s.speedup_vs_eager or 0 for s in summaries]),
            "geomean_speedup_vs_reference": geomean(
                [s.speedup_vs_reference or 0 for s in summaries]
            ),
            "agent_wins": sum(1 for s in summaries if s.winner == "agent"),
            "tokens": sum(s.tokens for s in summaries),
            "agent": agent,
            "target": target.name,
            "budget": budget.attempts,
            "wall_s": wall_s,
        },
    }


def write_report(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


class _Null:
    def write(self, _: str) -> None:
        pass

    def flush(self) -> None:
        pass
