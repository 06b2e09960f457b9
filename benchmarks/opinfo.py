"""PyTorch's OpInfo database through `torch.compile(backend="kope")`: is every answer right?

    python benchmarks/opinfo.py [--ops add,nn.functional.relu] [--sample 30 --seed 0]
                                [--limit-samples 2] [--kernels reference,auto]
                                [--timeout 300] [--jobs 1] [--store DIR] [--report out.json]

Every operator of `torch.testing._internal.common_methods_invocations.op_db` (it ships with
torch; importing it needs `expecttest`, in KOPE's `test` extra), or the `--ops` named, or a
seeded random `--sample` of them, is checked on its first `--limit-samples` sample inputs in
float32 (another dtype where the operator has no float32 on the CPU), once per `--kernels`
mode, each operator and mode in a process of its own with its own empty store (`--store`
shares one). The processes are forked from one server that imported torch, KOPE and op_db
once, so a child costs its compiles (~4 s an operator), not a fresh interpreter's imports too.
For each sample the child runs eager twice, then
`torch.compile(backend="eager")`, then `torch.compile(backend="kope", options={"kernels": K})`,
all under `torch.no_grad()`, and compares KOPE's result with eager's (NaN equals NaN, a
tolerance per dtype). Each sample ends as one outcome:

- `right`: KOPE's result matches eager's;
- `wrong answer`: it does not (dtype, shape or values);
- `exception`: KOPE raised where `torch.compile(backend="eager")` did not;
- `process died`: the child died (a signal, or an exit without a result) in KOPE's part;
- `timeout`: the child ran past `--timeout` in KOPE's part;
- `eager fails or is random`: eager raises (or hangs, or dies), its two runs differ (random
  operators, uninitialized memory such as `empty_like`), `backend="eager"` fails too, or
  KOPE's answer differs where eager drew random numbers (an operator tagged
  `nondeterministic_seeded`: a statistic of the draws can agree between eager's two runs);
- `no sample`: the operator has no CPU dtype or no sample input.

A child that dies is recorded, and a new one goes on with the operator's next sample. The
figure beside the outcomes is the share of tested operators (at least one sample compared)
on which at least one KOPE kernel ran rather than ATen (`kope.report()`: a Task with a JIT
kernel and calls > 0). The report (`--report`) keeps every sample: its inputs, its outcome
with the error, and which operators of its graph ran on KOPE kernels and which on ATen.

`benchmarks/torch_mlir_e2e.py` runs torch-mlir's e2e suite the same way, with this file's
child runner, comparison and tables. A small fixed sample of this harness runs in the test
suite (`test/test_external_suites.py`).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import math
import multiprocessing
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from tqdm import tqdm

import kope

HERE = Path(__file__).resolve().parent

# -- outcomes -------------------------------------------------------------------------------------

RIGHT = "right"
WRONG = "wrong answer"
EXCEPTION = "exception"
DIED = "process died"
TIMEOUT = "timeout"
EAGER_FAILS = "eager fails or is random"
NO_SAMPLE = "no sample"
NOT_LOADABLE = "not loadable"  # torch-mlir's e2e suite: the test's module does not import
# Worst first: an item's outcome is its worst sample's; the table lists problems first.
OUTCOMES = (DIED, TIMEOUT, WRONG, EXCEPTION, RIGHT, EAGER_FAILS, NOT_LOADABLE, NO_SAMPLE)
PROBLEMS = (DIED, TIMEOUT, WRONG, EXCEPTION)

KERNEL_MODES = ("reference", "auto")
DEFAULT_TIMEOUT_S = 300.0
# Children print their events as lines with this prefix on stdout, among whatever else torch,
# torch-mlir or the code under test prints there.
EVENT_PREFIX = "@@kope-suite "

# (rtol, atol) per dtype, as KOPE's verifier holds its kernels (`kope.targets.verify`), kept
# here so that this harness judges independently of the code it checks. Others: exact.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-2),
    torch.complex128: (1e-7, 1e-9),
    torch.complex64: (1e-4, 1e-5),
}
Tolerance = Callable[[torch.dtype], tuple[float, float]]
# What `check_once` applies to each callable it runs: the identity, or `torch.compile`.
Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


def dtype_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for a result of `dtype`: `TOLERANCES`, exact for integers and bool."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


def exact(dtype: torch.dtype) -> tuple[float, float]:
    """Two eager runs of a deterministic operator agree to the bit."""
    return (0.0, 0.0)


# -- what one child reports -----------------------------------------------------------------------


@dataclass
class SampleResult:
    """One sample (OpInfo) or one test (torch-mlir) under one kernels mode."""

    index: int
    outcome: str
    detail: str = ""  # the first line of the error or mismatch; empty when right
    inputs: str = ""  # the sample's arguments, shapes and dtypes
    phase: str = ""  # where the outcome arose: eager | dynamo | kope
    kope_ops: list[str] = field(default_factory=list)  # ran on a KOPE kernel
    aten_ops: list[str] = field(default_factory=list)  # compute operators left to ATen
    fallbacks: list[str] = field(default_factory=list)  # graphs whose KOPE compile raised
    error: str = ""  # the end of the traceback or stderr, for the report
    seconds: float = 0.0

    @property
    def ran_kope(self) -> bool:
        return bool(self.kope_ops)


@dataclass
class ItemResult:
    """One operator (OpInfo) or test (torch-mlir) under one kernels mode: all its samples."""

    name: str
    kernels: str
    samples: list[SampleResult] = field(default_factory=list)
    dtype: str = ""
    label: str = ""  # torch-mlir's expectation of the test (`xfail`, `crashing`), if any
    seconds: float = 0.0

    @property
    def outcome(self) -> str:
        if not self.samples:
            return NO_SAMPLE
        return min((s.outcome for s in self.samples), key=OUTCOMES.index)

    @property
    def tested(self) -> bool:
        """At least one sample got as far as comparing KOPE with eager (or KOPE failing)."""
        return any(s.outcome in PROBLEMS or s.outcome == RIGHT for s in self.samples)

    @property
    def ran_kope(self) -> bool:
        return any(s.ran_kope for s in self.samples)

    @property
    def computes(self) -> bool:
        """Its graphs had a compute operator (a view, `split`, `reshape`, has none)."""
        return any(s.kope_ops or s.aten_ops for s in self.samples)


def emit(event: dict[str, Any]) -> None:
    """A child's event to its parent: one prefixed JSON line, flushed before anything else runs
    (the next step may kill the process)."""
    print(EVENT_PREFIX + json.dumps(event), flush=True)


def first_line(text: str, width: int = 200) -> str:
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    return line if len(line) <= width else line[: width - 3] + "..."


def error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def describe(value: Any) -> str:
    """Arguments as a person reads them: tensors as dtype[shape], the rest as repr."""

    def one(leaf: Any) -> str:
        if isinstance(leaf, torch.Tensor):
            return f"{str(leaf.dtype).removeprefix('torch.')}{list(leaf.shape)}"
        return repr(leaf)

    text = str(pytree.tree_map(lambda leaf: _Shown(one(leaf)), value))
    return text if len(text) <= 300 else text[:297] + "..."


class _Shown(str):
    def __repr__(self) -> str:
        return str(self)


# -- comparing ------------------------------------------------------------------------------------


def mismatch(got: Any, want: Any, tolerance: Tolerance = dtype_tolerance) -> str | None:
    """Why `got` is not `want` (structure, dtype, shape, values; NaN equals NaN), or None."""
    got_leaves, got_spec = pytree.tree_flatten(got)
    want_leaves, want_spec = pytree.tree_flatten(want)
    if got_spec != want_spec:
        return f"result structure {got_spec} != eager's {want_spec}"
    for position, (g, w) in enumerate(zip(got_leaves, want_leaves, strict=True)):
        where = f"output {position}: " if len(want_leaves) > 1 else ""
        if isinstance(w, torch.Tensor):
            if not isinstance(g, torch.Tensor):
                return f"{where}got {type(g).__name__}, eager gives a tensor"
            if g.dtype != w.dtype or g.shape != w.shape:
                return f"{where}got {describe(g)}, eager gives {describe(w)}"
            rtol, atol = tolerance(w.dtype)
            try:
                torch.testing.assert_close(
                    g, w, rtol=rtol, atol=atol, equal_nan=True, check_stride=False
                )
            except AssertionError as error:
                return where + " ".join(str(error).split())
        elif isinstance(w, float) and isinstance(g, float):
            rtol, atol = tolerance(torch.float64)
            same = (math.isnan(g) and math.isnan(w)) or math.isclose(
                g, w, rel_tol=rtol, abs_tol=atol
            )
            if not same:
                return f"{where}got {g!r}, eager gives {w!r}"
        elif type(g) is not type(w) or g != w:
            return f"{where}got {g!r}, eager gives {w!r}"
    return None


def clone(value: Any) -> Any:
    """Fresh copies of the tensors of `value`, so that a run cannot change another's inputs."""
    return pytree.tree_map(
        lambda leaf: leaf.clone() if isinstance(leaf, torch.Tensor) else leaf, value
    )


