"""Partitioning at the coarsest level torch-mlir lowers, for operators it does not lower whole.

Such an operator is one Task imported through its decomposition (one kernel; its eager call,
the baseline, stays the operator's native one), or, where that does not lower, runs whole
eagerly: never dozens of tiny Tasks of its pieces. The class of defect: `F.interpolate(...,
mode="bicubic")` on 1x3x16x16 was traced as ~160 index, clamp and arithmetic nodes and cut
into ~80 Tasks, each measured at the first compile (tens of seconds), then all run eagerly
anyway.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import kope.core.decompositions
import kope.frontend.partition
from kope.frontend.partition import partition
from kope.targets.cpu import CpuTarget
from kope.tools.precompile import trace_tasks

aten = torch.ops.aten


class MixThenUpsample(torch.nn.Module):
    def __init__(self, mode: str, align_corners: bool | None) -> None:
        super().__init__()
        self.mix = torch.nn.Parameter(torch.randn(3, 3))
        self.mode = mode
        self.align_corners = align_corners

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.einsum("bchw,cd->bdhw", x, self.mix)
        return F.interpolate(x, scale_factor=2, mode=self.mode, align_corners=self.align_corners)


@pytest.mark.parametrize(
    ("mode", "align_corners", "op"),
    [
        ("bicubic", False, "aten.upsample_bicubic2d.default"),
        ("bilinear", True, "aten.upsample_bilinear2d.default"),
        ("nearest-exact", None, "aten._upsample_nearest_exact2d.default"),
    ],
)
def test_an_interpolation_is_one_task_and_matches_eager(
    mode: str, align_corners: bool | None, op: str
) -> None:
    model = MixThenUpsample(mode, align_corners).eval()
    x = torch.randn(1, 3, 7, 6)
    tasks = trace_tasks(model, (x,), CpuTarget())
    assert [t.op for t in tasks] == ["aten.bmm.default", op], [t.label for t in tasks]
    with torch.no_grad():
        compiled = torch.compile(model, backend="kope", options={"kernels": "reference"})
        got, want = compiled(x), model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def _median_by_sort(x: torch.Tensor, dim: int, keepdim: bool = False) -> Any:
    """`aten.median.dim` through a sort, which torch-mlir lowers outside linalg-on-tensors."""
    values, indices = torch.sort(x, dim)
    middle = (x.shape[dim] - 1) // 2
    picked = values.narrow(dim, middle, 1), indices.narrow(dim, middle, 1)
    return picked if keepdim else (picked[0].squeeze(dim), picked[1].squeeze(dim))


def test_an_operator_whose_decomposition_is_not_one_kernel_runs_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its pieces would be a sort run eagerly among small Tasks: the native call runs instead."""
    table = {**kope.core.decompositions.decomposition_table(), aten.median.dim: _median_by_sort}
    monkeypatch.setattr(kope.frontend.partition, "decomposition_table", lambda *_: table)
    monkeypatch.setattr(kope.core.decompositions, "decomposition_table", lambda *_, **__: table)
    gm = make_fx(lambda t: torch.median(t, 1).values * 2, tracing_mode="fake")(torch.randn(5, 9))
    part = partition(gm, CpuTarget())
    assert [t.op for t in part.tasks] == ["aten.mul.Tensor"]
    [whole] = [e for e in part.eager if e.compute]
    assert whole.op == "aten.median.dim" and "one native call" in whole.reason, whole.reason


class CausalScores(torch.nn.Module):
    """Scores under a causal mask built from literals on every call, as HF models build theirs,
    and positions returned as they are."""

    def forward(self, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = scores.shape[-1]
        for _ in range(2):  # two layers, each building the same mask
            keep = torch.arange(n)[:, None] >= torch.arange(n)[None, :]
            scores = torch.softmax(scores + torch.where(keep, 0.0, float("-inf")), -1)
        return scores, torch.arange(n) * 2, torch.arange(n).view(n, 1)


def test_what_constants_alone_compute_is_computed_once_and_never_returned() -> None:
    """The mask is folded into one constant the graph reads (both layers the same one); the
    positions, values the graph returns (one a view), are computed on every call, so a caller
    that writes into them changes nothing the next call returns."""
    x = torch.randn(2, 5, 5)
    gm = make_fx(CausalScores(), tracing_mode="fake")(x)
    partition(gm, CpuTarget())
    constants = [n for n in gm.graph.nodes if n.op == "get_attr"]
    # The mask's bias, twice, and the arange the positions are computed from.
    assert len(constants) == 3 and len({n.target for n in constants}) == 2, constants
    assert all(str(n.target).startswith(kope.frontend.partition.CONSTANT_PREFIX) for n in constants)
    ops = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert "aten.where.self" not in ops and "aten.ge.Tensor" not in ops, ops
    assert "aten.mul.Tensor" in ops  # the positions
    with torch.no_grad():
        compiled = torch.compile(CausalScores(), backend="kope", options={"kernels": "reference"})
        got, doubled, column = compiled(x)
        torch.testing.assert_close(got, CausalScores()(x)[0])
        doubled.fill_(7)
        column.fill_(7)
        again = compiled(x)
        torch.testing.assert_close(again[1], torch.arange(5) * 2)
        torch.testing.assert_close(again[2], torch.arange(5).view(5, 1))


def test_a_returned_constant_does_not_stop_what_is_computed_from_it_folding() -> None:
    """Positions returned as they are and a mask built from them: the positions stay computed
    on every call, the mask folds (it was left unfolded, all of it, as folding gave up)."""

    def scores_and_positions(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = torch.arange(x.shape[-1])
        bias = torch.where(p[:, None] >= p[None, :], 0.0, float("-inf"))
        return torch.softmax(x + bias, -1), p

    x = torch.randn(5, 5)
    gm = make_fx(scores_and_positions, tracing_mode="fake")(x)
    partition(gm, CpuTarget())
    ops = [str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "get_attr")]
    assert "aten.arange.default" in ops and "aten.where.self" not in ops, ops
    assert sum(op.startswith(kope.frontend.partition.CONSTANT_PREFIX) for op in ops) == 1, ops
    gm.recompile()
    got, positions = gm(x)
    torch.testing.assert_close(got, scores_and_positions(x)[0])
    positions.fill_(7)
    torch.testing.assert_close(gm(x)[1], torch.arange(5))
