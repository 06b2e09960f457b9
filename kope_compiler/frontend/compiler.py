"""Compiling one aten graph: partition into Tasks, choose each Task's kernel, rewire the graph.

A Task whose chosen kernel is not eager has its node replaced by a `KernelCall` that runs the
JIT-compiled kernel; everything else stays an ATen call, made lean (`kope.frontend.dispatch`:
torch's own bindings or raw operator entries, view chains folded). The result is a plain fx
GraphModule.
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from kope.core.errors import KopeError
from kope.core.options import Options
from kope.core.task import Task, eager_label
from kope.frontend.dispatch import has_symbols, lean, subgraph
from kope.frontend.partition import Partition, has_fast_path, partition
from kope.frontend.report import EagerReport, GraphReport, TaskReport, add_graph
from kope.frontend.whole_graph import AtThreads, graph_structure, settle
from kope.memory.standing import winner
from kope.memory.store import ExperienceStore, StoreError
from kope.targets import get_target
from kope.targets.base import Target
from kope.tuner.measuring import recording, threads_now
from kope.tuner.selection import choose
from kope.vocabulary.events import ChoiceMade, Events

log = logging.getLogger("kope.compiler")


class KernelCall:
    """A graph node's callable that runs a JIT kernel and counts its calls; switched off
    (`enabled`) by the whole-graph check, it runs the operator's eager call instead."""

    def __init__(
        self,
        kernel: Callable[..., tuple[torch.Tensor, ...]],
        single: bool,
        report: TaskReport,
        eager: Callable[[Sequence[torch.Tensor]], tuple[torch.Tensor, ...]],
    ):
        # A JIT kernel's call generated for it (`JitKernel.call`): a layer less per call. The
        # whole-graph check swaps this attribute to see the inputs each kernel gets.
        self.kernel = getattr(kernel, "call", kernel)
        self.single = single
        self.report = report
        self.eager = eager
        self.enabled = True
        self.__name__ = "kope_kernel"

    def __call__(self, *inputs: torch.Tensor) -> Any:
        if self.enabled:
            self.report.calls += 1
            outputs = self.kernel(*inputs)
        else:
            outputs = self.eager(inputs)
        return outputs[0] if self.single else outputs


@functools.cache
def target_for(name: str, workers: int, timeout_s: float) -> Target:
    """One target (and its worker pool) per configuration per process."""
    return get_target(name, workers=workers, timeout_s=timeout_s)


_STORES: dict[Path, ExperienceStore] = {}


def store_at(path: Path) -> ExperienceStore:
    path = path.expanduser().resolve()
    if path not in _STORES:
        try:
            _STORES[path] = ExperienceStore(path)
        except StoreError as err:
            raise KopeError(str(err)) from None
    return _STORES[path]


def compile_graph(gm: fx.GraphModule, options: Options) -> tuple[fx.GraphModule, GraphReport]:
    """Rewrite `gm` (an aten graph) in place to run the chosen kernels; returns it and a report.
    Its outputs keep the strides the trace gave them (eager's), whatever layout a kernel or
    rewrite chose (`InLayout`)."""
    start = time.perf_counter()
    layouts = output_layouts(gm)
    target = target_for(options.target, options.workers, options.timeout_s)
    store = store_at(options.store_path)
    events = recording(store)
    take_apart = options.kernels == "reference" or options.optimize
    part = None
    if not take_apart and options.kernels == "auto" and has_fast_path(gm):
        gm, part = _fast_paths_taken_apart(gm, target, store, options)
    if part is None:
        # Under `reference` every operator is to run its reference lowering: no library call
        # (oneDNN's fused convolutions, one attention call) stands in for operators.
        library = options.kernels != "reference"
        part = partition(
            gm, target, fuse=options.fuse, fast_paths=take_apart, onednn=library, attention=library
        )
    graph = GraphReport(
        views=part.views,
        rewrites=part.rewrites,
        policy=options.kernels,
        structure=graph_structure(gm),
    )
    graph.eager = [
        EagerReport(e.op, e.reason, e.compute, eager_label(e.node) if e.compute else "")
        for e in part.eager
    ]
    for e in part.eager:
        if e.compute:
            log.info("eager %s: %s", e.op, e.reason)
    if options.optimize and options.kernels == "auto":
        _optimize_unseen(part.tasks, target, store, options, events)
    for task in part.tasks:
        choice = choose(task, target, store, options.kernels, events)
        entry = TaskReport(
            label=task.label,
            key=task.key,
            op=task.op,
            kernel=choice.kernel,
            reason=choice.reason,
            eager_us=choice.eager_us,
            kernel_us=choice.kernel_us,
            verdict=choice.verdict,
            quality=choice.quality,
            attempt=choice.attempt,
        )
        if choice.source is not None:
            try:
                kernel = target.load(task.spec, choice.source)
            except Exception as err:  # verified in a worker, so this is a KOPE defect
                log.error("could not load the verified kernel of %s: %s", task.label, err)
                entry.kernel, entry.reason = "eager", f"kernel failed to load: {err}"
            else:
                single = len(task.spec.outputs) == 1 and not _is_multi(task.node)
                eager = _eager_graph(task, single)
                _install(gm, task, KernelCall(kernel, single, entry, eager))
        log.info("%s -> %s (%s)", task.label, entry.kernel, entry.reason)
        events.emit(
            ChoiceMade(task.key, task.label, entry.kernel, entry.reason, None, entry.quality)
        )
        graph.tasks.append(entry)
    if any(task.jit for task in graph.tasks) or graph.rewrites:
        _outputs_in_layouts(gm, layouts)
    lean(gm)
    gm.graph.lint()
    gm.recompile()
    graph.compile_s = time.perf_counter() - start
    add_graph(graph)
    return gm, graph