def poison_allocator(outputs: Any) -> None:
    """Fill, then free, blocks the size of `outputs`, so that an operator that returns
    uninitialized memory (`empty_like`) returns different garbage on its next run."""
    blocks = [
        torch.full_like(t, 77)
        for t in pytree.tree_leaves(outputs)
        if isinstance(t, torch.Tensor) and t.layout == torch.strided and not t.is_quantized
    ]
    del blocks


def kernels_that_ran() -> tuple[list[str], list[str], list[str]]:
    """From `kope.report()`: operators that ran on KOPE kernels, those left to ATen, and the
    graphs whose compile raised (KOPE ran them as dynamo traced them)."""
    report = kope.report()
    ran = [t.op for t in report.tasks if t.jit and t.calls > 0]
    aten = [t.op for t in report.tasks if not (t.jit and t.calls > 0)]
    aten += [e.op for e in report.eager if e.compute]
    return sorted(set(ran)), sorted(set(aten)), list(report.failed)


def check_once(
    run: Callable[[Wrap], Any],
    kernels: str,
    tolerance: Tolerance = dtype_tolerance,
    announce: Callable[[str], None] = lambda phase: None,
) -> SampleResult:
    """Eager twice, then dynamo's eager backend, then KOPE, on one sample or test.

    `run(wrap)` computes the sample's result with each callable it calls wrapped by `wrap`
    (the identity for eager, `torch.compile` for the backends). `announce(phase)` is called
    before each phase, so that a parent can tell where a child died.
    """

    def wrapped(backend: str, **options: Any) -> Wrap:
        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            if options:
                return torch.compile(fn, backend=backend, options=options)
            return torch.compile(fn, backend=backend)

        return wrap

    result = SampleResult(index=0, outcome=RIGHT)
    with torch.no_grad():
        announce("eager")
        try:
            with RandomDraws() as draws:
                first = run(lambda fn: fn)
            poison_allocator(first)
            # Not reseeded: a random operator draws other numbers the second time.
            second = run(lambda fn: fn)
        except Exception as error:
            return _failed(result, EAGER_FAILS, "eager", f"eager raises: {error_text(error)}")
        differs = mismatch(second, first, exact)
        if differs is not None:
            return _failed(result, EAGER_FAILS, "eager", f"two eager runs differ: {differs}", "")

        announce("dynamo")
        torch._dynamo.reset()
        dynamo_error: str | None = None
        dynamo_result: Any = None
        try:
            dynamo_result = run(wrapped("eager"))
        except Exception as error:
            dynamo_error = error_text(error)

        announce("kope")
        torch._dynamo.reset()
        kope.reset_report()
        try:
            got = run(wrapped("kope", kernels=kernels))
        except Exception as error:
            if dynamo_error is not None:
                why = f"torch.compile(backend='eager') raises too: {dynamo_error}"
                return _failed(result, EAGER_FAILS, "dynamo", why)
            return _failed(result, EXCEPTION, "kope", error_text(error))
        finally:
            result.kope_ops, result.aten_ops, result.fallbacks = kernels_that_ran()
            torch._dynamo.reset()
    wrong = mismatch(got, first, tolerance)
    if wrong is not None:
        if dynamo_error is None and mismatch(dynamo_result, first, tolerance) is not None:
            why = f"torch.compile(backend='eager') disagrees with eager too: {wrong}"
            return _failed(result, EAGER_FAILS, "dynamo", why, "")
        if draws.ops:
            # Eager's answer is one draw (a statistic of its samples can agree between eager's
            # two runs and still differ in a third): another generator's is not wrong.
            why = f"draws random numbers ({', '.join(sorted(draws.ops))}); KOPE's draw: {wrong}"
            return _failed(result, EAGER_FAILS, "kope", why, "")
        return _failed(result, WRONG, "kope", wrong, "")
    return result


