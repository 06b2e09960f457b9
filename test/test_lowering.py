"""torch-mlir's import of a user's operator runs in the lowering worker: an operator whose
import kills the process that runs it is a recorded reason to run on ATen, never a dead user
process, and the worker's import is the import the user's process would have made."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kope.core import task as task_module
from kope.core.lowering import ImportRequest, LoweringCrash, imported, input_strides, rebuild
from kope.core.task import group_signature, make_task
from kope.targets.cpu import CpuTarget

# Each of these killed the process that compiled it (SIGFPE, SIGFPE, SIGSEGV, an LLVM abort)
# while torch-mlir's import ran in it.
KILLERS = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    cases = [
        (lambda x: F.unfold(x, 2), torch.randn(0, 1, 5, 5)),
        (lambda x: F.group_norm(x, 2), torch.randn(0, 4, 3, 3)),
        (lambda x: x.scatter(-1, torch.tensor([[0], [2]]), 1.0), torch.randn(2, 4)),
        (lambda x: torch.zeros_like(x).scatter_add(-1, torch.tensor([[0], [2]]), x[:, :1]),
         torch.randn(2, 4)),
    ]
    for fn, x in cases:
        with torch.no_grad():
            want = fn(x)
            got = torch.compile(fn, backend="kope")(x)
        assert got.shape == want.shape and torch.equal(got, want), (got, want)
        torch._dynamo.reset()
    print("all survived")
    """
)


def test_operators_whose_import_crashes_run_on_aten_and_the_process_lives(tmp_path: Path) -> None:
    env = {**os.environ, "KOPE_HOME": str(tmp_path / "home")}
    env.pop("KOPE_STRICT", None)  # as a user runs it
    proc = subprocess.run(
        [sys.executable, "-c", KILLERS], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "all survived" in proc.stdout
    assert "killed the lowering worker" in proc.stderr  # the reason is logged


def _scatter_node() -> torch.fx.Node:
    gm = make_fx(lambda t, i: t.scatter(-1, i, 1.0), tracing_mode="fake")(
        torch.randn(2, 4), torch.tensor([[0], [2]])
    )
    return next(n for n in gm.graph.nodes if n.op == "call_function" and "scatter" in str(n.target))


def test_a_crash_is_the_operators_recorded_reason_and_is_not_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = _scatter_node()
    with pytest.raises(LoweringCrash) as first:
        make_task(node, CpuTarget().key())
    assert "killed" in str(first.value) and "SIG" in str(first.value)

    def again(*_: Any) -> Any:
        raise AssertionError("the import was tried again")

    monkeypatch.setattr(task_module, "isolated_import", again)
    with pytest.raises(Exception) as second:
        make_task(node, CpuTarget().key())
    assert str(second.value) == str(first.value)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_the_worker_imports_what_the_user_process_would(layout: str) -> None:
    """The worker rebuilds the nodes from plain data (the call, input specs and strides); its
    import equals the in-process import of the user's own nodes, a fused group's included."""
    x = torch.randn(2, 3, 5, 5)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    gm = make_fx(lambda t: torch.softmax(t, 1) * F.silu(t) + 2, tracing_mode="fake")(x)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    inputs, call, in_specs, _ = group_signature(nodes)
    request = ImportRequest(call, in_specs, input_strides(inputs), False)
    rebuilt = rebuild(request)
    assert [n.target for n in rebuilt] == [n.target for n in nodes]
    assert [n.meta["val"].stride() for n in rebuilt] == [n.meta["val"].stride() for n in nodes]
    assert imported(rebuilt, False) == imported(nodes, False)
    assert make_task(nodes, CpuTarget().key()).payload == imported(nodes, False)
