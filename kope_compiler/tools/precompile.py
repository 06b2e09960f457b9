"""`kope precompile`: optimize each distinct operator of a model once, offline.

The model is traced the way the backend traces it (dynamo, aot_autograd, partition), its
distinct Tasks are optimized by the agent (in parallel when several workers are given), and
everything lands in the experience store, so a later `torch.compile(backend="kope")` runs the
best verified kernels with no agent calls. Re-running resumes: an operator whose budget is
spent is not redone, and one that was interrupted continues from its recorded attempts. On a
quiet machine, proposals whose timing an earlier run's load disturbed do not count as spent:
they are proposed and timed again, so a store precompiled beside other work is settled by the
next quiet precompile. With
`remeasure`, each operator's stored choice is first re-timed against eager now (a new
confirmation replaces the stale figure), so a store measured on a busy machine can be fixed.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
from filelock import Timeout
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from tqdm import tqdm

from kope.agents import make_agent
from kope.core.decompositions import traced_whole
from kope.core.errors import ModelLoadError
from kope.core.options import Options
from kope.core.task import Task, eager_label
from kope.frontend.partition import has_fast_path, partition
from kope.frontend.report import report as backend_report
from kope.frontend.report import shorten, speedup_text
from kope.frontend.whole_graph import retiming_graphs
from kope.memory.recorder import Recorder, attempt_of
from kope.memory.schema import AttemptRecord
from kope.memory.store import ExperienceStore
from kope.passes.pipeline import REPRO_MARKER
from kope.targets.base import Target
from kope.targets.measure import machine_quiet
from kope.tuner.measuring import remeasure as remeasure_choice
from kope.tuner.optimize import (
    Budget,
    TaskSummary,
    optimize_task,
    spent_proposals,
    summarize,
)
from kope.vocabulary.events import AttemptEvaluated, Event, Events
from kope.vocabulary.evidence import SOURCE_AGENT

log = logging.getLogger("kope.precompile")


def trace_tasks(model: torch.nn.Module, inputs: Sequence[Any], target: Target) -> list[Task]:
    """The distinct Tasks the backend would make of `model` on `inputs` (in graph order)."""
    return trace(model, inputs, target)[0]


def trace(
    model: torch.nn.Module, inputs: Sequence[Any], target: Target
) -> tuple[list[Task], dict[tuple[str, str, str], int]]:
    """The distinct Tasks the backend would make of `model` on `inputs` (in graph order), and
    the compute operators it would run eagerly: (op, its label with shapes, reason) -> how
    many places."""
    found: dict[str, Task] = {}
    eager: dict[tuple[str, str, str], int] = {}

    def forward_compiler(gm: fx.GraphModule, _inputs: Sequence[Any]) -> Callable[..., Any]:
        # As the backend partitions by default: fused eager fast paths stay whole. Their
        # decompositions' Tasks are optimized too, so that the backend can choose between the
        # fast path whole and its parts from evidence (`kope.frontend.compiler`).
        apart = partition(copy.deepcopy(gm), target, fast_paths=True) if has_fast_path(gm) else None
        part = partition(gm, target, fast_paths=False)
        for task in part.tasks + (apart.tasks if apart is not None else []):
            found.setdefault(task.key, task)
        for node in part.eager:
            if node.compute:  # by its shapes too, as kope.report() lists it
                place = (node.op, eager_label(node.node) or node.op, node.reason)
                eager[place] = eager.get(place, 0) + 1
        return make_boxed_func(gm.forward)

    graphs = 0

    def backend(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        nonlocal graphs
        graphs += 1
        with traced_whole():  # as the backend traces
            return aot_autograd(fw_compiler=forward_compiler)(gm, example_inputs)

    torch._dynamo.reset()
    with torch.no_grad():
        try:
            torch.compile(model, backend=backend, dynamic=False)(*inputs)
        except Exception as err:
            raise ModelLoadError(f"tracing the model failed: {type(err).__name__}: {err}") from err
    torch._dynamo.reset()
    if not graphs:  # dynamo skipped every frame (nn.LSTM, say): no backend ever sees it
        log.warning(
            "dynamo compiled no graph of the model: it runs eagerly under torch.compile, and "
            "there is nothing to optimize (TORCH_LOGS=graph_breaks says why)"
        )
    return list(found.values()), eager


class Progress:
    """Progress of a precompile: a tqdm bar on a terminal, plain lines anywhere else.

    On a terminal the bar redraws in place and each finished operator is written above it. On
    a pipe or log file nothing is redrawn (no escape sequences): one line per finished
    operator, so a log reads as a list of results. Safe to call from several threads.
    """

    def __init__(self, total_tasks: int, stream: Any = None, enabled: bool = True):
        self.total_tasks = total_tasks
        self.stream: Any = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.done = 0
        self.lock = threading.Lock()
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(enabled and callable(isatty) and isatty())
        self.bar: tqdm[Any] | None = None
        if self.tty:
            self.bar = tqdm(
                total=total_tasks, file=self.stream, unit="op", dynamic_ncols=True, leave=False
            )

    def update(self, label: str, text: str) -> None:
        """The operator `label` is at step `text` (shown on a terminal only)."""
        with self.lock:
            if self.bar is not None:
                self.bar.set_postfix_str(f"{shorten(label, 40)} {text}", refresh=True)

    def finish(self, label: str, text: str) -> None:
        """The operator `label` is done with outcome `text`: one line, on any stream."""
        with self.lock:
            self.done += 1
            if not self.enabled:
                return
            line = f"[{self.done}/{self.total_tasks}] {shorten(label, 60)}: {text}"
            if self.bar is not None:
                self.bar.write(line, file=self.stream)
                self.bar.update(1)
            else:
                self.stream.write(line + "\n")
                self.stream.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def already_done(
    store: ExperienceStore,
    key: str,
    agent: str,
    budget: Budget,
    quiet: Callable[[], bool] = machine_quiet,
) -> bool:
    """Whether the agent's budget on the operator is spent (`spent_proposals`: on a quiet
    machine, proposals that load disturbed are proposed again)."""
    return len(spent_proposals(store.attempts(key), agent, quiet)) >= budget.attempts


def precompile(
    model: torch.nn.Module,
    inputs: Sequence[Any],
    *,
    target: Target,
    store: ExperienceStore,
    agent_name: str = Options.default("agent"),
    agent_config: dict[str, Any] | None = None,
    budget: Budget | None = None,
    workers: int = Options.default("workers"),
    seed: int = 0,
    progress: bool = True,
    stream: Any = None,
    remeasure: bool = False,
    cluster: str | None = None,
    task_threads: int | None = None,
    decide_graph: bool = True,
) -> dict[str, Any]:
    """Optimize every distinct operator of `model`, then (`decide_graph`) make and record the
    whole-graph decision of each of its graphs (`decide_graphs`); returns the report (see
    `report_json`; `graphs` lists the decisions).

    `budget` defaults to `Options().budget` attempts per operator. Progress goes to `stream`
    (default stderr) unless `progress` is false. With `remeasure`, each operator's stored
    choice is re-timed against eager first (`kope.tuner.measuring.remeasure`). With `cluster`
    (`kope.tools.cluster.CLUSTER_CHOICES`), operators fan out over a Ray cluster, each task
    measuring with `task_threads` threads (default: this process's count).
    """
    start = time.monotonic()
    budget = budget or Budget()
    tasks, eager = trace(model, inputs, target)
    bar = Progress(len(tasks), stream=stream, enabled=progress)
    summaries: dict[str, TaskSummary] = {}
    repro: dict[str, list[str]] = {}
    # One look at the machine for the run, taken where a disturbed proposal makes it matter.
    quiet = functools.cache(machine_quiet)

    def prepare(task: Task) -> bool:
        """Whether `task` still needs the agent (else its summary is taken from the store)."""
        store.refresh()
        if remeasure and store.attempts(task.key):
            bar.update(task.label, "re-timing the stored choice")
            remeasure_choice(task, target, store)
        if already_done(store, task.key, agent_name, budget, quiet):
            summaries[task.key] = summarize(task, store, stopped="done in an earlier run")
            bar.finish(task.label, "already optimized")
            return False
        before[task.key] = {a.id for a in store.attempts(task.key)}
        return True

    def finish(task: Task, summary: TaskSummary) -> None:
        summaries[task.key] = summary
        new = [a for a in store.attempts(task.key) if a.id not in before[task.key]]
        repro[task.key] = repro_commands(new)
        speed = speedup_text(summary.speedup_vs_eager, summary.timing_quality)
        quality = summary.timing_quality
        best = f"{speed} eager ({quality})" if summary.speedup_vs_eager else "no timing"
        bar.finish(
            task.label, f"{summary.winner} {best} ({summary.attempts} attempts, {summary.stopped})"
        )

    def run(task: Task) -> None:
        # One process at a time optimizes an operator into a store: a second (the same
        # command twice, or another model sharing the operator) waits, then finds the budget
        # spent; side by side, both made the same proposals.
        lock = store.task_lock(task.key)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            bar.update(task.label, "waiting: another process is optimizing it")
            lock.acquire()
        try:
            if not prepare(task):
                return
            agent = make_agent(agent_name, seed=seed, **(agent_config or {}))
            try:
                shown = _progress(bar, task, store, agent_name, budget, quiet)
                events = Events(Recorder(store), shown)
                summary = optimize_task(
                    task,
                    target,
                    store,
                    agent,
                    budget,
                    seed=seed,
                    events=events,
                    quiet=quiet,
                )
            finally:
                agent.close()
            finish(task, summary)
        finally:
            lock.release()

    def made(done: list[Task]) -> dict[str, Any]:
        ordered = [summaries[t.key] for t in done]
        report = report_json(ordered, time.monotonic() - start, agent_name, target, budget)
        for row in report["operators"]:
            row["repro"] = repro.get(row["key"], [])
        # What is left out is part of the answer: a model whose operators all run eagerly
        # should say why rather than report "0 operators".
        report["eager"] = [
            {"op": op, "label": label, "reason": reason, "sites": sites}
            for (op, label, reason), sites in eager.items()
        ]
        report["complete"] = len(done) == len(tasks)
        return report

    before: dict[str, set[str]] = {}
    try:
        if cluster is not None:
            todo = [task for task in tasks if prepare(task)]
            _run_on_cluster(
                cluster,
                todo,
                target,
                store,
                agent_name,
                agent_config,
                budget,
                seed,
                task_threads,
                bar,
                finish,
            )
        elif workers > 1:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                list(pool.map(run, tasks))
        else:
            for task in tasks:
                run(task)
        bar.close()
        graphs = decide_graphs(model, inputs, target, store) if decide_graph else []
    except KeyboardInterrupt:
        bar.close()
        raise Interrupted(made([t for t in tasks if t.key in summaries])) from None
    report = made(tasks)
    report["graphs"] = graphs
    return report


def decide_graphs(
    model: torch.nn.Module, inputs: Sequence[Any], target: Target, store: ExperienceStore
) -> list[dict[str, Any]]:
    """Compile `model` as `torch.compile(backend="kope")` does and call it once, so that the
    whole-graph decision of each of its graphs (`kope.frontend.whole_graph`) is made now, offline,
    and recorded: a later process reuses it instead of timing the graph at its first call. A
    recorded decision that the machine disturbed is timed again (`retiming_graphs`); a clean
    one stands. Nothing is decided for a target whose kernels cannot run here."""
    if not target.timed() or target.unavailable() is not None:
        return []
    options: dict[str, Any] = {
        "store": str(store.root),
        "target": target.name,
        "workers": target.workers,
        "timeout_s": target.timeout_s,
    }
    before = len(backend_report().graphs)
    torch._dynamo.reset()
    with torch.no_grad(), retiming_graphs():
        torch.compile(model, backend="kope", options=options, dynamic=False)(*inputs)
    torch._dynamo.reset()
    return [
        {
            "compiled": graph.whole.compiled,
            "speedup_vs_eager": graph.whole.speedup,
            "clean": not graph.whole.unsure,
            "reason": graph.whole.reason,
        }
        for graph in backend_report().graphs[before:]
        if graph.whole is not None
    ]


class Interrupted(KeyboardInterrupt):
    """`precompile` stopped by Ctrl-C; `report` covers the operators it finished (`complete`
    false). Every attempt made is in the store already, so a rerun resumes."""

    def __init__(self, report: dict[str, Any]):
        super().__init__("interrupted")
        self.report = report


def _progress(
    bar: Progress,
    task: Task,
    store: ExperienceStore,
    agent_name: str,
    budget: Budget,
    quiet: Callable[[], bool] = machine_quiet,
) -> Callable[[Event], None]:
    """A listener beside the store's recorder: the bar shows each of the agent's attempts,
    counted as the budget counts them (`spent_proposals`)."""
    proposals = len(spent_proposals(store.attempts(task.key), agent_name, quiet))

    def progress(event: Event) -> None:
        nonlocal proposals
        if not isinstance(event, AttemptEvaluated) or event.source != SOURCE_AGENT:
            return
        if event.confirms is not None:
            return
        proposals += 1
        attempt = attempt_of(event)
        speed = attempt.verdict
        if attempt.speedup_vs_eager:
            speed = speedup_text(attempt.speedup_vs_eager, attempt.timing_quality)
        bar.update(task.label, f"attempt {proposals}/{budget.attempts}: {speed}")

    return progress


def _run_on_cluster(
    cluster: str,
    tasks: list[Task],
    target: Target,
    store: ExperienceStore,
    agent_name: str,
    agent_config: dict[str, Any] | None,
    budget: Budget,
    seed: int,
    task_threads: int | None,
    bar: Progress,
    finish: Callable[[Task, TaskSummary], None],
) -> None:
    """Each of `tasks` as a Ray task (`kope.tools.cluster`); the driver records what streams
    back."""
    from kope.tools.cluster import Job, connected, run_tasks
    from kope.tuner.measuring import threads_now

    threads = task_threads or threads_now()
    by_key = {task.key: task for task in tasks}
    listeners = {
        task.key: Events(Recorder(store), _progress(bar, task, store, agent_name, budget))
        for task in tasks
    }
    jobs = [
        Job(
            Task([], [], t.spec, t.payload, t.key, t.workload),
            target.name,
            target.timeout_s,
            agent_name,
            agent_config or {},
            budget,
            seed,
            threads,
        )
        for t in tasks
    ]

    def on_event(job_task: Task, event: Event) -> None:
        listeners[job_task.key].emit(event)

    def on_done(job_task: Task, summary: TaskSummary | None, why: str) -> None:
        task = by_key[job_task.key]
        store.refresh()
        stopped = summary.stopped if summary is not None else f"failed on the cluster: {why}"
        finish(task, summarize(task, store, stopped=stopped))

    with connected(cluster) as ray:
        run_tasks(ray, jobs, store, on_event, on_done)


def repro_commands(attempts: list[AttemptRecord]) -> list[str]:
    """The distinct `kope-opt` commands that reproduce the pipeline failures of `attempts`.

    A pipeline that fails in a worker writes its repro file there, and the command travels
    back only inside the attempt's error text: this is where it is taken out for the user.
    """
    found: list[str] = []
    for attempt in attempts:
        for line in (attempt.error or "").splitlines():
            _, marker, command = line.partition(REPRO_MARKER)
            if marker and command.strip() and command.strip() not in found:
                found.append(command.strip())
    return found


def geomean(values: list[float | None]) -> float | None:
    """Geometric mean of the positive, finite values (None if there are none)."""
    kept = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in kept) / len(kept)) if kept else None


def report_json(
    summaries: list[TaskSummary], wall_s: float, agent: str, target: Target, budget: Budget
) -> dict[str, Any]:
    """The report: per operator, and a summary with pass rate and geomean speedups.

    `pass_rate` is the share of operators for which the agent produced at least one verified
    kernel (`TaskSummary.verified`), whichever kernel won.
    """
    operators = [s.as_json() for s in summaries]
    return {
        "operators": operators,
        "summary": {
            "operators": len(summaries),
            "pass_rate": (sum(1 for s in summaries if s.verified) / len(summaries))
            if summaries
            else None,  # no compute operator: nothing passed or failed
            "geomean_speedup_vs_eager": geomean([s.speedup_vs_eager or 0 for s in summaries]),
            "geomean_speedup_vs_reference": geomean(
                [s.speedup_vs_reference or 0 for s in summaries]
            ),
            "agent_wins": sum(1 for s in summaries if s.winner == "agent"),
            "tokens": sum(s.tokens for s in summaries),
            "agent": agent,
            "target": target.name,
            # False where kernels are interpreted (no device): every figure is absent.
            "timed": target.timed(),
            "budget": budget.attempts,
            "wall_s": wall_s,
        },
    }


def write_report(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
