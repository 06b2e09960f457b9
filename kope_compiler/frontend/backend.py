"""The `kope` backend of `torch.compile`.

Registered through the `torch_dynamo_backends` entry point, so `torch.compile(model,
backend="kope")` works without importing kope. The dynamo graph goes through `aot_autograd`
to an aten inference graph; `kope.frontend.compiler` does the rest. A graph that needs gradients is
split by `aot_autograd` into a forward graph, which KOPE compiles like an inference graph
(its outputs include what the backward saves), and a backward graph, which ATen runs as
traced; that pair runs only where a whole training step beats dynamo's graph with eager's
autograd (`_training`).
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.exc import RestartAnalysis
from torch._functorch.aot_autograd import aot_export_joint_simple
from torch._subclasses.fake_tensor import unset_fake_temporarily

from kope.core.decompositions import traced_whole
from kope.core.errors import KopeError, first_line
from kope.core.options import Options
from kope.frontend.compiler import compile_graph, settle_graph, without_dropped_kernels
from kope.frontend.dispatch import has_symbols
from kope.frontend.report import GraphReport, add_failure, drop_graph
from kope.frontend.whole_graph import AtThreads, settle_training_step
from kope.targets import target_class

log = logging.getLogger("kope.compiler")

# Input signatures a shape-generic graph is specialised for (`ShapeSpecializer`).
MAX_SPECIALIZATIONS = 8


def kope_backend(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    options: dict[str, Any] | None = None,
    mode: str | None = None,
) -> Callable[..., Any]:
    """Compile a dynamo graph; `options` are `kope.core.options.Options` fields.

    Errors meant for the user (`KopeError`: a bad option, a target that cannot run here)
    propagate, and so do dynamo's requests to trace the frame again (`RestartAnalysis`:
    under `dynamic=True`, aot_autograd asks for a float it could not turn into a tensor to be
    specialised). Any other failure is a KOPE bug: the graph runs as dynamo traced it and the
    error is logged with its traceback, so a model never breaks on it; `KOPE_STRICT=1` (the
    test suite sets it) raises instead."""
    opts = Options.parse(options)
    _require_target(opts.target)
    if mode not in (None, "default"):
        log.info("torch.compile mode=%r has no effect on the kope backend", mode)
    try:
        return _backend(gm, example_inputs, opts)
    except (KopeError, RestartAnalysis):
        raise
    except Exception as err:
        if os.environ.get(STRICT_ENV, "").strip() not in ("", "0"):
            raise
        log.error(
            "compiling this graph failed (%s: %s); it runs as dynamo traced it. This is a "
            "KOPE bug: please report it with this log (%s=1 raises instead)",
            type(err).__name__,
            first_line(err),
            STRICT_ENV,
            exc_info=True,
        )
        add_failure(f"{type(err).__name__}: {first_line(err)} (a KOPE bug; {STRICT_ENV}=1 raises)")
        return gm.forward


# Set (to anything but 0) to let a failure to compile a graph raise instead of running it as
# dynamo traced it.
STRICT_ENV = "KOPE_STRICT"


def _backend(
    gm: fx.GraphModule, example_inputs: Sequence[Any], opts: Options
) -> Callable[..., Any]:
    if _needs_gradients(example_inputs):
        return _training(gm, example_inputs, opts)
    if has_symbols(list(example_inputs)):
        generic = GenericGraph.compile(gm, example_inputs, opts)
        if generic is not None:
            return generic
        log.info(
            "the graph has symbolic shapes (dynamo's automatic dynamic shapes) and no operator "
            "of static shape with a kernel; KOPE specialises it per static shape. "
            "torch.compile(..., dynamic=False) avoids this."
        )
        return ShapeSpecializer(gm, opts)
    return _compile(gm, example_inputs, opts)


def _require_target(name: str) -> None:
    """A compiled model runs its kernels in this process: the target's device and toolchain
    must be here (`kope precompile` may still verify kernels without them)."""
    reason = target_class(name).unavailable()
    if reason:
        raise KopeError(f"target={name!r} cannot run a compiled model here: {reason}")


def _compile(
    gm: fx.GraphModule, example_inputs: Sequence[Any], opts: Options
) -> Callable[..., Any]:
    """The dynamo graph to an aten graph with the same calling convention, compiled.

    `aot_export_joint_simple` gives an inference graph that takes and returns exactly what
    the dynamo graph does, so the compiled graph is called directly: no aot_autograd runtime
    wrappers (tens of microseconds per call on a small model). Graphs it refuses (an input
    mutated, an output aliasing an input) go through `aot_autograd`, whose wrappers handle
    them.
    """
    try:
        aten_gm = aten_inference_graph(gm, example_inputs)
    except Exception as err:  # the simple export refuses mutation and aliasing, among others
        log.debug("simple export refused (%s: %s); using aot_autograd", type(err).__name__, err)
        return _aot(gm, example_inputs, opts)
    compiled, report = compile_graph(aten_gm, opts)
    # Under `auto`, the compiled graph must beat eager's as a whole, and either runs at the
    # thread count that runs it fastest; `reference` and `eager` force their choice.
    if opts.kernels == "auto":
        graph = settle_graph(gm.forward, compiled, report, example_inputs, opts)
        if report.whole is None or not report.whole.compiled:
            return graph  # eager's graph, or one compiled on fake inputs with every kernel
        rebuilt = without_dropped_kernels(
            aten_inference_graph(gm, example_inputs), compiled, report, opts
        )
        if rebuilt is None:
            return graph
        log.debug("the graph is compiled again without the kernels it dropped")
        threads = report.whole.threads
        return rebuilt.forward if threads is None else AtThreads(rebuilt.forward, threads)
    if not any(task.jit for task in report.tasks) and not report.rewrites:
        return gm.forward
    return compiled.forward


def aten_inference_graph(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> fx.GraphModule:
    """The aten inference graph of a dynamo graph, taking and returning exactly what it does;
    raises for graphs that mutate an input or return an alias of one. Interpolations stay one
    node each (`kope.core.decompositions.traced_whole`)."""
    with traced_whole():
        aten_gm = aot_export_joint_simple(gm, tuple(example_inputs), trace_joint=False)
    assert isinstance(aten_gm, fx.GraphModule)  # typed as a callable; a graph in fact
    placeholders = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        # An operator with a side effect (linalg.cholesky's error check) threads an effect
        # token through the graph: another calling convention, which aot_autograd's wrappers
        # handle and a direct call does not.
        raise ValueError(
            f"the exported graph takes {len(placeholders)} inputs for the dynamo graph's "
            f"{len(example_inputs)} (an effect token)"
        )
    return aten_gm


def _aot(gm: fx.GraphModule, example_inputs: Sequence[Any], opts: Options) -> Callable[..., Any]:
    """aot_autograd to an aten inference graph, compiled by `compile_graph`.

    The graphs that come this way write into their inputs (a cache updated in place, batch
    norm's running statistics in train mode) or return views of them. aot_autograd hands KOPE
    a functional graph, which returns the new values instead of writing them, so under `auto`
    it is timed against itself uncompiled like any graph (`settle_graph`) without touching the
    caller's tensors. When no operator got a JIT kernel and nothing was rewritten, or the
    compiled graph lost, the dynamo graph itself runs: it computes the same ATen calls without
    aot_autograd's runtime wrappers.
    """
    report: GraphReport | None = None
    reached = False  # whether aot_autograd got as far as handing KOPE a graph

    def forward_compiler(aten_gm: fx.GraphModule, fw_inputs: Sequence[Any]) -> Callable[..., Any]:
        nonlocal report, reached
        reached = True
        graph, report = _settled_forward(aten_gm, fw_inputs, example_inputs, opts)
        return make_boxed_func(graph)

    try:
        with traced_whole():  # as `aten_inference_graph` traces
            compiled = aot_autograd(fw_compiler=forward_compiler)(gm, example_inputs)
    except (KopeError, RestartAnalysis):
        raise
    except Exception as err:
        if reached:
            raise  # KOPE's own compile failed: `kope_backend` says so
        # aot_autograd refuses some graphs dynamo accepts (it cannot functionalize
        # `prims.split_dim`, whose output aliases its input): no ATen graph, no Tasks.
        log.warning(
            "aot_autograd cannot turn this graph into ATen operators (%s: %s); it runs as "
            "dynamo traced it",
            type(err).__name__,
            first_line(err, 200),
        )
        add_failure(f"aot_autograd refused it ({first_line(err, 200)})")
        return gm.forward
    if report is None or not _uses_kernels(report):
        log.debug("no operator of this graph runs a JIT kernel: running the graph eagerly")
        return gm.forward
    if report.whole is not None and not report.whole.compiled:
        return gm.forward  # eager's graph won: without aot_autograd's wrappers
    return compiled


def _settled_forward(
    fw_gm: fx.GraphModule,
    fw_inputs: Sequence[Any],
    example_inputs: Sequence[Any],
    opts: Options,
) -> tuple[Callable[..., Any], GraphReport]:
    """aot_autograd's forward graph compiled, and what runs of it: under `auto`, the compiled
    graph or the graph uncompiled, whichever is faster (`settle_graph`), timed on the dynamo
    graph's own inputs where the forward takes exactly those."""
    uncompiled = fx.GraphModule(fw_gm, copy.deepcopy(fw_gm.graph))
    compiled, report = compile_graph(fw_gm, opts)
    graph: Callable[..., Any] = compiled.forward
    if opts.kernels == "auto" and _uses_kernels(report):
        timed = example_inputs if _same_layouts(example_inputs, fw_inputs) else fw_inputs
        with unset_fake_temporarily():  # aot compiles under its fake mode; timing is real
            graph = settle_graph(uncompiled.forward, compiled, report, timed, opts)
    return graph, report


def _training(
    gm: fx.GraphModule, example_inputs: Sequence[Any], opts: Options
) -> Callable[..., Any]:
    """A graph that needs gradients, through `aot_autograd`: KOPE compiles its forward graph,
    ATen runs its backward graph as traced, and autograd joins them as for any backend.

    The forward graph's extra outputs are what the backward saves; the backward was traced on
    their traced layouts, which `compile_graph` keeps. Under `auto` the forward is first
    timed against itself uncompiled (on the dynamo graph's own inputs where it takes exactly
    those), then a whole training step
    (forward and backward) against dynamo's graph with eager's autograd: aot_autograd's
    wrappers and a backward run as an fx graph cost what small kernels may not win back (a
    SwiGLU block's step took 1.34x eager's with four kernels that beat eager in its forward).
    Dynamo's graph runs unless the step beats it; so does a graph where no operator runs a
    kernel, or a shape-generic one."""
    if has_symbols(list(example_inputs)):
        log.info(
            "a training graph with symbolic shapes runs eagerly: KOPE specialises shapes for "
            "inference graphs only (torch.compile(..., dynamic=False) avoids this)"
        )
        return gm.forward
    reports: list[GraphReport] = []

    def forward_compiler(fw_gm: fx.GraphModule, fw_inputs: Sequence[Any]) -> Callable[..., Any]:
        graph, report = _settled_forward(fw_gm, fw_inputs, example_inputs, opts)
        reports.append(report)
        return make_boxed_func(graph)

    def backward_compiler(bw_gm: fx.GraphModule, _inputs: Sequence[Any]) -> Callable[..., Any]:
        return make_boxed_func(bw_gm.forward)

    with traced_whole():  # as `aten_inference_graph` traces
        compiled = aot_autograd(fw_compiler=forward_compiler, bw_compiler=backward_compiler)(
            gm, example_inputs
        )
    if not reports:  # aot_autograd compiled no forward graph (it has no other road today)
        return compiled
    report = reports[-1]
    if not _uses_kernels(report):  # as in `_aot`: the same ATen calls, without aot's wrappers
        report.training = (
            "needs gradients: no kernel runs in its forward, so dynamo's graph runs, with "
            "eager's autograd"
        )
        return gm.forward
    if opts.kernels != "auto":
        report.training = "needs gradients: KOPE's forward runs, and ATen's backward as traced"
        return compiled
    if report.whole is not None and not report.whole.compiled:
        report.training = "needs gradients: dynamo's graph runs, with eager's autograd"
        return gm.forward
    return _StepDecidedAtFirstCall(gm.forward, compiled, report)


class _StepDecidedAtFirstCall:
    """Runs aot_autograd's function with KOPE's forward, or dynamo's graph, whichever ran a
    training step faster (`settle_training_step`), timed at the first call: a backward run
    while dynamo compiles trips its compile metrics, and the first call has real inputs."""

    def __init__(
        self, eager: Callable[..., Any], compiled: Callable[..., Any], report: GraphReport
    ):
        self.eager = eager
        self.compiled = compiled
        self.report = report
        self.chosen: Callable[..., Any] | None = None

    def __call__(self, *args: Any) -> Any:
        if self.chosen is None:
            try:
                runs, reason = settle_training_step(self.eager, self.compiled, args)
            except Exception as err:  # the model must still run: eagerly, saying why
                log.warning(
                    "timing the training step failed (%s: %s)", type(err).__name__, first_line(err)
                )
                runs, reason = False, "dynamo's graph runs, with eager's autograd: timing failed"
            self.report.training = f"needs gradients: {reason}"
            self.chosen = self.compiled if runs else self.eager
        return self.chosen(*args)


def _uses_kernels(report: GraphReport) -> bool:
    return any(task.jit for task in report.tasks) or bool(report.rewrites)


def _needs_gradients(example_inputs: Sequence[Any]) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs
    )


