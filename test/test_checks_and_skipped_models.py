"""What KOPE says about graphs with nothing to compute: assertion nodes are not compute
operators, and a model dynamo skips whole (nn.LSTM) is named as such, not as "0 operators"
and a 100% JIT share."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import kope
from kope.frontend.report import Report
from kope.targets.cpu import CpuTarget
from kope.tools.precompile import trace


def test_assertions_are_not_compute_operators_run_eagerly() -> None:
    """one_hot leaves `aten._assert_async.msg` (its bounds) and a dtype conversion
    `aten._assert_tensor_metadata` in the aten graph: they returned no value, so they were
    reported as compute operators KOPE could not take ("has no shape information")."""

    def fn(idx: torch.Tensor) -> torch.Tensor:
        return F.one_hot(idx % 8, 8).sum(0).to(torch.float32)

    torch._dynamo.reset()
    kope.reset_report()
    idx = torch.randint(0, 50, (20,))
    with torch.no_grad():
        out = torch.compile(fn, backend="kope", options={"kernels": "eager"})(idx)
    assert torch.equal(out, fn(idx))
    report = kope.report()
    checks = [e for e in report.eager if "_assert" in e.op]
    assert checks, report.eager  # the graph has them
    assert not any(e.compute for e in checks), checks
    assert "_assert" not in report.format_table()


def test_a_report_without_graphs_says_dynamo_compiled_none() -> None:
    text = Report().format_table()
    assert "dynamo compiled no graph" in text and "100%" not in text


class _Lstm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(8, 8, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


def test_precompile_says_when_dynamo_compiles_no_graph(caplog: pytest.LogCaptureFixture) -> None:
    """Dynamo skips a frame holding nn.LSTM (allow_rnn is off): precompile found 0 operators
    and said nothing about why."""
    with caplog.at_level(logging.WARNING, logger="kope.precompile"):
        tasks, eager = trace(_Lstm().eval(), (torch.randn(2, 3, 8),), CpuTarget())
    assert not tasks and not eager
    assert "dynamo compiled no graph" in caplog.text
