"""Matmuls that take B packed in panels: verified in the worker, re-packed after a write, and
refused where the layout does not fit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kope.frontend.partition import partition
from kope.passes.analysis import PlainMatmul, analyze, prepare_payload
from kope.spaces.cpu import schedule_space
from kope.spaces.kernels import kernel_source
from kope.spaces.schedules import _panels, _thread_tiles, config_key, k_tile
from kope.targets.cpu import BuildError, CpuTarget, build_kernel
from kope.vocabulary.kernels import Kernel
from kope.vocabulary.layouts import (
    LayoutError,
    laid_out,
    lay_out,
    layout_strides,
    panel_geometry,
    span,
    strided,
)
from kope.vocabulary.specs import TensorSpec

CAPABILITIES = {"vector_bits": 256, "threads": 2, "openmp": True}


@pytest.fixture(scope="module")
def target() -> CpuTarget:
    cpu = CpuTarget(workers=1, timeout_s=120)
    yield cpu
    cpu.close()


def _task(fn: Callable[..., Any], *args: torch.Tensor) -> Any:
    tasks = partition(make_fx(fn, tracing_mode="fake")(*args), CpuTarget()).tasks
    assert len(tasks) == 1, [t.label for t in tasks]
    return tasks[0]


def _packed(threads: int, register: list[int], cache: list[int] | None = None) -> dict[str, Any]:
    return {
        "family": "contraction",
        "threads": threads,
        "cache": cache or [64, 256, 256],
        "register": register,
        "pack": True,
    }


def _source(task: Any, config: dict[str, Any]) -> str:
    payload = prepare_payload(task.payload)
    return kernel_source(payload, analyze(payload), config)


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


# Odd sizes that still divide into whole tiles, with k neither a power of two nor a multiple
# of the unroll; two threads split the rows (8 rows), the panels (4 rows, 4 panels) or,
# dividing neither (12 rows of 4-row tiles, 3 panels), the rows padded to 16, each thread
# padding its own.
CASES = {
    "addmm": (
        lambda x, w, b: torch.nn.functional.linear(x, w, b),
        (torch.randn(12, 37, generator=_gen()), torch.randn(48, 37), torch.randn(48)),
    ),
    "mm_transposed_b": (
        lambda a, b: a @ b.t(),
        (torch.randn(8, 40, generator=_gen()), torch.randn(32, 40)),
    ),
    "mm_few_rows": (
        torch.mm,
        (torch.randn(4, 33, generator=_gen()), torch.randn(33, 64)),
    ),
    # Ragged: a last panel padded with zero columns, last rows masked, panels padded to an
    # even number for two threads (50 columns: 4 panels of 16, or 2 of 32).
    "addmm_ragged": (
        lambda x, w, b: torch.nn.functional.linear(x, w, b),
        (torch.randn(13, 37, generator=_gen()), torch.randn(50, 37), torch.randn(50)),
    ),
    "mm_ragged": (
        torch.mm,
        (torch.randn(9, 20, generator=_gen()), torch.randn(20, 40)),
    ),
    # Epilogues the partitioner fuses after a matmul (`fused_groups`), the packed product
    # replacing the matmul in the payload: an activation after a bias, a gate read from
    # another input, a residual, a whole matrix added; ragged, where the epilogue reads the
    # product's valid slice.
    "addmm_gelu": (
        lambda x, w, b: torch.nn.functional.gelu(
            torch.nn.functional.linear(x, w, b), approximate="tanh"
        ),
        (torch.randn(12, 37, generator=_gen()), torch.randn(48, 37), torch.randn(48)),
    ),
    "mm_gated_ragged": (
        lambda x, w, g: torch.nn.functional.silu(g) * (x @ w.t()),
        (torch.randn(13, 24, generator=_gen()), torch.randn(50, 24), torch.randn(13, 50)),
    ),
    "mm_residual": (
        lambda x, w, r: r + x @ w,
        (torch.randn(8, 40, generator=_gen()), torch.randn(40, 32), torch.randn(8, 32)),
    ),
    "addmm_matrix_ragged": (
        torch.addmm,
        (torch.randn(9, 40), torch.randn(9, 16, generator=_gen()), torch.randn(16, 40)),
    ),
}
CONFIGS = [
    _packed(2, [4, 16, 1]),
    _packed(1, [8, 8, 1], [32, 128, 512]),
    _packed(2, [4, 16, 4], [64, 128, 128]),
    _packed(2, [2, 32, 1]),
]


@pytest.mark.parametrize("name", sorted(CASES))
def test_packed_matmuls_verify(name: str, target: CpuTarget) -> None:
    fn, args = CASES[name]
    task = _task(fn, *args)
    info = analyze(prepare_payload(task.payload))
    space = [config for config, _ in schedule_space(info, CAPABILITIES)[0] if config.get("pack")]
    assert space, f"{task.label}: no packed point"
    for config in CONFIGS:
        result = target.evaluate(
            task.spec, Kernel(_source(task, config)), oracle=Kernel(task.payload), measure=False
        )
        assert result.verdict == "verified", f"{task.label}, {config}: {result.error}"


@pytest.mark.parametrize(
    "vector_bits, first, accumulators", [(256, [6, 16, 1], {12, 8}), (512, [8, 32, 1], {16})]
)
def test_packed_register_tiles_are_sized_by_the_machines_vector_registers(
    vector_bits: int, first: list[int], accumulators: set[int]
) -> None:
    """AVX2 (16 registers): 6 rows of two vectors first; AVX-512 (32): 8 rows of two, and 4
    of four beside them (16 accumulators), which ran faster there than AVX2's 12."""
    task = _task(lambda x, w: x @ w, torch.randn(128, 96), torch.randn(96, 256))
    info = analyze(prepare_payload(task.payload))
    capabilities = {**CAPABILITIES, "vector_bits": vector_bits}
    space, widened = schedule_space(info, capabilities)
    core = [(c, score) for c, score in space if c.get("pack") and config_key(c) not in widened]
    best = max(core, key=lambda point: point[1])[0]
    assert best["register"] == first, best
    lanes = vector_bits // 32
    for config, _ in core:
        mr, nr, _ = config["register"]
        assert mr * nr // lanes in accumulators, config