Layout = tuple[tuple[int, ...], tuple[int, ...]]


def output_layouts(gm: fx.GraphModule) -> list[Layout | None]:
    """Each output's traced (shape, strides); None where it is no tensor or its shape moves."""
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    layouts: list[Layout | None] = []
    for arg in pytree.tree_leaves(output.args[0]):
        val = arg.meta.get("val") if isinstance(arg, fx.Node) else None
        if isinstance(val, torch.Tensor) and val.layout == torch.strided and not has_symbols(val):
            layouts.append((tuple(val.shape), tuple(val.stride())))
        else:
            layouts.append(None)
    return layouts


class InLayout:
    """An output given in the strides the trace gave it (eager's): a kernel writes its result
    contiguous where eager's follows its input's layout (a channels-last convolution's output
    permuted back is contiguous in eager and strided from a kernel, and `.view(-1)` of it
    raised). One comparison per call; a copy only where the strides differ."""

    def __init__(self, layout: Layout):
        self.shape, self.stride = layout
        # Strides of dims of size 1 say nothing: any is as good as eager's.
        self.dims = [d for d, size in enumerate(self.shape) if size > 1]
        self.__name__ = "kope_in_layout"

    def __call__(self, value: torch.Tensor) -> torch.Tensor:
        stride = value.stride()
        if all(stride[d] == self.stride[d] for d in self.dims):
            return value
        fresh = torch.empty_strided(self.shape, self.stride, dtype=value.dtype, device=value.device)
        return fresh.copy_(value)


def _outputs_in_layouts(gm: fx.GraphModule, layouts: list[Layout | None]) -> None:
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    leaves, spec = pytree.tree_flatten(output.args[0])
    if len(leaves) != len(layouts):
        return  # the partition's rewrites changed what the graph returns: nothing to match
    fixed = []
    for leaf, layout in zip(leaves, layouts, strict=True):
        if isinstance(leaf, fx.Node) and layout is not None:
            with gm.graph.inserting_before(output):
                node = gm.graph.call_function(InLayout(layout), (leaf,))
            node.meta = dict(leaf.meta)
            leaf = node
        fixed.append(leaf)
    output.args = (pytree.tree_unflatten(fixed, spec),)


def _install(gm: fx.GraphModule, task: Task, call: KernelCall) -> None:
    """The Task's node made a call of its kernel; the rest of a fused chain goes."""
    task.node.target = call
    task.node.args = tuple(task.input_nodes)
    task.node.kwargs = {}
    for inner in reversed(task.nodes[:-1]):
        gm.graph.erase_node(inner)


def without_dropped_kernels(
    gm: fx.GraphModule, compiled: fx.GraphModule, report: GraphReport, options: Options
) -> fx.GraphModule | None:
    """`gm` (the same aten graph `compiled` was compiled from, traced again) compiled with the
    kernels of `compiled` that are still switched on, and every operator whose kernel the
    whole-graph check switched off left as ATen's, made lean like any other; None where
    nothing was switched off or the partition differs.

    A switched-off kernel's node calls the operator's own nodes as a small graph: one Python
    call more than eager, and out of reach of the lean rewrites (a linear as one call), which
    cost hand-written attention's graph 13 µs of 326 once its agent kernel was dropped."""
    calls = [n.target for n in compiled.graph.nodes if isinstance(n.target, KernelCall)]
    if all(call.enabled for call in calls):
        return None
    target = target_for(options.target, options.workers, options.timeout_s)
    take_apart = options.kernels == "reference" or options.optimize
    if not take_apart and has_fast_path(gm):
        return None  # taken apart or not by what the store held then: not rebuilt
    layouts = output_layouts(gm)
    part = partition(gm, target, fuse=options.fuse, fast_paths=take_apart)
    if [t.key for t in part.tasks] != [entry.key for entry in report.tasks]:
        return None
    installed = {id(call.report): call for call in calls if call.enabled}
    for task, entry in zip(part.tasks, report.tasks, strict=True):
        call = installed.get(id(entry))
        if call is not None:
            _install(gm, task, call)
    _outputs_in_layouts(gm, layouts)
    lean(gm)
    gm.graph.lint()
    gm.recompile()
    return gm


