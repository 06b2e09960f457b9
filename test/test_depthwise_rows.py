"""A depthwise convolution by blocks of output rows in registers (`kope.spaces.depthwise`):
the configurations the space offers verify against the reference lowering (bias or none,
padding on both sides, one side or none, blocks that do not divide the plane, more than one
image, strides of 2 along the row, down the columns or both, one and two threads), and the
space offers them only where they render."""

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


def _dw(padding: Any = 0, bias: bool = True, **kw: Any) -> Callable[..., torch.Tensor]:
    def conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w, b if bias else None, padding=padding, groups=x.shape[1], **kw)

    return conv


# (the convolution, input shape, window)
CASES: dict[str, tuple[Callable[..., torch.Tensor], tuple[int, ...], int]] = {
    # 10 rows: blocks of 4 and 8 leave some over; 20 columns: a vector and a part.
    "3x3_ragged": (_dw(1), (1, 8, 10, 20), 3),
    "7x7": (_dw(3), (1, 4, 9, 28), 7),
    # No padding: the input is read as it is, two images.
    "5x5_valid_batch2": (_dw(0), (2, 4, 8, 18), 5),
    "no_bias": (_dw(1, bias=False), (1, 6, 7, 16), 3),
    # Padding along the row only.
    "row_padding_only": (_dw((0, 1)), (1, 4, 6, 33), 3),
    # A row of several blocks and a part.
    "wide_row": (_dw(1), (1, 2, 5, 70), 3),
    # Strides of 2: odd and even extents, a last input row no window reads, an odd padding.
    "3x3_stride2": (_dw(1, stride=2), (1, 8, 13, 29), 3),
    "5x5_stride2": (_dw(2, stride=2), (1, 4, 12, 36), 5),
    "stride2_valid_batch2": (_dw(0, stride=2), (2, 4, 10, 21), 3),
    "stride2_down_only": (_dw(1, stride=(2, 1)), (1, 4, 9, 20), 3),
    "stride2_along_only": (_dw((0, 3), stride=(1, 2)), (1, 4, 9, 40), 7),
}


def _task(fn: Callable[..., torch.Tensor], x: tuple[int, ...], k: int) -> Any:
    args = (torch.randn(*x), torch.randn(x[1], 1, k, k), torch.randn(x[1]))
    tasks = partition(make_fx(fn, tracing_mode="fake")(*args), CpuTarget()).tasks
    assert len(tasks) == 1, [t.label for t in tasks]
    return tasks[0]


def _capabilities(target: CpuTarget) -> dict[str, Any]:
    return {**target.capabilities(), "threads": 2, "openmp": True}


def _row_points(payload: str, capabilities: dict[str, Any]) -> list[tuple[dict[str, Any], float]]:
    space, _ = schedule_space(analyze(payload), capabilities)
    return [(config, score) for config, score in space if config.get("algorithm") == "rows"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_row_block_configurations_verify(name: str, target: CpuTarget) -> None:
    fn, x, k = CASES[name]
    task = _task(fn, x, k)
    payload = prepare_payload(task.payload)
    points = [config for config, _ in _row_points(payload, _capabilities(target))]
    assert points, "no row-block configuration for a stride-1 depthwise convolution"
    # The first configuration of each thread count, one block of a single vector, and the
    # first with vectors half as long (what a machine with half the vector width is offered).
    chosen = [next(p for p in points if p["threads"] == t) for t in (2, 1)]
    chosen.append(next(p for p in points if p["columns"] == p["vector"]))
    half = chosen[0]["vector"] // 2
    chosen.append({**chosen[0], "vector": half, "columns": 2 * half})
    for config in chosen:
        source = kernel_source(payload, analyze(payload), config)
        result = target.evaluate(
            task.spec, Kernel(source), oracle=Kernel(task.payload), measure=False
        )
        assert result.verdict == "verified", f"{config}: {result.error}"


def test_row_blocks_come_first_and_only_where_they_render(target: CpuTarget) -> None:
    capabilities = _capabilities(target)
    payload = prepare_payload(_task(_dw(1), (1, 8, 14, 14), 3).payload)
    info = analyze(payload)
    space, _ = schedule_space(info, capabilities)
    best = max(space, key=lambda point: point[1])[0]
    assert best.get("algorithm") == "rows"
    assert renders(info, capabilities, best)
    lanes = best["vector"]
    # Blocks whose sums take more registers than the machine has, or vectors of another width.
    registers = 32 if lanes * 32 >= 512 else 16
    assert not renders(info, capabilities, {**best, "rows": registers, "columns": 2 * lanes})
    assert not renders(info, capabilities, {**best, "vector": 2 * lanes, "columns": 2 * lanes})
    # Threads that do not split the 8 channels evenly.
    assert not renders(info, {**capabilities, "threads": 3}, {**best, "threads": 3})
    # A dilated window, or a stride of 3: not offered.
    for fn in (_dw(2, dilation=2), _dw(1, stride=3)):
        other = prepare_payload(_task(fn, (1, 8, 14, 14), 3).payload)
        assert _row_points(other, capabilities) == []
        assert not renders(analyze(other), capabilities, best)