def _same_layouts(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether two input lists hold tensors of the same shapes, strides and dtypes in order."""

    def layout(x: Any) -> Any:
        return (tuple(x.shape), x.stride(), x.dtype) if isinstance(x, torch.Tensor) else type(x)

    return len(a) == len(b) and all(layout(x) == layout(y) for x, y in zip(a, b, strict=True))


class GenericGraph:
    """A shape-generic graph compiled once: its operators of static shape on their kernels,
    those whose shapes move (a decoding step's key and value cache, its attention) on ATen, as
    the partition leaves any operator of symbolic shape; the whole-graph check runs at the
    first call, on its concrete inputs, and its choice serves every shape.

    Compiled per shape instead (`ShapeSpecializer`), a decoding loop paid a compile and a
    whole-graph timing for every new length (3-4 s each for a GPT-2-small block), or ran as
    dynamo traced it. The graph is traced with dynamo's own symbolic inputs and its shape
    environment's guards suppressed: reading a size while compiling must not specialise the
    graph dynamo made generic (it would then recompile for every length)."""

    def __init__(
        self,
        gm: fx.GraphModule,
        compiled: fx.GraphModule,
        report: GraphReport,
        scalars: dict[int, Any],
        opts: Options,
    ):
        self.gm = gm
        self.compiled = compiled
        self.report = report
        self.scalars = scalars
        self.opts = opts
        self.chosen: Callable[..., Any] | None = None
        self.specializer: ShapeSpecializer | None = None

    @classmethod
    def compile(
        cls, gm: fx.GraphModule, example_inputs: Sequence[Any], opts: Options
    ) -> GenericGraph | None:
        """The graph compiled once, or None where no operator of static shape has a kernel
        (or it cannot be traced generically): then it is specialised per shape."""
        envs = [
            s.node.shape_env
            for x in example_inputs
            for s in ([x] if isinstance(x, torch.SymInt) else list(getattr(x, "shape", ())))
            if isinstance(s, torch.SymInt)
        ]
        if not envs:
            return None
        try:
            scalars = {i: example_inputs[i].item() for i in _read_as_scalars(gm)}
            with envs[0].suppress_guards():
                traced = _with_scalars(gm, scalars) if scalars else gm
                compiled, report = compile_graph(aten_inference_graph(traced, example_inputs), opts)
        except (KopeError, RestartAnalysis):
            raise
        except Exception as err:
            log.info(
                "the shape-generic graph cannot be compiled once (%s: %s); it is specialised "
                "per shape",
                type(err).__name__,
                first_line(err, 200),
            )
            return None
        if not any(task.jit for task in report.tasks):
            drop_graph(report)
            return None  # every operator's shape moves: a compile per shape gives them kernels
        if any(has_symbols((n.args, n.kwargs)) for n in compiled.graph.nodes):
            # A rewrite wrote a size of the trace into a node: right for that shape alone.
            log.info("the shape-generic graph holds a traced size; it is specialised per shape")
            drop_graph(report)
            return None
        return cls(gm, compiled, report, scalars, opts)

    def __call__(self, *args: Any) -> Any:
        if any(args[i].item() != value for i, value in self.scalars.items()):
            # A float attribute changed since the graph was compiled with it as a constant.
            if self.specializer is None:
                self.specializer = ShapeSpecializer(self.gm, self.opts)
            return self.specializer(*args)
        if self.chosen is None:
            if self.opts.kernels == "auto":
                self.chosen = settle_graph(
                    self.gm.forward, self.compiled, self.report, list(args), self.opts
                )
            else:
                self.chosen = self.compiled.forward
        return self.chosen(*args)


def _read_as_scalars(gm: fx.GraphModule) -> set[int]:
    """The inputs the graph reads only through `.item()`: under `dynamic=True` dynamo passes a
    module's float attribute (a layer norm's eps) as a 0-d tensor read that way, which a
    trace on fake tensors cannot read."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return {
        index
        for index, node in enumerate(placeholders)
        if node.users
        and all(user.op == "call_method" and user.target == "item" for user in node.users)
    }