def _fast_paths_taken_apart(
    gm: fx.GraphModule, target: Target, store: ExperienceStore, options: Options
) -> tuple[fx.GraphModule, Partition | None]:
    """The graph to compile, decomposed with its partition when its fused fast paths should
    be taken apart; `gm` and None when they stay whole.

    A fast path (nn.TransformerEncoderLayer's) is one native kernel, faster than its parts run
    one by one; its decomposition can pay only if the store has kernels for its parts. Then
    the decomposed graph is compiled, and the whole-graph check times it against the eager
    graph, which runs the fast path whole: it is kept only if it wins."""
    decomposed = copy.deepcopy(gm)
    part = partition(decomposed, target, fuse=options.fuse, fast_paths=True)
    threads = threads_now()
    known = [t for t in part.tasks if winner(store.attempts(t.key), threads).pinned is not None]
    if not known:
        log.info("fused fast path kept whole: no kernel known for its decomposition's parts")
        return gm, None
    log.info(
        "fused fast path taken apart: %d of its decomposition's %d Tasks have kernels",
        len(known),
        len(part.tasks),
    )
    return decomposed, part


def settle_graph(
    eager_graph: Callable[..., Any],
    compiled: fx.GraphModule,
    report: GraphReport,
    inputs: Sequence[Any],
    options: Options,
) -> Callable[..., Any]:
    """What runs: the compiled graph or `eager_graph`, whichever is faster, at the thread count
    that runs it fastest, by timing them against each other (`kope.frontend.whole_graph`); the
    kernels that do not pay inside the compiled graph are switched off."""
    if any(isinstance(x, torch._subclasses.FakeTensor) for x in inputs):
        log.info("the graph was compiled on fake inputs; its kernels run untimed as a whole")
        return compiled.forward
    calls = [n.target for n in compiled.graph.nodes if isinstance(n.target, KernelCall)]
    counted = [c.report.calls for c in calls]
    store = store_at(options.store_path)
    target = target_for(options.target, options.workers, options.timeout_s)
    try:
        # The timing calls the graphs many times: a model that draws random numbers must see
        # the generator where eager would have left it.
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            decision = settle(
                eager_graph,
                compiled.forward,
                calls,
                inputs,
                structure=report.structure,
                store=store,
                target=target,
                events=recording(store),
                report=report,
            )
    finally:
        for call, count in zip(calls, counted, strict=True):
            call.report.calls = count  # the timing's calls are not the model's
    graph = compiled.forward if decision.compiled else eager_graph
    return graph if decision.threads is None else AtThreads(graph, decision.threads)


def _optimize_unseen(
    tasks: list[Task], target: Target, store: ExperienceStore, options: Options, events: Events
) -> None:
    """Run the agent on each distinct operator that has no agent attempts in the store yet."""
    from kope.agents import make_agent
    from kope.tuner.optimize import Budget, optimize_task
    from kope.vocabulary.evidence import SOURCE_AGENT

    seen: set[str] = set()
    agent = None
    try:
        for task in tasks:
            if task.key in seen:
                continue
            seen.add(task.key)
            store.refresh()
            if any(a.source == SOURCE_AGENT for a in store.attempts(task.key)):
                continue
            agent = agent or make_agent(options.agent, prior=options.prior)
            summary = optimize_task(
                task, target, store, agent, Budget(attempts=options.budget), events=events
            )
            log.info("optimized %s: %s (%s)", task.label, summary.winner, summary.stopped)
    finally:
        if agent is not None:
            agent.close()


def _eager_graph(task: Task, single: bool) -> Callable[[Sequence[torch.Tensor]], tuple[Any, ...]]:
    """The Task's own ATen nodes as a small graph: what its call runs once the whole-graph
    check drops its kernel. Generated code, like the graph it came from, so a dropped kernel
    costs one call more than eager, not an interpreter of its `OpCall`s."""
    # Its generated `forward`, not the module: `nn.Module.__call__` costs 4-8 µs a call.
    forward = subgraph(task.input_nodes, task.nodes, task.node, as_tuple=single).forward

    def run(inputs: Sequence[torch.Tensor]) -> tuple[Any, ...]:
        return tuple(forward(*inputs))

    return run


def _is_multi(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), (tuple, list))
