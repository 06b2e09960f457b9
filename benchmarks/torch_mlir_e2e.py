"""torch-mlir's e2e test suite through `torch.compile(backend="kope")`: is every answer right?

    python benchmarks/torch_mlir_e2e.py --torch-mlir DIR [--tests A,B] [--sample 100 --seed 0]
                                        [--kernels reference,auto] [--timeout 300] [--jobs 1]
                                        [--store DIR] [--report out.json]

DIR is a git checkout of https://github.com/llvm/torch-mlir; the suite is its Python package
`projects/pt1/python/torch_mlir_e2e_test` (~1,800 tests in `test_suite/`), read from there and
never copied into this project (the torch-mlir wheel does not ship it). Without a checkout
this harness says what to pass and exits with status 2; `benchmarks/opinfo.py` runs alone.

The suite's own runner does not fit: its `configs` package needs the lazy-tensor backend the
wheel lacks, and its `run_tests` runs tests in a shared pool. Here a listing child imports the
test modules the suite's `register_all_tests()` names, one at a time (a module that does not
import, such as `conv.py` without torchvision, makes its tests `not loadable`), and each test
then runs under each `--kernels` mode in a process of its own: the test's
`program_invoker(module, TestUtils())` is recorded once on a fresh `program_factory()` module,
and the recorded calls are replayed on fresh modules eagerly twice, under
`torch.compile(backend="eager")` and under `torch.compile(backend="kope", options={"kernels":
K})`, all under `torch.no_grad()`. KOPE's results are compared with eager's by the suite's own
rule (rtol 1e-3, atol 1e-7, NaN equals NaN). Outcomes, the child isolation, the table and the
report are `benchmarks/opinfo.py`'s (its docstring defines them), with one more: `not loadable`.

Two modules the suite imports are missing from the wheel: `multiprocess` (the suite's pool,
unused here) and `torch_mlir._version`; the children stand in small modules for those two
imports only. torch-mlir's expected failures (`projects/pt1/e2e_testing/xfail_sets.py`, the
fx importer's sets, the path closest to KOPE's) label the table's lines and the report's
tests, and hide nothing.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import sys
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from opinfo import (
    EAGER_FAILS,
    NOT_LOADABLE,
    Child,
    ItemResult,
    SampleResult,
    Wrap,
    check_once,
    child_main,
    choose,
    clone,
    common_arguments,
    describe,
    first_line,
    names_argument,
    print_results,
    problems,
    run_all,
    run_child,
    write_report,
)
from packaging import version

# `child_main` is imported for the children, which call it as this module's.
__all__ = ["check_test", "child_main", "list_suite", "main"]

PACKAGE = Path("projects/pt1/python/torch_mlir_e2e_test")
XFAIL_SETS = Path("projects/pt1/e2e_testing/xfail_sets.py")
# The suite's comparison (`torch_mlir_e2e_test/reporting.py`): allclose, NaN equals NaN.
SUITE_RTOL, SUITE_ATOL = 1e-3, 1e-7
# xfail_sets.py's sets for torch-mlir's fx importer on linalg, KOPE's own path; label per set.
LABELS = {"FX_IMPORTER_CRASHING_SET": "crashing", "FX_IMPORTER_XFAIL_SET": "xfail"}
NO_CHECKOUT = (
    "torch-mlir's e2e suite is read from a checkout of https://github.com/llvm/torch-mlir: pass "
    "--torch-mlir DIR, the folder of the checkout (it holds {package}); "
    "benchmarks/opinfo.py runs without one"
)


def suite_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """The suite's rule for floats and complex; integers and bool exact."""
    if dtype.is_floating_point or dtype.is_complex:
        return SUITE_RTOL, SUITE_ATOL
    return 0.0, 0.0


def checkout_error(root: Path | None) -> str | None:
    """Why `root` is not a torch-mlir checkout this harness can read, or None."""
    message = NO_CHECKOUT.format(package=PACKAGE)
    if root is None:
        return message
    if not (root / PACKAGE / "framework.py").is_file():
        return f"{root} has no {PACKAGE / 'framework.py'}: {message}"
    return None


# -- in the children ------------------------------------------------------------------------------