def test_avx512_sized_packed_tiles_verify(target: CpuTarget) -> None:
    """The 16-accumulator tiles (8 rows x two vectors of 16, 4 x four) on a ragged product
    and one with an epilogue: correct wherever they run (wider than this machine's vectors,
    LLVM splits them)."""
    for name in ("mm_gated_ragged", "addmm_matrix_ragged"):
        fn, args = CASES[name]
        task = _task(fn, *args)
        for register in ([8, 32, 1], [4, 64, 1]):
            config = _packed(2, register)
            result = target.evaluate(
                task.spec, Kernel(_source(task, config)), oracle=Kernel(task.payload), measure=False
            )
            assert result.verdict == "verified", f"{task.label}, {config}: {result.error}"


EPILOGUES = ["addmm_gelu", "addmm_matrix_ragged", "mm_gated_ragged", "mm_residual"]


@pytest.mark.parametrize("name", EPILOGUES)
def test_unpacked_schedules_verify_with_an_epilogue(name: str, target: CpuTarget) -> None:
    """The unpacked contraction schedules tile a fused epilogue like the product's consumer."""
    fn, args = CASES[name]
    task = _task(fn, *args)
    info = analyze(prepare_payload(task.payload))
    space = sorted(schedule_space(info, CAPABILITIES)[0], key=lambda point: -point[1])
    unpacked = [config for config, _ in space if not config.get("pack")][:2]
    assert unpacked, f"{task.label}: no unpacked point"
    for config in unpacked:
        result = target.evaluate(
            task.spec, Kernel(_source(task, config)), oracle=Kernel(task.payload), measure=False
        )
        assert result.verdict == "verified", f"{task.label}, {config}: {result.error}"


def test_a_weight_written_in_place_is_packed_again() -> None:
    x, w, b = torch.randn(8, 24), torch.randn(32, 24), torch.randn(32)
    task = _task(lambda x, w, b: torch.nn.functional.linear(x, w, b), x, w, b)
    kernel = build_kernel(task.spec, Kernel(_source(task, _packed(1, [4, 16, 1]))))
    torch.testing.assert_close(kernel(b, x, w.t())[0], torch.addmm(b, x, w.t()))
    w.mul_(-3.0)  # the version counter moves: the cached panels are stale
    torch.testing.assert_close(kernel(b, x, w.t())[0], torch.addmm(b, x, w.t()))
    other = torch.randn(32, 24)  # another weight at another address
    torch.testing.assert_close(kernel(b, x, other.t())[0], torch.addmm(b, x, other.t()))
    with torch.inference_mode():  # inference tensors count no writes: packed every call
        frozen = torch.randn(32, 24)
        torch.testing.assert_close(kernel(b, x, frozen.t())[0], torch.addmm(b, x, frozen.t()))