def _with_scalars(gm: fx.GraphModule, values: dict[int, Any]) -> fx.GraphModule:
    """A copy of `gm` in which each input of `values` (by position) read with `.item()` is
    that value, a constant (the input stays, unused)."""
    graph = copy.deepcopy(gm.graph)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for index, value in values.items():
        for item in list(placeholders[index].users):
            for user in list(item.users):
                user.args = _replaced(user.args, item, value)
                user.kwargs = _replaced(user.kwargs, item, value)
            graph.erase_node(item)
    graph.lint()
    return fx.GraphModule(gm, graph)


def _replaced(args: Any, node: fx.Node, value: Any) -> Any:
    return fx.node.map_aggregate(args, lambda a: value if a is node else a)


class ShapeSpecializer:
    """Compiles a shape-generic dynamo graph once per concrete input signature: the inputs'
    shapes, and the values of the inputs it reads only as scalars (`_read_as_scalars`),
    compiled as constants.

    A signature is compiled the second time it is called, its first call running the graph
    as dynamo traced it: a shape that comes once (the growing key and value cache of a
    decoding loop: every step a new length) would otherwise pay a compile and the
    whole-graph timing for one call, 3-4 s for a GPT-2-small block against a few ms; shapes
    that repeat (a server's batch sizes) are compiled at their second call. A graph called
    with more than `MAX_SPECIALIZATIONS` signatures varies too much to be specialised: from
    then on it runs as dynamo traced it for every signature not compiled yet (a second
    decoding loop would otherwise compile every length the first one saw once)."""

    def __init__(self, gm: fx.GraphModule, opts: Options):
        self.gm = gm
        self.opts = opts
        self.scalars = _read_as_scalars(gm)
        self.compiled: dict[tuple[Any, ...], Callable[..., Any]] = {}
        self.seen_once: set[tuple[Any, ...]] = set()
        self._warned = False

    def __call__(self, *args: Any) -> Any:
        signature = tuple(
            ("scalar", a.item())
            if index in self.scalars
            else (tuple(a.shape), a.dtype, a.device)
            if isinstance(a, torch.Tensor)
            else a
            for index, a in enumerate(args)
        )
        fn = self.compiled.get(signature)
        if fn is None:
            if len(self.seen_once) + len(self.compiled) >= MAX_SPECIALIZATIONS:
                if not self._warned:
                    log.warning(
                        "a graph called with more than %d input shapes; running its shapes "
                        "not compiled yet as dynamo traced them",
                        MAX_SPECIALIZATIONS,
                    )
                    self._warned = True
                return self.gm(*args)
            if signature not in self.seen_once:
                self.seen_once.add(signature)
                return self.gm(*args)
            self.seen_once.discard(signature)
            try:
                gm = self.gm
                if self.scalars:
                    gm = _with_scalars(gm, {i: args[i].item() for i in self.scalars})
                fn = _compile(gm, list(args), self.opts)
            except KopeError:
                raise  # meant for the user (a bad option, a target that cannot run)
            except Exception as err:
                # A shape-generic graph may hold what its concrete values cannot trace: it
                # still runs.
                log.warning(
                    "compiling the graph for input shapes %s failed (%s: %s); running it "
                    "eagerly for them",
                    [s[0] if isinstance(s, tuple) and s[0] != "scalar" else s for s in signature],
                    type(err).__name__,
                    first_line(err, 200),
                )
                fn = self.gm
            self.compiled[signature] = fn
        return fn(*args)