class RandomDraws(TorchDispatchMode):
    """The random operators (ATen's `nondeterministic_seeded` tag) a run calls."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.ops.add(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def _failed(
    result: SampleResult, outcome: str, phase: str, why: str, error: str | None = None
) -> SampleResult:
    result.outcome, result.phase, result.detail = outcome, phase, first_line(why, 400)
    result.error = traceback.format_exc()[-3000:] if error is None else error
    return result


# -- the OpInfo child -----------------------------------------------------------------------------


OP_DB_MODULE = "torch.testing._internal.common_methods_invocations"


def load_op_db() -> list[Any]:
    """`op_db`, imported on demand: it takes ~4 s and needs `expecttest`, and only the
    processes that enumerate or check operators use it (not torch_mlir_e2e.py's)."""
    try:
        op_db = importlib.import_module(OP_DB_MODULE).op_db
    except ModuleNotFoundError as error:
        raise SystemExit(
            f"importing PyTorch's OpInfo database failed ({error}); "
            "`pip install expecttest` (it is in KOPE's `test` extra)"
        ) from error
    return list(op_db)


def op_name(op: Any) -> str:
    """An OpInfo's unique name: `name` or `name.variant_test_name`."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else str(op.name)


def pick_dtype(op: Any) -> torch.dtype | None:
    """float32 where the operator supports it on the CPU, else a fixed choice among its own."""
    supported = op.supported_dtypes("cpu")
    for dtype in (torch.float32, torch.float64, torch.int64, torch.int32, torch.bool):
        if dtype in supported:
            return dtype
    return min(supported, key=str) if supported else None


def sample_call(op: Any, sample: Any) -> tuple[Callable[..., Any], list[torch.Tensor]]:
    """The operator applied to `sample` as a function of the sample's tensors, which become
    the compiled graph's inputs rather than constants baked into it."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    tensors = [leaves[i] for i in positions]

    def call(*given: torch.Tensor) -> Any:
        filled = list(leaves)
        for i, tensor in zip(positions, given, strict=True):
            filled[i] = tensor
        first, args, kwargs = pytree.tree_unflatten(filled, spec)
        return op.op(first, *args, **kwargs)

    return call, tensors


def check_operator(
    name: str,
    kernels: str,
    limit_samples: int = 2,
    start: int = 0,
    announce: Callable[[dict[str, Any]], None] = lambda event: None,
) -> ItemResult:
    """One OpInfo operator's first `limit_samples` samples (from `start`) under `kernels`, in
    this process. `announce` gets an event before each sample's phases and after each sample."""
    matches = [op for op in load_op_db() if op_name(op) == name]
    if not matches:
        raise SystemExit(f"no OpInfo named {name!r}")
    op = matches[0]
    item = ItemResult(name=name, kernels=kernels)
    dtype = pick_dtype(op)
    announce({"event": "item", "dtype": str(dtype)})
    if dtype is None:
        return item
    item.dtype = str(dtype).removeprefix("torch.")
    torch.manual_seed(0)  # the same samples in every child, so `start` means the same one
    samples = list(itertools.islice(op.sample_inputs("cpu", dtype), limit_samples))
    for index, sample in enumerate(samples[start:], start=start):
        began = time.perf_counter()
        call, tensors = sample_call(op, sample)
        inputs = describe((sample.input, sample.args, sample.kwargs))

        def phase(name: str, index: int = index, inputs: str = inputs) -> None:
            announce({"event": "phase", "index": index, "phase": name, "inputs": inputs})

        def run(wrap: Wrap, call: Callable[..., Any] = call, tensors: Any = tensors) -> Any:
            return wrap(call)(*clone(tensors))

        result = check_once(run, kernels, announce=phase)
        result.index, result.inputs = index, inputs
        result.seconds = round(time.perf_counter() - began, 3)
        item.samples.append(result)
        announce({"event": "sample", "result": asdict(result)})
    return item


def child_main(request_json: str) -> None:
    """A child process's entry: `request` names a module's function and its arguments; events
    go to stdout as `EVENT_PREFIX` lines, the last one `done` with the function's value (an
    `ItemResult`'s dtype and label, or a JSON value)."""
    request = json.loads(request_json)
    module = sys.modules[request.pop("module")]
    function: Callable[..., Any] = getattr(module, request.pop("function"))
    value = function(**request, announce=emit)
    if isinstance(value, ItemResult):
        emit({"event": "done", "dtype": value.dtype, "label": value.label})
    else:
        emit({"event": "done", "value": value})


# -- the parent: one child per item and mode ------------------------------------------------------


@dataclass
class Child:
    """How a parent starts a child: which module and function check one item."""

    module: str  # a module in `path`
    function: str
    timeout_s: float
    store: Path | None = None  # shared store; None: a fresh one per child
    path: Path = HERE  # where `module` is (this folder, or a test's)
    # Modules the fork server imports once, beside torch and kope, for every child to share.
    preload: tuple[str, ...] = ()


# Children are forked from one server process that imported torch and kope (and `preload`)
# before it ran any operator: a child starts in ~0.1 s where a fresh interpreter spends ~4 s
# on imports (most of an OpInfo child's time). The server starts with the first child, so the
# first `Child`'s `preload` is the one it keeps.
_FORK = multiprocessing.get_context("forkserver")


def run_child(child: Child, arguments: dict[str, Any]) -> tuple[list[dict[str, Any]], str, str]:
    """Run one child to its end: its events, and how it ended (`ok`, `timeout` or a death in
    words) with the tail of its stderr. Children run in their own session, so that on a
    timeout their workers die with them."""
    request = {"module": child.module, "function": child.function, **arguments}
    home = child.store or Path(tempfile.mkdtemp(prefix="kope-suite-home-"))
    _FORK.set_forkserver_preload(["torch", "kope", *child.preload])
    ended = "ok"
    with tempfile.TemporaryDirectory(prefix="kope-suite-child-") as scratch:
        out_path, err_path = Path(scratch) / "stdout", Path(scratch) / "stderr"
        code = _CHILD_CODE.format(
            scratch=scratch,
            home=str(home),
            path=str(child.path),
            here=str(HERE),
            module=child.module,
            request=json.dumps(request),
        )
        process = _FORK.Process(target=exec, args=(code, {}))
        try:
            process.start()
            process.join(child.timeout_s)
            if process.is_alive():
                ended = TIMEOUT
        finally:
            if process.pid is not None:
                _kill_group(process.pid)  # the child, if it still runs, and workers it left
            process.join()
            if child.store is None:
                shutil.rmtree(home, ignore_errors=True)
        out = out_path.read_text(errors="replace") if out_path.exists() else ""
        err = err_path.read_text(errors="replace") if err_path.exists() else ""
    events = [
        json.loads(line[len(EVENT_PREFIX) :])
        for line in out.splitlines()
        if line.startswith(EVENT_PREFIX)
    ]
    done = any(e["event"] == "done" for e in events)
    code = process.exitcode
    if ended == "ok" and not done:
        if code is not None and code < 0:
            ended = f"killed by {signal.Signals(-code).name}"
        else:
            ended = f"exit code {code} without a result"
    return events, ended, err[-3000:]


# What a forked child runs (as source, so that the server need not import this file to unpickle
# it): its own session, stdout and stderr (C-level writes included) into files, its own store,
# then `module.child_main(request)`.
_CHILD_CODE = """
import os, sys, importlib
os.setsid()
sys.stdout.flush(); sys.stderr.flush()
for fd, name in ((1, "stdout"), (2, "stderr")):
    target = os.open(os.path.join({scratch!r}, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(target, fd)
    os.close(target)
os.environ["KOPE_HOME"] = {home!r}
os.environ.pop("KOPE_STRICT", None)  # a user's setting: the harness measures what users get
sys.path[:0] = [{path!r}, {here!r}]
importlib.import_module({module!r}).child_main({request!r})
sys.stdout.flush()
"""


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_item(child: Child, name: str, kernels: str, extra: dict[str, Any]) -> ItemResult:
    """An item's samples in as many children as it takes: a child that dies or times out is
    that sample's outcome, and the next child starts at the sample after it."""
    began = time.perf_counter()
    item = ItemResult(name=name, kernels=kernels)
    start = 0
    while True:
        events, ended, stderr = run_child(child, {"name": name, "kernels": kernels, **extra})
        current: dict[str, Any] | None = None
        for event in events:
            if event["event"] == "phase":
                current = event
            elif event["event"] == "sample":
                item.samples.append(SampleResult(**event["result"]))
                current = None
            elif event["event"] in ("item", "done"):
                item.dtype = event.get("dtype", item.dtype) or item.dtype
                item.label = event.get("label", item.label) or item.label
        if ended == "ok":
            break
        why = f"{ended} ({first_line(_last_error_line(stderr), 300)})" if stderr else ended
        if current is None:
            # Died outside every sample: loading the operator, or after the last sample.
            item.samples.append(
                SampleResult(index=start, outcome=DIED, detail=why, phase="load", error=stderr)
            )
            break
        outcome = TIMEOUT if ended == TIMEOUT else DIED
        if current["phase"] != "kope":
            outcome, why = EAGER_FAILS, f"{current['phase']} phase: {why}"
        item.samples.append(
            SampleResult(
                index=current["index"],
                outcome=outcome,
                detail=why,
                inputs=current.get("inputs", ""),
                phase=current["phase"],
                error=stderr,
            )
        )
        start = current["index"] + 1
        if "limit_samples" not in extra or start >= extra["limit_samples"]:
            break
        extra = {**extra, "start": start}
    item.seconds = round(time.perf_counter() - began, 3)
    return item


def _last_error_line(stderr: str) -> str:
    """The line of a child's stderr that says what went wrong: the last non-blank one."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run_all(
    child: Child,
    names: Sequence[str],
    modes: Sequence[str],
    extra: Callable[[str], dict[str, Any]],
    jobs: int,
) -> list[ItemResult]:
    """Every name under every mode, `jobs` children at a time, with a progress bar; `extra(name)`
    is the check function's other arguments."""
    work = [(name, mode) for mode in modes for name in names]
    results: list[ItemResult] = []
    with (
        ThreadPoolExecutor(max_workers=jobs) as pool,
        tqdm(total=len(work), unit="item", file=sys.stderr, dynamic_ncols=True) as bar,
    ):
        futures = [pool.submit(run_item, child, name, mode, extra(name)) for name, mode in work]
        for future in futures:
            item = future.result()
            results.append(item)
            bar.set_postfix_str(f"{item.kernels} {item.name}: {item.outcome}", refresh=False)
            bar.update()
    return results


# -- the summary and the table --------------------------------------------------------------------


def summarize(items: Sequence[ItemResult]) -> dict[str, dict[str, Any]]:
    """Per kernels mode: outcomes counted per sample and per item, items tested, items on
    which a KOPE kernel ran, right items on which one ran, samples with a KOPE fallback."""
    summary: dict[str, dict[str, Any]] = {}
    for mode in dict.fromkeys(i.kernels for i in items):
        mine = [i for i in items if i.kernels == mode]
        samples = [s for i in mine for s in i.samples]
        right = [i for i in mine if i.outcome == RIGHT]
        summary[mode] = {
            "items": len(mine),
            "samples": {o: sum(1 for s in samples if s.outcome == o) for o in OUTCOMES},
            "item_outcomes": {o: sum(1 for i in mine if i.outcome == o) for o in OUTCOMES},
            "tested": sum(1 for i in mine if i.tested),
            "tested_on_kope": sum(1 for i in mine if i.tested and i.ran_kope),
            "tested_computing": sum(1 for i in mine if i.tested and i.computes),
            "right": len(right),
            "right_on_kope": sum(1 for i in right if i.ran_kope),
            "samples_with_fallback": sum(1 for s in samples if s.fallbacks),
            "kope_ops": dict(Counter(op for s in samples for op in s.kope_ops).most_common()),
        }
    return summary


def table(items: Sequence[ItemResult], what: str) -> list[str]:
    """One line per sample whose outcome is not `right`: problems first, then the skipped."""
    rows = [
        (OUTCOMES.index(s.outcome), i.kernels, i.name, s, i.label)
        for i in items
        for s in i.samples
        if s.outcome != RIGHT
    ]
    rows.sort(key=lambda r: (r[0], r[1], r[2], r[3].index))
    lines = []
    for _, mode, name, sample, label in rows:
        tag = f" [{label}]" if label else ""
        lines.append(
            f"{sample.outcome:<24} {mode:<9} {what} {name}{tag} #{sample.index}: "
            f"{first_line(sample.detail, 160)}"
        )
    return lines


def summary_lines(summary: dict[str, dict[str, Any]], noun: str) -> list[str]:
    lines = []
    for mode, s in summary.items():
        counts = ", ".join(f"{n} {o}" for o, n in s["samples"].items() if n or o in PROBLEMS)
        lines.append(
            f"kernels={mode}: {s['items']} {noun}s; samples: {counts}; "
            f"{s['tested_on_kope']} of {s['tested']} tested {noun}s ran at least one KOPE kernel "
            f"({s['tested_computing']} had a compute operator; {s['right_on_kope']} of "
            f"{s['right']} right ones ran one); "
            f"{s['samples_with_fallback']} samples had a graph KOPE failed to compile"
        )
    return lines


def write_report(
    path: Path | None, suite: str, args: argparse.Namespace, items: Sequence[ItemResult]
) -> dict[str, Any]:
    report = {
        "suite": suite,
        "command": [sys.executable, *sys.argv],
        "arguments": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "torch": torch.__version__,
        "kope": kope.__version__,
        "summary": summarize(items),
        "items": [
            {
                **asdict(i),
                "outcome": i.outcome,
                "ran_kope": i.ran_kope,
                "tested": i.tested,
                "computes": i.computes,
            }
            for i in items
        ],
    }
    if path is not None:
        path.write_text(json.dumps(report, indent=1))
    return report


def print_results(
    items: Sequence[ItemResult], noun: str, report: dict[str, Any], path: Path | None
) -> None:
    for line in table(items, noun):
        print(line)
    for line in summary_lines(report["summary"], noun):
        print(line)
    if path is not None:
        print(f"report: {path}")


def problems(items: Sequence[ItemResult]) -> int:
    return sum(1 for i in items for s in i.samples if s.outcome in PROBLEMS)


# -- the command line -----------------------------------------------------------------------------


def modes_argument(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in KERNEL_MODES]
    if bad or not modes:
        raise argparse.ArgumentTypeError(
            f"--kernels {text!r}: expected a comma-separated list of {', '.join(KERNEL_MODES)}"
        )
    return modes


def names_argument(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def common_arguments(parser: argparse.ArgumentParser, noun: str) -> None:
    """The options both harnesses share."""
    parser.add_argument(
        "--sample",
        type=int,
        metavar="N",
        help=f"check N {noun}s chosen at random (seeded by --seed) instead of all",
    )
    parser.add_argument("--seed", type=int, default=0, help="the seed of --sample (default 0)")
    parser.add_argument(
        "--kernels",
        type=modes_argument,
        default=list(KERNEL_MODES),
        help="KOPE's kernels option, one run of every item per mode "
        f"(default {','.join(KERNEL_MODES)})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"seconds one child process may run (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument("--jobs", type=int, default=1, help="child processes at a time (default 1)")
    parser.add_argument(
        "--store",
        type=Path,
        metavar="DIR",
        help="one KOPE store shared by all children (default: a fresh one per child)",
    )
    parser.add_argument("--report", type=Path, metavar="JSON", help="write the full report here")


def choose(
    names: Sequence[str], wanted: list[str] | None, sample: int | None, seed: int
) -> list[str]:
    """The named items (each a full name, or an OpInfo's name covering its variants), or a
    seeded random sample, or all, in the order given or listed."""
    if wanted:
        chosen = [n for w in wanted for n in names if n == w or n.split(".", 1)[0] == w]
        unknown = [w for w in wanted if not any(n == w or n.split(".", 1)[0] == w for n in names)]
        if unknown:
            raise SystemExit(f"unknown: {', '.join(unknown)}")
        return list(dict.fromkeys(chosen))
    if sample is not None:
        return sorted(random.Random(seed).sample(list(names), min(sample, len(names))))
    return list(names)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Check torch.compile(backend='kope') against eager on PyTorch's OpInfo "
        "database, each operator and kernels mode in a process of its own.",
    )
    parser.add_argument(
        "--ops",
        type=names_argument,
        metavar="A,B",
        help="operators to check: OpInfo names (`add`, `nn.functional.relu`), a name covering "
        "its variants or `name.variant` for one",
    )
    common_arguments(parser, "operator")
    parser.add_argument(
        "--limit-samples",
        type=int,
        default=2,
        metavar="K",
        help="sample inputs per operator, the first K OpInfo gives (default 2)",
    )
    args = parser.parse_args(argv)
    names = choose([op_name(op) for op in load_op_db()], args.ops, args.sample, args.seed)
    child = Child("opinfo", "check_operator", args.timeout, args.store, preload=(OP_DB_MODULE,))
    began = time.perf_counter()
    samples = {"limit_samples": args.limit_samples}
    items = run_all(child, names, args.kernels, lambda name: samples, args.jobs)
    report = write_report(args.report, "opinfo", args, items)
    print_results(items, "operator", report, args.report)
    print(f"{len(names)} operators in {time.perf_counter() - began:.0f} s")
    return 1 if problems(items) else 0


if __name__ == "__main__":
    sys.exit(main())