@pytest.mark.parametrize(
    "k, n, layout",
    [(24, 32, "panels:16"), (24, 20, "panels:8:3"), (24, 20, "panels:8:4"), (5, 16, "panels:8:4")],
)
@pytest.mark.parametrize("transposed", [False, True])
def test_panels_hold_the_columns_in_order_and_zeros_past_them(
    k: int, n: int, layout: str, transposed: bool
) -> None:
    b = torch.randn(n, k).t() if transposed else torch.randn(k, n)
    packed = lay_out(b, layout)
    width, count = panel_geometry(layout)
    count = count or n // width
    assert packed.shape == (count, k, width) and packed.is_contiguous()
    columns = packed.permute(1, 0, 2).reshape(k, count * width)
    assert torch.equal(columns[:, :n], b)
    assert not columns[:, n:].any()


def test_a_strided_layout_passes_a_view_where_it_lies_and_lays_out_anything_else() -> None:
    projection = torch.randn(2, 5, 3, 4, 8)  # B x L x 3 x H x D
    view = projection.permute(2, 0, 3, 1, 4)[1]  # k: B x H x L x D, offset H x D
    layout = strided(view.stride())
    assert laid_out(TensorSpec.of(view), layout).shape == (span(view.shape, view.stride()),)
    laid = lay_out(view, layout)
    assert laid.data_ptr() == view.data_ptr() and laid.is_contiguous()  # no copy
    assert torch.equal(laid.as_strided(view.shape, view.stride()), view)
    # The same values contiguous: copied into the layout's strides, the gaps unread.
    copied = lay_out(view.contiguous(), layout)
    assert copied.data_ptr() != view.data_ptr()
    assert torch.equal(copied.as_strided(view.shape, view.stride()), view)
    with pytest.raises(LayoutError, match="does not fit a 3-D"):
        lay_out(view[0], layout)
    with pytest.raises(LayoutError, match="needs strides"):
        layout_strides("strided:")


@pytest.mark.parametrize(
    "layout, message",
    [
        ("panels:5", "divide into panels of 5"),
        ("panels:16:1", "fit in 1 panels of 16"),
        ("tiles:4", "unknown input layout"),
        ("strided:16,1,1", "gives 3 strides for a 2-D argument"),
    ],
)
def test_a_layout_that_does_not_fit_is_refused(layout: str, message: str) -> None:
    a, b = torch.randn(8, 16), torch.randn(16, 32)
    task = _task(torch.mm, a, b)
    source = _source(task, _packed(1, [4, 16, 1])).replace('"panels:16"', f'"{layout}"')
    with pytest.raises(BuildError, match=message):
        build_kernel(task.spec, Kernel(source))


@pytest.mark.parametrize(
    "fn, args",
    [
        (torch.bmm, (torch.randn(2, 8, 16), torch.randn(2, 16, 32))),  # B is an activation
        (torch.mm, (torch.randn(8, 16), torch.randn(16, 7))),  # fewer columns than a panel
        (torch.mv, (torch.randn(8, 16), torch.randn(16))),  # m x k, no n: no contraction point
        # B read by more than the matmul: its packed copy could not serve the other reader
        (lambda a, b: (a @ b) * b, (torch.randn(16, 16), torch.randn(16, 16))),
    ],
)
def test_only_plain_matmuls_a_tile_large_get_packed_points(fn: Any, args: tuple) -> None:
    tasks = partition(make_fx(fn, tracing_mode="fake")(*args), CpuTarget(), fuse=True).tasks
    info = analyze(prepare_payload(tasks[0].payload))
    packed = [c for c, _ in schedule_space(info, CAPABILITIES)[0] if c.get("pack")]
    assert not packed, packed


@pytest.mark.parametrize(
    "m, n, register, rows, per_thread, columns",
    [
        (256, 208, 4, 128, 13, 208),  # rows split evenly into register tiles
        (255, 193, 4, 128, 13, 208),  # one zero row, each thread padding its own
        (100, 77, 4, 52, 5, 80),  # 4 zero rows, not a sixth zero panel
        (252, 256, 4, 128, 16, 256),  # 4 zero rows although the panels split evenly
        (256, 256, 6, 132, 16, 256),  # 8 zero rows, where one thread alone pads 2
        (4, 64, 4, 4, 2, 64),  # one register tile of rows: the panels split
        (16, 64, 6, 18, 2, 64),  # 24 rows (8 zero) in tiles of 6 per thread: the panels
    ],
)
def test_threads_split_the_rows_unless_that_adds_many_zero_rows(
    m: int, n: int, register: int, rows: int, per_thread: int, columns: int
) -> None:
    plain = PlainMatmul(m=m, k=33, n=n, arguments=(), a=0, b=1)
    shape = _panels(plain, _packed(2, [register, 16, 1]))
    assert (shape.rows, shape.per_thread, shape.columns) == (rows, per_thread, columns)


