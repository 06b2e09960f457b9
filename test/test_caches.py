"""KOPE's caches of derived files (`$KOPE_HOME/cache`): a Task's reference lowering and a
verified kernel's shared library are derived once, then read by every later process; a
damaged entry is derived again, never trusted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kope.core import task as task_module
from kope.core.lowering import LoweringError
from kope.core.task import make_task
from kope.frontend.partition import partition
from kope.passes.analysis import analyze, prepare_payload
from kope.spaces.kernels import kernel_source
from kope.targets.cpu import CpuTarget, _lowered
from kope.targets.kernel_cache import cached_library, load_kernel
from kope.vocabulary.kernels import Kernel
from kope.vocabulary.specs import TaskSpec


def _task(fn: Callable[..., Any], *args: torch.Tensor) -> Any:
    tasks = partition(make_fx(fn, tracing_mode="fake")(*args), CpuTarget()).tasks
    assert len(tasks) == 1, [t.label for t in tasks]
    return tasks[0]


def _not_again(*_: Any) -> Any:
    raise AssertionError("derived again: the cache was not used")


def test_a_reference_lowering_is_imported_once(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(5, 11)
    first = _task(lambda t: torch.tanh(t) * 3 + 0.25, x)
    monkeypatch.setattr(task_module, "isolated_import", _not_again)
    again = make_task(first.nodes, CpuTarget().key())
    assert (again.payload, again.key) == (first.payload, first.key)


def test_an_operator_torch_mlir_cannot_lower_is_refused_from_the_cache_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gm = make_fx(lambda t: torch.sort(t).values, tracing_mode="fake")(torch.randn(4, 6))
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    with pytest.raises(LoweringError) as first:
        make_task(node, CpuTarget().key())
    monkeypatch.setattr(task_module, "isolated_import", _not_again)
    with pytest.raises(LoweringError) as again:
        make_task(node, CpuTarget().key())
    assert str(again.value) == str(first.value)


def _threaded_matmul() -> tuple[TaskSpec, Kernel, tuple[torch.Tensor, ...]]:
    """A matmul whose schedule runs parallel loops (the OpenMP runtime linked in)."""
    args = (torch.randn(8, 40), torch.randn(40, 32))
    task = _task(torch.mm, *args)
    payload = prepare_payload(task.payload)
    config = {"family": "contraction", "threads": 2, "cache": [8, 32, 40], "register": [4, 16, 1]}
    source = kernel_source(payload, analyze(payload), config)
    return task.spec, Kernel(source), args


@pytest.mark.parametrize("case", ["elementwise", "threaded_matmul"])
def test_a_verified_kernel_is_compiled_once_then_loaded(case: str) -> None:
    if case == "elementwise":
        args: tuple[torch.Tensor, ...] = (torch.randn(6, 9),)
        task = _task(lambda t: torch.sigmoid(t) * t, *args)
        spec, kernel = task.spec, Kernel(task.payload)
        want = torch.sigmoid(args[0]) * args[0]
    else:
        spec, kernel, args = _threaded_matmul()
        want = args[0] @ args[1]
    built = load_kernel(spec, kernel, _lowered)
    assert built.parallel == (case == "threaded_matmul")
    loaded = load_kernel(spec, kernel, _not_again)
    assert loaded.parallel == built.parallel
    for kernel_ in (built, loaded):
        torch.testing.assert_close(kernel_(*args)[0], want)


def test_a_damaged_library_is_built_again(caplog: pytest.LogCaptureFixture) -> None:
    args = (torch.randn(3, 7),)
    task = _task(lambda t: t * t - 1, *args)
    kernel = Kernel(task.payload)
    load_kernel(task.spec, kernel, _lowered)
    cached_library(task.spec, kernel).write_bytes(b"not a shared library")
    rebuilt = load_kernel(task.spec, kernel, _lowered)
    assert "unusable" in caplog.text
    torch.testing.assert_close(rebuilt(*args)[0], args[0] * args[0] - 1)
    load_kernel(task.spec, kernel, _not_again)  # the new library took its place