def prepare(root: str) -> None:
    """Make the suite importable from the checkout at `root`, standing in modules for the two
    imports the wheel lacks (and only where they are missing)."""
    sys.path.insert(0, str(Path(root) / PACKAGE.parent))
    if importlib.util.find_spec("multiprocess") is None:
        # framework.py's pool for `run_tests`, which this harness does not call.
        stub = types.ModuleType("multiprocess")
        stub.set_start_method = lambda *args, **kwargs: None  # type: ignore[attr-defined]
        sys.modules["multiprocess"] = stub
    try:
        importlib.import_module("torch_mlir._version")
    except ModuleNotFoundError:
        # What torch-mlir's build generates: torch's version without its local part.
        stub = types.ModuleType("torch_mlir._version")
        stub.version = version  # type: ignore[attr-defined]
        stub.torch_version_for_comparison = lambda: version.parse(  # type: ignore[attr-defined]
            torch.__version__.split("+", 1)[0]
        )
        sys.modules["torch_mlir._version"] = stub


def suite_modules(root: Path) -> list[str]:
    """The modules `test_suite/__init__.py`'s `register_all_tests()` imports, in its order."""
    tree = ast.parse((root / PACKAGE / "test_suite" / "__init__.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "register_all_tests":
            return [
                alias.name
                for statement in ast.walk(node)
                if isinstance(statement, ast.ImportFrom) and statement.level == 1
                for alias in statement.names
            ]
    raise SystemExit(f"{root / PACKAGE / 'test_suite/__init__.py'} has no register_all_tests()")


def declared_tests(path: Path) -> list[str]:
    """The tests a module declares with `@register_test_case`, read without importing it."""
    tree = ast.parse(path.read_text())
    return [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and any(
            isinstance(d, ast.Call) and getattr(d.func, "id", "") == "register_test_case"
            for d in node.decorator_list
        )
    ]


def list_suite(root: str, announce: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Import the suite's modules one at a time: which tests each registers, or why it does
    not import; and torch-mlir's label for each test that xfail_sets.py names."""
    prepare(root)
    registry = importlib.import_module("torch_mlir_e2e_test.registry")
    modules: dict[str, dict[str, Any]] = {}
    for name in suite_modules(Path(root)):
        before = len(registry.GLOBAL_TEST_REGISTRY)
        try:
            importlib.import_module(f"torch_mlir_e2e_test.test_suite.{name}")
        except Exception as error:
            path = Path(root) / PACKAGE / "test_suite" / f"{name}.py"
            tests = declared_tests(path) if path.is_file() else []
            modules[name] = {"tests": tests, "error": f"{type(error).__name__}: {error}"}
            continue
        added = registry.GLOBAL_TEST_REGISTRY[before:]
        modules[name] = {"tests": [t.unique_name for t in added], "error": None}
    labels: dict[str, str] = {}
    labels_error = None
    try:
        spec = importlib.util.spec_from_file_location("xfail_sets", Path(root) / XFAIL_SETS)
        assert spec is not None and spec.loader is not None
        xfail_sets = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(xfail_sets)
        for attribute, label in LABELS.items():
            for test in getattr(xfail_sets, attribute, ()):
                labels.setdefault(test, label)
    except Exception as error:  # labels only: the run goes on without them
        labels_error = f"{XFAIL_SETS}: {type(error).__name__}: {error}"
    return {"modules": modules, "labels": labels, "labels_error": labels_error}


class Recorder:
    """Stands for the module in a test's `program_invoker`: records each call's symbol
    (`forward`, `sub.forward`) and arguments, and returns eager's result."""

    def __init__(self, target: Any, calls: list[tuple[str, Any, Any]], path: str = "") -> None:
        self.target, self.calls, self.path = target, calls, path

    def __getattr__(self, name: str) -> Recorder:
        return Recorder(getattr(self.target, name), self.calls, f"{self.path}.{name}".lstrip("."))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((self.path, clone(args), clone(kwargs)))
        return self.target(*args, **kwargs)


def resolve(module: Any, symbol: str) -> Any:
    for name in symbol.split("."):
        module = getattr(module, name)
    return module


def check_test(
    name: str,
    kernels: str,
    root: str,
    suite_module: str,
    announce: Callable[[dict[str, Any]], None] = lambda event: None,
) -> ItemResult:
    """One e2e test under `kernels`, in this process: its calls recorded once, then replayed
    by `check_once` (eager twice, dynamo's eager backend, KOPE)."""
    prepare(root)
    importlib.import_module(f"torch_mlir_e2e_test.test_suite.{suite_module}")
    registry = importlib.import_module("torch_mlir_e2e_test.registry")
    framework = importlib.import_module("torch_mlir_e2e_test.framework")
    (test,) = [t for t in registry.GLOBAL_TEST_REGISTRY if t.unique_name == name]
    item = ItemResult(name=name, kernels=kernels)
    began = time.perf_counter()

    def phase(phase: str) -> None:
        announce({"event": "phase", "index": 0, "phase": phase, "inputs": ""})

    calls: list[tuple[str, Any, Any]] = []
    phase("eager")
    try:
        with torch.no_grad():
            torch.manual_seed(0)
            module = test.program_factory()
            test.program_invoker(Recorder(module, calls), framework.TestUtils())
    except Exception as error:
        why = f"eager raises: {type(error).__name__}: {error}"
        result = SampleResult(0, EAGER_FAILS, first_line(why, 400), phase="eager")
    else:
        seeds = iter(range(1, 1_000_000))

        def replay(wrap: Wrap) -> list[Any]:
            torch.manual_seed(0)  # the same parameters as the recording's module
            module = test.program_factory()
            # A new seed per replay: a test that draws random numbers differs between eager's
            # two runs, and is set aside as random.
            torch.manual_seed(next(seeds))
            compiled: dict[str, Callable[..., Any]] = {}
            outputs = []
            for symbol, args, kwargs in calls:
                if symbol not in compiled:
                    compiled[symbol] = wrap(resolve(module, symbol))
                outputs.append(clone(compiled[symbol](*clone(args), **clone(kwargs))))
            return outputs

        result = check_once(replay, kernels, suite_tolerance, phase)
    shown = (f"{symbol}({', '.join(describe(a) for a in args)})" for symbol, args, _ in calls)
    result.inputs = first_line("; ".join(shown), 300)
    result.seconds = round(time.perf_counter() - began, 3)
    item.samples.append(result)
    announce({"event": "sample", "result": asdict(result)})
    return item


# -- the parent -----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Check torch.compile(backend='kope') against eager on torch-mlir's e2e test "
        "suite, read from a torch-mlir checkout; each test and kernels mode in a process of "
        "its own.",
    )
    parser.add_argument(
        "--torch-mlir",
        type=Path,
        metavar="DIR",
        help=f"a checkout of https://github.com/llvm/torch-mlir (it holds {PACKAGE})",
    )
    parser.add_argument(
        "--tests", type=names_argument, metavar="A,B", help="the tests to run, by unique name"
    )
    common_arguments(parser, "test")
    args = parser.parse_args(argv)
    error = checkout_error(args.torch_mlir)
    if error is not None:
        print(error, file=sys.stderr)
        return 2
    root = args.torch_mlir.resolve()

    listing = Child("torch_mlir_e2e", "list_suite", args.timeout)
    events, ended, stderr = run_child(listing, {"root": str(root)})
    done = [e for e in events if e["event"] == "done"]
    if ended != "ok" or not done:
        print(f"listing the suite failed ({ended}):\n{stderr}", file=sys.stderr)
        return 1
    suite = done[0]["value"]
    if suite["labels_error"]:
        print(f"no torch-mlir labels: {suite['labels_error']}", file=sys.stderr)
    module_of = {t: m for m, entry in suite["modules"].items() for t in entry["tests"]}
    broken = {m: entry["error"] for m, entry in suite["modules"].items() if entry["error"]}
    names = choose(sorted(module_of), args.tests, args.sample, args.seed)

    began = time.perf_counter()
    unloadable = [n for n in names if module_of[n] in broken]
    items = [
        ItemResult(
            name=name,
            kernels=mode,
            samples=[
                SampleResult(
                    index=0,
                    outcome=NOT_LOADABLE,
                    detail=f"{module_of[name]}.py: {broken[module_of[name]]}",
                )
            ],
        )
        for mode in args.kernels
        for name in unloadable
    ]
    child = Child("torch_mlir_e2e", "check_test", args.timeout, args.store)
    loadable = [n for n in names if n not in unloadable]
    items += run_all(
        child,
        loadable,
        args.kernels,
        lambda name: {"root": str(root), "suite_module": module_of[name]},
        args.jobs,
    )
    for item in items:
        item.label = suite["labels"].get(item.name, "")
    report = write_report(args.report, "torch-mlir e2e", args, items)
    print_results(items, "test", report, args.report)
    print(
        f"{len(names)} tests ({len(unloadable)} not loadable, in "
        f"{', '.join(sorted(broken)) or 'no module'}) in {time.perf_counter() - began:.0f} s"
    )
    return 1 if problems(items) else 0


if __name__ == "__main__":
    sys.exit(main())