@pytest.mark.parametrize(
    "k, unroll, tile",
    [
        (512, 1, 256),  # divides: the target
        (129, 1, 129),  # under the target: whole
        (257, 1, 257),  # a prime above it: whole, not one step at a time
        (2 * 521, 1, 2 * 521),  # divisors 2 and 521: whole
        (3 * 7 * 49, 1, 147),  # a divisor over half the target: taken
        (257, 4, 256),  # the unroll does not divide k: the target (partial tiles, masked)
    ],
)
def test_k_is_taken_whole_where_its_divisors_near_the_cache_tile_are_small(
    k: int, unroll: int, tile: int
) -> None:
    assert k_tile(k, 256, unroll) == tile


def test_a_prime_k_above_the_cache_tile_verifies(target: CpuTarget) -> None:
    task = _task(torch.mm, torch.randn(7, 257, generator=_gen()), torch.randn(257, 20))
    for config in (_packed(1, [6, 16, 1]), {**_packed(1, [4, 16, 1]), "pack": False}):
        source = _source(task, config)
        assert "257]" in source, "the k cache tile is not the whole of k"
        result = target.evaluate(
            task.spec, Kernel(source), oracle=Kernel(task.payload), measure=False
        )
        assert result.verdict == "verified", f"{config}: {result.error}"


ONE_ROW = {
    "mm": (torch.mm, (torch.randn(1, 64, generator=_gen()), torch.randn(64, 80))),
    # The bias and activation read the product through a reshape (its unit row dropped):
    # unpacked, fusion cannot follow it, and on two threads each runs a parallel loop of its
    # own; packed, the epilogue is 1-D.
    "linear_relu": (
        lambda x, w, b: torch.relu(torch.nn.functional.linear(x, w, b)),
        (torch.randn(1, 37, generator=_gen()), torch.randn(70, 37), torch.randn(70)),
    ),
    "three_rows_residual": (
        lambda x, w, r: r + x @ w,
        (torch.randn(3, 40, generator=_gen()), torch.randn(40, 48), torch.randn(3, 48)),
    ),
}


@pytest.mark.parametrize("name", sorted(ONE_ROW))
def test_products_of_a_few_rows_take_tiles_of_their_rows_and_verify(
    name: str, target: CpuTarget
) -> None:
    """A matrix-vector product (a linear layer at batch 1) took 4-row tiles, 3 rows of them
    zeros (0.5x torch.mm), and its 2-thread points did not build (threads split the rows)."""
    fn, args = ONE_ROW[name]
    task = _task(fn, *args)
    rows = args[0].shape[0]
    info = analyze(prepare_payload(task.payload))
    space = sorted(schedule_space(info, CAPABILITIES)[0], key=lambda point: -point[1])
    firsts = [
        next(c for c, _ in space if bool(c.get("pack")) == pack and c["threads"] == threads)
        for pack in (False, True)
        if any(bool(c.get("pack")) == pack for c, _ in space)
        for threads in (2, 1)
    ]
    assert len(firsts) == 4, firsts
    for config in firsts:
        assert config["register"][0] == rows, config
        result = target.evaluate(
            task.spec, Kernel(_source(task, config)), oracle=Kernel(task.payload), measure=False
        )
        assert result.verdict == "verified", f"{task.label}, {config}: {result.error}"


@pytest.mark.parametrize(
    "rank, batch, batch_chunk, columns, sizes",
    [
        (3, False, 0, True, [0, 512, 0]),  # the product m, n, k: its columns, never k
        (2, False, 0, True, [0, 512]),  # its consumer m, n
        (3, False, 0, False, [4, 0, 0]),  # rows
        (4, True, 2, False, [2, 0, 0, 0]),  # batches
        (4, True, 0, True, [0, 0, 512, 0]),  # a batch too small to split: columns
    ],
)
def test_threads_tile_the_dims_they_split(
    rank: int, batch: bool, batch_chunk: int, columns: bool, sizes: list[int]
) -> None:
    """A product that was the result split its k, not its columns, on two threads (one
    iteration: a serial kernel)."""
    assert _thread_tiles(rank, batch, batch_chunk, columns, 4, 512) == sizes
