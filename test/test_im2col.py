"""A 2-D convolution as im2col and a product (`kope.spaces.im2col`): every configuration the
space offers verifies against the reference lowering (bias or none, stride, dilation, one and two
threads), and the space offers it only where it renders."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kope.frontend.partition import partition
from kope.passes.analysis import analyze, prepare_payload
from kope.spaces.cpu import renders, schedule_space
from kope.spaces.kernels import kernel_source
from kope.targets.cpu import CpuTarget
from kope.vocabulary.kernels import Kernel


@pytest.fixture(scope="module")
def target():
    cpu = CpuTarget(workers=1, timeout_s=120)
    yield cpu
    cpu.close()


CASES: dict[str, tuple[Callable[..., torch.Tensor], tuple[int, ...], tuple[int, ...]]] = {
    "3x3_bias": (lambda x, w, b: F.conv2d(x, w, b, padding=1), (1, 5, 6, 32), (8, 5, 3, 3)),
    "3x3_stride2": (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1), (1, 4, 9, 64),
                    (8, 4, 3, 3)),
    "3x3_dilation2": (lambda x, w, b: F.conv2d(x, w, b, dilation=2, padding=2), (1, 3, 5, 16),
                      (6, 3, 3, 3)),
    "5x3_valid": (lambda x, w, b: F.conv2d(x, w, b), (1, 4, 8, 18), (8, 4, 5, 3)),
    "no_bias": (lambda x, w, b: F.conv2d(x, w, None, padding=1), (1, 4, 6, 32), (8, 4, 3, 3)),
    "batch3": (lambda x, w, b: F.conv2d(x, w, b, padding=1), (3, 4, 5, 16), (8, 4, 3, 3)),
    # Five panels, one image: two threads split the output channels.
    "channel_split": (lambda x, w, b: F.conv2d(x, w, b, padding=1), (1, 3, 5, 16), (16, 3, 3, 3)),
    # A row no panel width divides: computed to whole panels, the zero columns dropped.
    "ragged_row": (lambda x, w, b: F.conv2d(x, w, b, padding=1), (2, 3, 4, 37), (6, 3, 3, 3)),
    "ragged_row_stride2": (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
                           (1, 3, 7, 29), (4, 3, 3, 3)),
}  # fmt: skip


def _task(fn: Callable[..., torch.Tensor], x: tuple[int, ...], w: tuple[int, ...]) -> Any:
    args = (torch.randn(*x), torch.randn(*w), torch.randn(w[0]))
    tasks = partition(make_fx(fn, tracing_mode="fake")(*args), CpuTarget()).tasks
    assert len(tasks) == 1, [t.label for t in tasks]
    return tasks[0]


def _im2col_points(payload: str, capabilities: dict[str, Any]) -> list[dict[str, Any]]:
    space, _ = schedule_space(analyze(payload), capabilities)
    return [config for config, _ in space if config.get("algorithm") == "im2col"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_im2col_configurations_verify(name: str, target: CpuTarget) -> None:
    fn, x, w = CASES[name]
    task = _task(fn, x, w)
    payload = prepare_payload(task.payload)
    points = _im2col_points(payload, {**target.capabilities(), "threads": 2, "openmp": True})
    assert points, "no im2col configuration for a batch-1 convolution"
    threads = {p["threads"] for p in points}
    # The first configuration of each thread count, and the widest register tile.
    chosen = [next(p for p in points if p["threads"] == t) for t in sorted(threads)]
    for config in chosen:
        source = kernel_source(payload, analyze(payload), config)
        result = target.evaluate(
            task.spec, Kernel(source), oracle=Kernel(task.payload), measure=False
        )
        assert result.verdict == "verified", f"{config}: {result.error}"


def test_im2col_is_offered_only_where_it_renders() -> None:
    capabilities = {**CpuTarget().capabilities(), "threads": 2, "openmp": True}
    transposed = make_fx(
        lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1), tracing_mode="fake"
    )(torch.randn(1, 16, 9, 16), torch.randn(16, 8, 4, 4))
    (task,) = partition(transposed, CpuTarget()).tasks
    assert _im2col_points(prepare_payload(task.payload), capabilities) == []
    payload = prepare_payload(
        _task(lambda x, w, b: F.conv2d(x, w, b, padding=1), (1, 6, 6, 20), (12, 6, 3, 3)).payload
    )
    info = analyze(payload)
    config = _im2col_points(payload, capabilities)[0]
    assert renders(info, capabilities, config)
    # Mutations it cannot take: register rows that do not divide the 12 output channels, a
    # panel more than a third zero columns (20 columns in panels of 32).
    assert not renders(info, capabilities, {**config, "register": [8, config["register"][1], 1]})
    assert not renders(info, capabilities, {**config, "register": [4, 32, 1]})
    # Two threads on one image of 5 output rows and 12 channels in tiles of 4: the schedule
    # would split the channels into 6 each, not whole register tiles (even panels, 10 of 32
    # columns, do not help: the schedule does not split panels).
    odd = prepare_payload(
        _task(lambda x, w, b: F.conv2d(x, w, b, padding=1), (1, 6, 5, 64), (12, 6, 3, 3)).payload
    )
    two = {**config, "threads": 2, "register": [4, 32, 1]}
    assert not renders(analyze(odd), capabilities, two)
    assert renders(analyze(odd), capabilities, {**two, "threads": 1})
