"""The graph is a candidate too: a compiled graph runs only where it beats eager as a whole.

Per-operator figures are measured in a worker, one operator at a time. Inside a graph a kernel
can lose what it won there: its inputs come from other kernels, caches are shared, and each
call pays dispatch. So after the per-operator choices (`kope.tuner.selection`), the compiled graph
is timed against the eager graph (dynamo's own) in the calling process, interleaved, under the
measurement's clean-round rules (`kope.targets.measure.measure_interleaved`), on the inputs
the graph was compiled for, each sample at least `GRAPH_MIN_CALLS` calls (a graph's first call
after the other's pays for caches that one left); its outputs are first checked against
eager's. A rewritten graph (`kope.frontend.rewrites`) with kernels is also timed without them: its
kernels must not make it slower (each has already beaten its own eager call, below; asking
the graph to show their gain beyond noise as well ran eager's graph for a ResNet block whose
two 10 µs kernels made it 1.08x eager, because they moved the 480 µs graph by only 4%).

Then eager's graph and the compiled one (where it is not eager's) are timed on one intra-op
thread against the graph that won and eager on the caller's count: a small graph's ATen calls
may lose more to waking and joining threads than the second thread gives them (on a 2-core
machine here, a depthwise-separable conv block ran 1.29x faster on one thread than on two,
attention 1.09x; GPT-2's MLP 0.76x, which keeps both). The faster of the two on one thread
runs there if it beats both beyond noise in two timings, one after the other (`AtThreads`;
the caller's count is restored after each call), a compiled graph that lost to eager on the
caller's count included.

Each kernel is first timed in this process against its own eager call, on the inputs the graph
hands it (a kernel's gain is a large share of its own time and a small one of the graph's, so
this head to head sees what the graph's timing drowns in noise); the kernels that lose there
are dropped. If the graph with the rest beats eager beyond noise (`WIN_MARGIN`), it runs.
Else the rest are added back one at a time, the largest measured gain first, each kept only if
the graph with it beats the graph without it; what is left runs only if it beats eager; else
the eager graph runs. Dropped choices run their operator's eager call and say so in
`kope.report()`.

Every decision is recorded in the store (a task of op `kope.graph`, one `graph` attempt per
decision: the chosen and eager graphs' timings, and in `config` the kernels considered and
kept, the thread count, and whether a step of it was not timed cleanly), so a process that
compiles the same graph (by `graph_key`: its structure and input specs, names aside) with the
same choices reuses it instead of timing the graph at its first call. A clean decision is
preferred to any other, and a disturbed one never replaces it. A decision that was not timed
cleanly (the machine was busy) is reused too, as what the evidence so far supports (a disturbed
search keeps eager's graph, except where its every step was clean): timing it again at every
first call cost 23-67 s a process on a busy machine and found it disturbed again. It is timed
again where `retiming_graphs()` asks for it (`kope precompile` does, offline), or at a first
call that finds the machine quiet (`machine_quiet`), where a clean decision is likely and
is then made once for every later process.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch

from kope.frontend.report import GraphDecision, GraphReport, TaskReport
from kope.memory.schema import AttemptRecord
from kope.memory.standing import WIN_MARGIN
from kope.memory.store import ExperienceStore
from kope.targets import verify
from kope.targets.base import Target
from kope.targets.measure import MeasureConfig, machine_quiet, measure_interleaved
from kope.tuner.measuring import announce, threads_now
from kope.vocabulary.events import AttemptEvaluated, Events, TaskSeen
from kope.vocabulary.evidence import (
    SOURCE_EAGER,
    SOURCE_GRAPH,
    TIMING_CLEAN,
    VERIFIED,
    Evaluation,
    Timing,
)
from kope.vocabulary.specs import TensorSpec

log = logging.getLogger("kope.compiler")

GRAPH_OP = "kope.graph"
# The most kernels the greedy search adds back one by one (each costs one measurement); the
# rest of a graph whose kernels do not pay together are dropped.
MAX_GREEDY = 8
# Each sample of a graph's timing is at least this many calls (`MeasureConfig.min_calls`): on
# the LLM block, the first call of the compiled graph after the eager graph's took 840-1,000 µs
# and the next 670-720 (its kernels' packed weights come back from memory), so samples of two
# calls, as 2 ms gave, timed the switch rather than the graph.
GRAPH_MIN_CALLS = 10
# Each sample of a training step's timing loops it for about this long (`settle_training_step`).
TRAINING_SAMPLE_S = 0.02


class Switchable(Protocol):
    """What a compiled graph node runs: the chosen kernel, or the operator's eager call once
    the whole-graph check dropped the choice."""

    kernel: Callable[..., Any]
    eager: Callable[[Sequence[torch.Tensor]], tuple[torch.Tensor, ...]]
    single: bool
    report: TaskReport
    enabled: bool


def graph_structure(gm: torch.fx.GraphModule) -> str:
    """`gm`'s computation as text, without its node names and without the inputs it never
    reads that are not tensors: what a graph key hashes.

    A graph dynamo made shape-generic is compiled per static shape (`ShapeSpecializer`) and
    takes its symbolic sizes as extra int inputs, which the aten graph never reads (tracing
    bakes the sizes in), and that shifts every placeholder's name. Its code differed from the
    static graph of the same shape, so a model called again at a length it had seen before
    dynamo went dynamic timed the same graph again, for seconds."""
    index: dict[torch.fx.Node, str] = {}
    lines = []
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder" and not node.users and not isinstance(val, torch.Tensor):
            continue
        index[node] = f"%{len(index)}"
        args = torch.fx.map_arg((node.args, node.kwargs), lambda n: index[n])
        if node.op == "placeholder":
            what = str(TensorSpec.of(val)) if isinstance(val, torch.Tensor) else repr(val)
        elif node.op == "get_attr":  # a constant (`kope.frontend.partition.fold_constants`)
            constant = getattr(gm, str(node.target), None)
            spec = TensorSpec.of(constant) if isinstance(constant, torch.Tensor) else None
            what = f"{node.target}: {spec}"
        elif callable(node.target):
            what = torch.fx.node._get_qualified_name(node.target)
        else:
            what = str(node.target)
        lines.append(f"{index[node]} = {node.op} {what} {args!r}")
    return "\n".join(lines)


def graph_key(structure: str, inputs: Sequence[Any], target_key: str) -> tuple[str, str]:
    """(key, workload) of a graph: its `graph_structure` and tensor inputs' specs, with and
    without the target. Other inputs are left out: a traced graph has their values baked in."""
    specs = repr([TensorSpec.of(x) for x in inputs if isinstance(x, torch.Tensor)])
    workload = hashlib.sha256(f"{structure}\n{specs}".encode()).hexdigest()
    return hashlib.sha256(f"{workload}\n{target_key}".encode()).hexdigest(), workload


def settle(
    eager_graph: Callable[..., Any],
    compiled_graph: Callable[..., Any],
    calls: Sequence[Switchable],
    inputs: Sequence[Any],
    *,
    structure: str,
    store: ExperienceStore,
    target: Target,
    events: Events,
    report: GraphReport,
    config: MeasureConfig | None = None,
) -> GraphDecision:
    """Decide whether `compiled_graph` runs, and with which of its kernels (`calls` are switched
    off in place for the choices dropped); the report says what was decided and why."""
    config = config or MeasureConfig(min_calls=GRAPH_MIN_CALLS)
    key, workload = graph_key(structure, inputs, target.key())
    # A graph's rewrites are part of what was considered: a decision made without them (an
    # older KOPE) is not this graph's.
    considered = sorted([_entry(c) for c in calls] + _rewrite_entries(report))
    recorded = _recorded(store, key, considered)
    if recorded is not None and (_sure(recorded) or not _retime_unsure()):
        kept = set(recorded.config["kept"] if recorded.config else [])
        for call in calls:
            call.enabled = _entry(call) in kept
        how = (
            "as measured before"
            if _sure(recorded)
            else "as measured before on a busy machine (`kope precompile` times it again)"
        )
        decision = GraphDecision(bool(kept), f"{how}: {recorded.decision}")
        decision.recorded_us = (recorded.latency_us, recorded.eager_us)
        decision.threads = (recorded.config or {}).get("threads")
        decision.unsure = not _sure(recorded)
        return _finish(decision, calls, report)
    rewritten = bool(calls or report.rewrites)  # else the compiled graph is eager's
    failure = _outputs_differ(eager_graph, compiled_graph, inputs) if rewritten else None
    if failure is not None:
        log.error("the compiled graph's outputs differ from eager's (%s); running eager", failure)
        for call in calls:
            call.enabled = False
        return _finish(GraphDecision(False, f"outputs differ from eager: {failure}"), calls, report)

    def eager() -> Any:
        return eager_graph(*inputs)

    def compiled() -> Any:
        return compiled_graph(*inputs)

    threads = {"eager": threads_now(), "kope": threads_now()}
    if rewritten:
        # Each kernel is timed against its own eager call first, whatever the graph's timing
        # says: a graph timed at 1.11x eager kept a GPT-2 addmm kernel that took 446 µs where
        # eager's took 350, the other two kernels' gains hiding its loss.
        # `_greedy` leaves a graph it does not compile with its kernels switched off.
        decision = _greedy(calls, eager, compiled, config, threads, bool(report.rewrites))
    else:
        decision = GraphDecision(False, "no kernel or rewrite to run")
    if not decision.disturbed and (decision.clean or not rewritten):
        # With its kernels switched off, a graph that was not rewritten is eager's.
        differs = decision.compiled or bool(report.rewrites)
        _choose_threads(decision, compiled, eager, config, differs)
    if not decision.compiled:  # eager's graph runs, on the caller's count or on one thread
        for call in calls:
            call.enabled = False
    sure = decision.clean and not decision.disturbed
    timed = decision.kope is not None and decision.eager is not None
    if timed and (sure or recorded is None or not _sure(recorded)):
        _record(store, events, target, key, workload, considered, calls, decision, report)
    return _finish(decision, calls, report)


_RETIME: contextvars.ContextVar[bool] = contextvars.ContextVar("kope_retime", default=False)


def _retime_unsure() -> bool:
    """Whether a decision recorded on disturbed timings is timed again now: in `kope
    precompile` (`retiming_graphs`), or where the machine is quiet at this first call (a
    tenth of a second's look), so that the clean decision is made once and spares every later
    process. A model precompiled on a busy machine ran eager's graph through dynamo, 0.79x
    eager, until a quiet process decided it."""
    return _RETIME.get() or machine_quiet()


@contextlib.contextmanager
def retiming_graphs() -> Iterator[None]:
    """Within it, a graph whose recorded decision was not timed cleanly is timed again (a
    clean decision still stands): `kope precompile` decides its model's graphs this way."""
    token = _RETIME.set(True)
    try:
        yield
    finally:
        _RETIME.reset(token)


def _greedy(
    calls: Sequence[Switchable],
    eager: Callable[[], Any],
    compiled: Callable[[], Any],
    config: MeasureConfig,
    threads: dict[str, int],
    rewritten: bool = False,
) -> GraphDecision:
    """Keep the kernels that beat their own eager call in this process; if the graph with them
    does not beat eager (or, `rewritten`, loses to the graph without them), add them back one
    at a time, the largest measured gain first, keeping each that makes the graph faster; the
    result must still beat eager. A `rewritten` graph (`kope.frontend.rewrites`) may beat eager
    with no kernel at all."""
    gains, disturbed = _own_gains(calls, compiled, config, threads["kope"])
    order = sorted((c for c in calls if gains[id(c)] > 0), key=lambda c: gains[id(c)], reverse=True)
    for call in calls:
        call.enabled = call in order
    if order:
        fns = {"eager": eager, "kope": compiled}
        if rewritten:
            fns["rewritten"] = _without(calls, compiled)
        timed = measure_interleaved(fns, config, {n: threads["kope"] for n in fns})
        clean = all(t.clean for t in timed.values())
        disturbed += not clean
        if (
            clean
            and _beats(timed["kope"], timed["eager"])
            and not (rewritten and _beats(timed["rewritten"], timed["kope"]))
        ):
            decision = GraphDecision(
                True,
                f"{len(order)} of {len(calls)} kernels pay inside the graph (each beat its own "
                "eager call here)",
                timed["kope"],
                timed["eager"],
            )
            decision.disturbed = bool(disturbed)
            return decision
        # One at a time, a kernel must make the graph WIN_MARGIN faster: one that saves less
        # than that alone could pass only on noise, and each try costs a measurement.
        graph_us = min(timed[name].median_us for name in fns if name != "kope")
        log.debug(
            "graph %.1f us; kernels' own gains %s us",
            graph_us,
            ", ".join(f"{gains[id(c)]:.1f}" for c in order),
        )
        order = [c for c in order if gains[id(c)] > WIN_MARGIN * graph_us]
    for call in calls:
        call.enabled = False
    pair = {"with": threads["kope"], "without": threads["kope"]}
    for call in order[:MAX_GREEDY]:
        call.enabled = True
        timed = measure_interleaved(
            {"with": compiled, "without": _without([call], compiled)}, config, pair
        )
        clean = timed["with"].clean and timed["without"].clean
        disturbed += not clean
        call.enabled = clean and _beats(timed["with"], timed["without"])
    kept = sum(c.enabled for c in calls)
    if not kept and not rewritten:
        # Eager runs. The graph with every kernel is timed once for the record (a decision is
        # kept only on clean timings); a disturbed step means a kernel may have been dropped
        # on noise, and the next compile retries.
        for call in calls:
            call.enabled = True
        timed = measure_interleaved({"eager": eager, "kope": compiled}, config, threads)
        for call in calls:
            call.enabled = False
        # A search that was disturbed may have dropped kernels on noise: said so, not that
        # none pays (the figure of the graph with every kernel may then read as a win).
        reason = (
            "a step of its search was not timed cleanly; eager runs until it is"
            if disturbed
            else "no kernel pays inside the graph"
        )
        decision = GraphDecision(False, reason, timed["kope"], timed["eager"])
        decision.disturbed = bool(disturbed)
        return decision
    final = measure_interleaved({"eager": eager, "kope": compiled}, config, threads)
    if not calls:
        pay = "the rewritten graph beats eager"
    else:
        pay = f"{kept} of {len(calls)} kernels pay inside the graph"
        pay += " with its rewrites" if rewritten else ""
    decision = GraphDecision(True, pay, final["kope"], final["eager"])
    decision.disturbed = bool(disturbed)
    if decision.clean and _beats(final["kope"], final["eager"]):
        return decision
    for call in calls:
        call.enabled = False
    decision.compiled = False
    if not decision.clean:
        decision.reason = "its timing against eager was not clean; eager runs until it is"
    elif kept:
        decision.reason = "the kernels that pay alone do not beat eager together"
    else:
        decision.reason = "the rewritten graph does not beat eager"
    return decision


def settle_training_step(
    eager_graph: Callable[..., Any],
    compiled: Callable[..., Any],
    inputs: Sequence[Any],
    config: MeasureConfig | None = None,
) -> tuple[bool, str]:
    """Whether `compiled` (aot_autograd's function with KOPE's forward) runs a training step,
    forward and backward, faster beyond noise than `eager_graph` (dynamo's graph, with
    eager's autograd) on `inputs`; and the sentence the report gives.

    The gradients are computed with `torch.autograd.grad`, never accumulated into `.grad`;
    inputs that do not need gradients and that the steps changed (batch norm's running
    statistics) get their values back after the timing, and the random generator its state,
    so the model is as the caller left it.
    Not recorded: the next compile times it again. Each sample is ~20 ms of steps: several
    calls of a small step (the first after the other graph's pays for caches), one of a large
    one, so a model whose step takes 0.2 s is timed in about 2 s, not in 10-call samples."""
    config = config or MeasureConfig(sample_s=TRAINING_SAMPLE_S)
    # The steps start from leaves of their own: an input with history (after a graph break,
    # `h` and `s = (h * h).sum()`) would otherwise take the gradients back through the
    # caller's graph and free it, and the caller's own backward then raised.
    fresh = [
        x.detach().requires_grad_() if isinstance(x, torch.Tensor) and x.requires_grad else x
        for x in inputs
    ]
    wrt = [x for x in fresh if isinstance(x, torch.Tensor) and x.requires_grad]
    # By value: batch norm's kernel moves its running statistics without bumping a version.
    kept = {
        i: x.detach().clone()
        for i, x in enumerate(inputs)
        if isinstance(x, torch.Tensor) and not x.requires_grad
    }

    def step(graph: Callable[..., Any]) -> Callable[[], Any]:
        seeds: list[torch.Tensor] = []

        def run() -> Any:
            leaves = torch.utils._pytree.tree_leaves(graph(*fresh))
            outs = [o for o in leaves if isinstance(o, torch.Tensor) and o.requires_grad]
            if not seeds:
                seeds.extend(torch.ones_like(o) for o in outs)
            return torch.autograd.grad(outs, wrt, seeds, allow_unused=True)

        return run

    try:
        with torch.enable_grad(), torch.random.fork_rng(devices=[]):
            fns = {"eager": step(eager_graph), "kope": step(compiled)}
            threads = {name: threads_now() for name in fns}
            timed = measure_interleaved(fns, config, threads)
    finally:
        with torch.no_grad():
            for index, value in kept.items():
                if not torch.equal(inputs[index], value):
                    inputs[index].copy_(value)
    kope, eager = timed["kope"], timed["eager"]
    speed = f"{eager.median_us / kope.median_us:.2f}x eager per step"
    if not (kope.clean and eager.clean):
        return False, (
            f"dynamo's graph runs, with eager's autograd: the training step's timing was not "
            f"clean ({speed}), and the next compile times it again"
        )
    if _beats(kope, eager):
        return True, f"KOPE's forward runs, and ATen's backward as traced: {speed}"
    return False, (
        f"dynamo's graph runs, with eager's autograd: a step with KOPE's forward and "
        f"aot_autograd's backward timed {speed}"
    )


class AtThreads:
    """A graph run with torch's intra-op thread count at `threads`; the caller's count is
    restored after each call (setting it costs well under a microsecond)."""

    def __init__(self, graph: Callable[..., Any], threads: int):
        self.graph = graph
        self.threads = threads

    def __call__(self, *args: Any) -> Any:
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            return self.graph(*args)
        finally:
            torch.set_num_threads(before)


def _choose_threads(
    decision: GraphDecision,
    compiled: Callable[[], Any],
    eager: Callable[[], Any],
    config: MeasureConfig,
    differs: bool,
) -> None:
    """Run eager's graph, or the compiled one (`differs`: it is not eager's), on one thread if
    one of them beats there both what was decided and eager on the caller's count (timed
    interleaved, clean, in two timings one after the other); a disturbed timing leaves the
    count as it is and the decision disturbed. A compiled graph that lost to eager on the
    caller's count may win on one thread."""
    threads = threads_now()
    if threads <= 1:
        return
    fns: dict[str, Callable[[], Any]] = {"eager": eager, "eager_one": AtThreads(eager, 1)}
    if differs:
        fns["kope_one"] = AtThreads(compiled, 1)
    if decision.compiled:
        fns["kope"] = compiled
    counts = {name: 1 if name.endswith("_one") else threads for name in fns}
    timed = measure_interleaved(fns, config, counts)
    if decision.kope is None:  # nothing to compile: the eager graph against itself
        decision.kope, decision.eager = timed["eager"], timed["eager"]
    if not all(t.clean for t in timed.values()):
        decision.disturbed = True
        return
    rivals = [name for name in fns if not name.endswith("_one")]
    best = min((n for n in fns if n.endswith("_one")), key=lambda n: timed[n].median_us)
    if not all(_beats(timed[best], timed[name]) for name in rivals):
        return
    # A switch must win twice: this machine's neighbours slow whole stretches of rounds
    # without a wait this process can see, and one timing that put a transformer block 5%
    # ahead on one thread ran it 0.76x of eager in the benchmark after it.
    again = measure_interleaved({n: fns[n] for n in [best, *rivals]}, config, counts)
    if not all(t.clean for t in again.values()):
        decision.disturbed = True
        return
    if not all(_beats(again[best], again[name]) for name in rivals):
        return
    timed = {**timed, **again}
    before = timed["kope" if decision.compiled else "eager"]
    faster = before.median_us / timed[best].median_us
    switched = (best == "kope_one") != decision.compiled
    if switched:
        ran, lost = ("the compiled graph", "eager's")
        if best == "eager_one":
            ran, lost = ("eager's graph", "the compiled one")
        decision.reason = (
            f"on 1 thread {ran} runs {faster:.2f}x faster than {lost} on {threads} "
            f"({decision.reason} on {threads})"
        )
    else:
        decision.reason += f"; on 1 thread it runs {faster:.2f}x faster than on {threads}"
    decision.threads = 1
    decision.compiled = best == "kope_one"
    decision.kope, decision.eager = timed[best], timed["eager"]


def _without(calls: Sequence[Switchable], compiled: Callable[[], Any]) -> Callable[[], Any]:
    """`compiled` with `calls` switched off for the duration of one call."""

    def run() -> Any:
        enabled = [c.enabled for c in calls]
        for call in calls:
            call.enabled = False
        try:
            return compiled()
        finally:
            for call, on in zip(calls, enabled, strict=True):
                call.enabled = on

    return run


def _beats(fast: Timing, slow: Timing) -> bool:
    return slow.median_us / fast.median_us > 1.0 + WIN_MARGIN


def _own_gains(
    calls: Sequence[Switchable], compiled: Callable[[], Any], config: MeasureConfig, threads: int
) -> tuple[dict[int, float], int]:
    """Per kernel (by id), the µs it saves per call against its own eager call, timed head to
    head in this process on the inputs one run of the graph gives it (0 when it does not beat
    eager beyond noise or its timing was not clean); and how many timings were disturbed."""
    seen = inputs_seen(calls, compiled)
    gains: dict[int, float] = {}
    disturbed = 0
    for call in calls:
        inputs = seen.get(id(call))
        if inputs is None:  # not reached on these inputs
            gains[id(call)] = 0.0
            continue
        timed = _head_to_head(call, inputs, config, threads)
        clean = timed["kernel"].clean and timed["eager"].clean
        disturbed += not clean
        wins = clean and _beats(timed["kernel"], timed["eager"])
        gains[id(call)] = timed["eager"].median_us - timed["kernel"].median_us if wins else 0.0
    return gains, disturbed


def inputs_seen(
    calls: Sequence[Switchable], compiled: Callable[[], Any]
) -> dict[int, tuple[Any, ...]]:
    """The inputs each of `calls` (by id) gets in one run of `compiled` with all of them on."""
    seen: dict[int, tuple[Any, ...]] = {}
    kernels = {id(c): c.kernel for c in calls}

    def recording(call: Switchable) -> Callable[..., Any]:
        def run(*inputs: Any) -> Any:
            seen[id(call)] = inputs
            return kernels[id(call)](*inputs)

        return run

    for call in calls:
        call.enabled = True
        call.kernel = recording(call)
    try:
        compiled()
    finally:
        for call in calls:
            call.kernel = kernels[id(call)]
    return seen


def _head_to_head(
    call: Switchable, inputs: tuple[Any, ...], config: MeasureConfig, threads: int
) -> dict[str, Timing]:
    kernel, eager = call.kernel, call.eager
    return measure_interleaved(
        {"kernel": lambda: kernel(*inputs), "eager": lambda: eager(inputs)},
        config,
        {"kernel": threads, "eager": threads},
    )


def _rewrite_entries(report: GraphReport) -> list[str]:
    return [f"rewrite:{r}" for r in report.rewrites]


def _entry(call: Switchable) -> str:
    return f"{call.report.key}:{call.report.kernel}"


def _outputs_differ(
    eager_graph: Callable[..., Any], compiled_graph: Callable[..., Any], inputs: Sequence[Any]
) -> str | None:
    """None when the compiled graph returns eager's outputs on the compile's inputs (both
    drawing the same random numbers, where the graph draws any)."""
    state = torch.random.get_rng_state()
    want = _tensors(eager_graph(*inputs))
    torch.random.set_rng_state(state)
    got = _tensors(compiled_graph(*inputs))
    if len(want) != len(got):
        return f"{len(got)} outputs, eager returns {len(want)}"
    # An output is as close as the least precise values it was computed through: a float32
    # softmax of a bfloat16 product differed from eager's by 2e-3 where kernels rounded the
    # product's intermediates otherwise than ATen.
    precision = verify.least_precise([*_tensors(list(inputs)), *want])
    for index, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {index} is {TensorSpec.of(g)}, eager's is {TensorSpec.of(w)}"
        # A graph of several kernels accumulates error: the tolerance of a long reduction.
        cmp = verify.compare(
            g.detach(), w.detach(), index, reduction=max(1, w.numel()), precision=precision
        )
        if not cmp.ok:
            return cmp.message
    return None


def _tensors(value: Any) -> list[torch.Tensor]:
    leaves, _ = torch.utils._pytree.tree_flatten(value)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def _recorded(store: ExperienceStore, key: str, considered: list[str]) -> AttemptRecord | None:
    """The decision for this graph under this thread count and these choices: the latest
    clean one, else the latest one (`_sure` tells which)."""
    store.refresh()
    found = [
        attempt
        for attempt in store.attempts(key)
        if attempt.source == SOURCE_GRAPH
        and attempt.threads == threads_now()
        and attempt.config is not None
        and sorted(attempt.config.get("considered", [])) == considered
    ]
    sure = [attempt for attempt in found if _sure(attempt)]
    chosen = sure or found
    return chosen[-1] if chosen else None


def _sure(attempt: AttemptRecord) -> bool:
    """Whether a recorded decision rests on clean timings only (an older KOPE recorded no
    other kind)."""
    unsure = (attempt.config or {}).get("unsure", False)
    return attempt.timing_quality == TIMING_CLEAN and not unsure


def _record(
    store: ExperienceStore,
    events: Events,
    target: Target,
    key: str,
    workload: str,
    considered: list[str],
    calls: Sequence[Switchable],
    decision: GraphDecision,
    report: GraphReport,
) -> None:
    labels = ", ".join(t.label for t in report.tasks[:3])
    more = f", +{len(report.tasks) - 3}" if len(report.tasks) > 3 else ""
    events.emit(
        TaskSeen(
            key,
            GRAPH_OP,
            f"graph of {len(report.tasks)} tasks ({labels}{more})",
            workload,
            (),
            (),
            target.name,
            target.key(),
        )
    )
    evaluation = Evaluation(
        VERIFIED, kernel=decision.kope, eager=decision.eager, oracle="the eager graph"
    )
    kept = [_entry(c) for c in calls if c.enabled] + _rewrite_entries(report)
    kept = sorted(kept) if decision.compiled else []
    event = AttemptEvaluated(
        key,
        SOURCE_GRAPH,
        evaluation,
        None,
        decision=decision.reason,
        config={
            "considered": considered,
            "kept": kept,
            "threads": decision.threads,
            "unsure": not decision.clean or decision.disturbed,
        },
    )
    announce(events, event, store)


def _finish(
    decision: GraphDecision, calls: Sequence[Switchable], report: GraphReport
) -> GraphDecision:
    # A decision on timings that were not clean is timed again by the next `kope precompile`,
    # so its kernels are set aside, not judged.
    unsure = decision.unsure or (
        decision.kope is not None and (not decision.clean or decision.disturbed)
    )
    decision.unsure = unsure
    for call in calls:
        if not call.enabled and call.report.kernel != SOURCE_EAGER:
            call.report.reason = (
                f"set aside for now: the graph was not timed cleanly, and `kope precompile` "
                f"times it again ({decision.reason})"
                if unsure
                else f"dropped: the {call.report.kernel} kernel did not pay inside the graph "
                f"({decision.reason})"
            )
            call.report.kernel = SOURCE_EAGER
    report.whole = decision
    speed = f" ({decision.speedup:.2f}x eager)" if decision.speedup else ""
    log.info(
        "graph: %s%s: %s", "compiled" if decision.compiled else "eager", speed, decision.reason
    )
    return decision
