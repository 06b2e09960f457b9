"""Triton kernels written from linalg payloads (`kope.spaces.triton_kernels`) compute what
eager computes: each operator's first configurations of both flavours (cuda, ascend) are
rendered, loaded under Triton's CPU interpreter and run on ragged shapes (37, 29, 100, 9x11:
every block has a masked edge), in each family: pointwise, rows (with argmax), matmul, and
loops (convolutions, padded ones too, pooling windows, reductions over leading or middle
dims). Also: the Ascend launch is a 1-D grid within the core count, the sources stay inside
the target's allow-list, and what is not supported says why, on the target it is asked for."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import replace
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from kope.spaces.triton_kernels import (
    LOOPS,
    MATMUL,
    POINTWISE,
    ROWS,
    describe_config,
    render_triton,
    triton_space,
    unsupported_reason,
)
from kope.targets import get_target
from kope.targets.ascend import ASCEND_RULES
from kope.targets.cuda import CUDA_RULES
from kope.targets.triton import widen_interpreted_bf16_dot
from kope.targets.triton_sandbox import screen_triton
from kope.tools.precompile import trace_tasks
from kope.vocabulary.specs import TensorSpec

interpreter = pytest.importorskip("triton.runtime.interpreter")
jit = pytest.importorskip("triton.runtime.jit")
tl = pytest.importorskip("triton.language")

CUDA = CUDA_RULES  # under the interpreter: no device to count the multiprocessors of
ASCEND = ASCEND_RULES
FLAVOURS = {"cuda": CUDA, "ascend": ASCEND}
CONFIGS = 2  # per operator and flavour: the first ones the agent would try
TOLERANCE = {  # (rtol, atol); the interpreter rounds bfloat16 by truncation
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
}


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t


def _f16(t: torch.Tensor) -> torch.Tensor:
    return t.half()


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.bfloat16()


# name -> (function, input shapes, dtype cast, the family every task of it gets)
CASES: dict[str, tuple[Callable[..., Any], list[tuple[int, ...]], Callable[..., Any], str]] = {
    "x_sigmoid": (lambda x: x * torch.sigmoid(x), [(7, 37)], _f32, POINTWISE),
    "gelu": (F.gelu, [(7, 37)], _f32, POINTWISE),
    "gelu_tanh_f16": (lambda x: F.gelu(x, approximate="tanh"), [(7, 37)], _f16, POINTWISE),
    "silu_mul": (lambda a, b: F.silu(a) * b, [(7, 37), (7, 37)], _f32, POINTWISE),
    "silu_mul_bf16": (lambda a, b: F.silu(a) * b, [(7, 37), (7, 37)], _bf16, POINTWISE),
    "add_broadcast": (lambda x, y, z: x + y + z, [(7, 37), (37,), (7, 1)], _f32, POINTWISE),
    "where_compare": (lambda x: torch.where(x > 0, x, 0.1 * x), [(7, 37)], _f32, POINTWISE),
    # log1p and expm1 of small arguments, scaled back up: log(1 + x) and exp(x) - 1 were 1e-3
    # off there, far past the tolerance once scaled
    "log1p_expm1_small": (
        lambda x: (torch.log1p(x * 1e-7) + torch.expm1(x * 1e-7)) * 1e7,
        [(7, 37)],
        _f32,
        POINTWISE,
    ),
    "permute_contiguous": (
        lambda x: x.permute(2, 0, 1).contiguous() + 1,
        [(3, 5, 7)],
        _f32,
        POINTWISE,
    ),
    "softmax": (lambda x: torch.softmax(x, -1), [(45, 37)], _f32, ROWS),
    "softmax_bf16": (lambda x: torch.softmax(x, -1), [(7, 37)], _bf16, ROWS),
    "log_softmax": (lambda x: torch.log_softmax(x, -1), [(7, 100)], _f32, ROWS),
    "layer_norm": (
        lambda x, w, b: F.layer_norm(x, (37,), w, b),
        [(2, 3, 37), (37,), (37,)],
        _f32,
        ROWS,
    ),
    "layer_norm_f16": (
        lambda x, w, b: F.layer_norm(x, (37,), w, b),
        [(7, 37), (37,), (37,)],
        _f16,
        ROWS,
    ),
    "mean_sum_amax_var": (
        lambda x: (x.mean(-1), x.sum(-1), x.amax(-1, keepdim=True), x.var(-1)),
        [(7, 37)],
        _f32,
        ROWS,
    ),
    "sum_two_dims": (lambda x: x.sum((-2, -1)), [(3, 5, 7)], _f32, ROWS),
    "argmax_last_dim": (lambda x: x.argmax(-1), [(7, 37)], _f32, ROWS),
    "argmin_last_dim_f16": (lambda x: x.argmin(-1), [(7, 37)], _f16, ROWS),
    "mm": (torch.mm, [(37, 50), (50, 29)], _f32, MATMUL),
    "mm_f16": (torch.mm, [(37, 24), (24, 29)], _f16, MATMUL),
    "bmm": (torch.bmm, [(2, 17, 24), (2, 24, 9)], _f32, MATMUL),
    "linear": (F.linear, [(37, 50), (29, 50), (29,)], _f32, MATMUL),
    "linear_bf16": (F.linear, [(37, 24), (29, 24), (29,)], _bf16, MATMUL),
    "pad_constant": (lambda x: F.pad(x, (1, 2, 0, 3), value=0.5), [(7, 37)], _f32, POINTWISE),
    # Reductions that are not rows, and windows: a block of outputs, the reduction looped.
    "sum_first_dim": (lambda x: x.sum(0), [(7, 37)], _f32, LOOPS),
    "sum_first_dim_long": (lambda x: x.sum(0), [(100, 29)], _f32, LOOPS),  # a dynamic loop
    "sum_middle_dim": (lambda x: x.sum(1), [(3, 7, 5)], _f32, LOOPS),
    "var_first_dim": (lambda x: x.var(0), [(7, 37)], _f32, LOOPS),
    "argmin_first_dim": (lambda x: x.argmin(0), [(7, 37)], _f32, LOOPS),
    "prod_last_dim": (lambda x: x.prod(-1), [(7, 37)], _f32, LOOPS),  # no tl.prod: looped
    "conv2d_pad_bias": (
        lambda x, w, b: F.conv2d(x, w, b, padding=1),
        [(2, 3, 9, 11), (5, 3, 3, 3), (5,)],
        _f32,
        LOOPS,
    ),
    "conv2d_stride2": (  # 8 x 3 x 3 taps: the channel loop is dynamic, the window static
        lambda x, w: F.conv2d(x, w, stride=2),
        [(2, 8, 9, 11), (5, 8, 3, 3)],
        _f32,
        LOOPS,
    ),
    "conv2d_depthwise": (
        lambda x, w: F.conv2d(x, w, padding=1, groups=3),
        [(2, 3, 9, 11), (3, 1, 3, 3)],
        _f32,
        LOOPS,
    ),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2, 2), [(2, 3, 9, 11)], _f32, LOOPS),
    "max_pool2d_pad_bf16": (
        lambda x: F.max_pool2d(x, 3, 2, padding=1),
        [(2, 3, 9, 11)],
        _bf16,
        LOOPS,
    ),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 2, 2), [(2, 3, 9, 11)], _f32, LOOPS),
    "avg_pool2d_pad": (
        lambda x: F.avg_pool2d(x, 3, 2, padding=1, count_include_pad=False),
        [(2, 3, 9, 11)],
        _f32,
        LOOPS,
    ),
}


class _Fn(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: torch.Tensor) -> Any:
        return self.fn(*args)


@cache
def _tasks(name: str) -> list[Any]:
    fn, shapes, cast, _ = CASES[name]
    inputs = [cast(torch.randn(s)) for s in shapes]
    return trace_tasks(_Fn(fn), inputs, get_target("cpu"))


def _random(spec: TensorSpec) -> torch.Tensor:
    if spec.dtype == "bool":
        return torch.rand(spec.shape) > 0.5
    if spec.torch_dtype.is_floating_point:
        return torch.randn(spec.shape).to(spec.torch_dtype)
    return torch.randint(-5, 5, spec.shape, dtype=spec.torch_dtype)


class _Recorder:
    """Stands for a kernel in a loaded module, recording each launch's grid and options."""

    def __init__(self, kernel: Any, launches: list[tuple[tuple[int, ...], dict[str, Any]]]):
        self.kernel = kernel
        self.launches = launches

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        def call(*args: Any, **kwargs: Any) -> None:
            self.launches.append((tuple(grid), kwargs))
            self.kernel[grid](*args, **kwargs)

        return call


def _load(source: str, path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The kernel module under Triton's CPU interpreter.

    `@triton.jit` chooses the interpreter as it decorates (TRITON_INTERPRET). Torch imported
    triton long before, so triton's own jit functions (`tl.sum`, `tl.sigmoid`, ...) were made
    for compilation: for this test they are wrapped for the interpreter as well."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for name, module in list(sys.modules.items()):
        if name.startswith("triton.language") and module is not None:
            for attr, value in list(vars(module).items()):
                if isinstance(value, jit.JITFunction):
                    monkeypatch.setattr(module, attr, interpreter.InterpretedFunction(value.fn))
    widen_interpreted_bf16_dot()  # as the Triton targets' workers do
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(
    source: str,
    path: Path,
    monkeypatch: pytest.MonkeyPatch,
    inputs: list[torch.Tensor],
    outputs: tuple[TensorSpec, ...],
) -> tuple[list[torch.Tensor], list[tuple[tuple[int, ...], dict[str, Any]]]]:
    module = _load(source, path, monkeypatch)
    launches: list[tuple[tuple[int, ...], dict[str, Any]]] = []
    for name, value in list(vars(module).items()):
        if name.startswith("_kope_"):
            setattr(module, name, _Recorder(value, launches))
    results = [torch.empty(s.shape, dtype=s.torch_dtype) for s in outputs]
    module.launch(*inputs, *results)
    return results, launches


def _check_launches(
    launches: list[tuple[tuple[int, ...], dict[str, Any]]], flavour: str, family: str
) -> None:
    assert launches
    for grid, options in launches:
        if flavour == "ascend":
            limit = ASCEND.dot_programs if family == MATMUL else ASCEND.programs
            assert len(grid) == 1 and 1 <= grid[0] <= limit, grid
            assert "num_warps" not in options and "num_stages" not in options
        else:
            assert 1 <= len(grid) <= CUDA.grid_dims


def _screen(source: str) -> None:
    """The Triton targets' own screen: what the generator writes, the build accepts."""
    assert screen_triton(source) is None, screen_triton(source)


def _verify(
    payload: str,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    eager: Callable[[list[torch.Tensor]], Any],
    family: str,
    flavour: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rules = FLAVOURS[flavour]
    space = triton_space(payload, inputs, outputs, rules)
    assert space, unsupported_reason(payload, inputs, outputs)
    assert {config["family"] for config, _ in space} == {family}
    scores = [score for _, score in space]
    assert scores == sorted(scores, reverse=True)
    for n, (config, _) in enumerate(space[:CONFIGS]):
        source = render_triton(payload, inputs, outputs, config, rules)
        _screen(source)
        args = [_random(s) for s in inputs]
        path = tmp_path / f"kernel_{flavour}_{n}.py"
        results, launches = _run(source, path, monkeypatch, args, outputs)
        _check_launches(launches, flavour, family)
        for got, want in zip(results, eager(args), strict=True):
            rtol, atol = TOLERANCE.get(got.dtype, (0.0, 0.0))
            where = f"{describe_config(config)} ({path})"
            torch.testing.assert_close(
                got, want, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m, w=where: f"{w}: {m}"
            )


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("name", CASES)
def test_traced_operators_match_eager(
    name: str, flavour: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = _tasks(name)
    assert tasks
    for task in tasks:
        spec = task.spec
        assert spec.eager is not None
        _verify(
            task.payload,
            spec.inputs,
            spec.outputs,
            spec.eager,
            CASES[name][3],
            flavour,
            tmp_path,
            monkeypatch,
        )


# Payloads written by hand for forms the traced models do not produce: a permuted copy (the
# partition materializes views), a matrix product with a transposed operand and a widening
# body, and two outputs of different shapes from one row kernel.
TRANSPOSE = """
module {
  func.func @main(%arg0: tensor<5x7x3xf32>) -> tensor<3x5x7xf32> {
    %0 = tensor.empty() : tensor<3x5x7xf32>
    %1 = linalg.transpose ins(%arg0 : tensor<5x7x3xf32>) outs(%0 : tensor<3x5x7xf32>)
      permutation = [2, 0, 1]
    return %1 : tensor<3x5x7xf32>
  }
}
"""
MATMUL_NT_RELU = """
#a = affine_map<(d0, d1, d2) -> (d0, d2)>
#b = affine_map<(d0, d1, d2) -> (d1, d2)>
#c = affine_map<(d0, d1, d2) -> (d0, d1)>
#e = affine_map<(d0, d1) -> (d0, d1)>
module {
  func.func @main(%arg0: tensor<37x24xf16>, %arg1: tensor<29x24xf16>) -> tensor<37x29xf16> {
    %zero = arith.constant 0.0 : f32
    %0 = tensor.empty() : tensor<37x29xf32>
    %1 = linalg.fill ins(%zero : f32) outs(%0 : tensor<37x29xf32>) -> tensor<37x29xf32>
    %2 = linalg.generic {indexing_maps = [#a, #b, #c],
                         iterator_types = ["parallel", "parallel", "reduction"]}
        ins(%arg0, %arg1 : tensor<37x24xf16>, tensor<29x24xf16>)
        outs(%1 : tensor<37x29xf32>) {
    ^bb0(%x: f16, %y: f16, %acc: f32):
      %xe = arith.extf %x : f16 to f32
      %ye = arith.extf %y : f16 to f32
      %p = arith.mulf %xe, %ye : f32
      %s = arith.addf %acc, %p : f32
      linalg.yield %s : f32
    } -> tensor<37x29xf32>
    %3 = tensor.empty() : tensor<37x29xf16>
    %4 = linalg.generic {indexing_maps = [#e, #e], iterator_types = ["parallel", "parallel"]}
        ins(%2 : tensor<37x29xf32>) outs(%3 : tensor<37x29xf16>) {
    ^bb0(%in: f32, %out: f16):
      %r = arith.maximumf %in, %zero : f32
      %t = arith.truncf %r : f32 to f16
      linalg.yield %t : f16
    } -> tensor<37x29xf16>
    return %4 : tensor<37x29xf16>
  }
}
"""
MEAN_AND_CENTERED = """
#x = affine_map<(d0, d1) -> (d0, d1)>
#r = affine_map<(d0, d1) -> (d0)>
#v = affine_map<(d0) -> (d0)>
module {
  func.func @main(%arg0: tensor<6x37xf32>) -> (tensor<6xf32>, tensor<6x37xf32>) {
    %zero = arith.constant 0.0 : f32
    %n = arith.constant 37.0 : f32
    %0 = tensor.empty() : tensor<6xf32>
    %1 = linalg.fill ins(%zero : f32) outs(%0 : tensor<6xf32>) -> tensor<6xf32>
    %2 = linalg.generic {indexing_maps = [#x, #r], iterator_types = ["parallel", "reduction"]}
        ins(%arg0 : tensor<6x37xf32>) outs(%1 : tensor<6xf32>) {
    ^bb0(%in: f32, %out: f32):
      %s = arith.addf %in, %out : f32
      linalg.yield %s : f32
    } -> tensor<6xf32>
    %3 = linalg.generic {indexing_maps = [#v, #v], iterator_types = ["parallel"]}
        ins(%2 : tensor<6xf32>) outs(%0 : tensor<6xf32>) {
    ^bb0(%in: f32, %out: f32):
      %m = arith.divf %in, %n : f32
      linalg.yield %m : f32
    } -> tensor<6xf32>
    %4 = tensor.empty() : tensor<6x37xf32>
    %5 = linalg.generic {indexing_maps = [#x, #r, #x], iterator_types = ["parallel", "parallel"]}
        ins(%arg0, %3 : tensor<6x37xf32>, tensor<6xf32>) outs(%4 : tensor<6x37xf32>) {
    ^bb0(%in: f32, %mean: f32, %out: f32):
      %d = arith.subf %in, %mean : f32
      linalg.yield %d : f32
    } -> tensor<6x37xf32>
    return %3, %5 : tensor<6xf32>, tensor<6x37xf32>
  }
}
"""


def _spec(shape: tuple[int, ...], dtype: str = "float32") -> TensorSpec:
    return TensorSpec(shape, dtype)


def _mean_and_centered(args: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    mean = args[0].mean(-1)
    return mean, args[0] - mean[:, None]


WRITTEN = {
    "transpose": (
        TRANSPOSE,
        (_spec((5, 7, 3)),),
        (_spec((3, 5, 7)),),
        lambda args: (args[0].permute(2, 0, 1),),
        POINTWISE,
    ),
    "matmul_nt_relu_f16": (
        MATMUL_NT_RELU,
        (_spec((37, 24), "float16"), _spec((29, 24), "float16")),
        (_spec((37, 29), "float16"),),
        lambda args: (torch.relu(args[0].float() @ args[1].float().T).half(),),
        MATMUL,
    ),
    "mean_and_centered": (
        MEAN_AND_CENTERED,
        (_spec((6, 37)),),
        (_spec((6,)), _spec((6, 37))),
        _mean_and_centered,
        ROWS,
    ),
}


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("name", WRITTEN)
def test_written_payloads_match_torch(
    name: str, flavour: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payload, inputs, outputs, eager, family = WRITTEN[name]
    _verify(payload, inputs, outputs, eager, family, flavour, tmp_path, monkeypatch)


def test_ascend_loops_over_more_tiles_than_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """35 matrix tiles on 20 AI cores: each program loops over its share."""
    inputs = [torch.randn(100, 24), torch.randn(24, 70)]
    (task,) = trace_tasks(_Fn(torch.mm), inputs, get_target("cpu"))
    spec = task.spec
    config = {"family": MATMUL, "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "multibuffer": False}
    source = render_triton(task.payload, spec.inputs, spec.outputs, config, ASCEND)
    args = [_random(s) for s in spec.inputs]
    results, launches = _run(source, tmp_path / "tiles.py", monkeypatch, args, spec.outputs)
    assert [grid for grid, _ in launches] == [(20,)]
    assert spec.eager is not None
    torch.testing.assert_close(results[0], spec.eager(args)[0], rtol=1e-4, atol=1e-4)


def test_configurations_describe_their_decisions() -> None:
    (task,) = _tasks("mm")
    spec = task.spec
    (best, _), *_ = triton_space(task.payload, spec.inputs, spec.outputs, CUDA)
    assert set(best) == {
        "family",
        "BLOCK_M",
        "BLOCK_N",
        "BLOCK_K",
        "GROUP_M",
        "num_warps",
        "num_stages",
    }
    assert describe_config(best).startswith("triton matmul BLOCK ")
    assert all(16 <= best[k] <= 64 for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    text = describe_config(
        {"family": MATMUL, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}
        | {"num_warps": 4, "num_stages": 3}
    )
    assert text == "triton matmul BLOCK 64x64x32 GROUP_M 8, 4 warps, 3 stages"
    with pytest.raises(ValueError, match="family"):
        render_triton(task.payload, spec.inputs, spec.outputs, {"family": ROWS, "BLOCK": 64}, CUDA)


UNSUPPORTED = {
    "concat": (lambda x, y: torch.cat([x, y]), [(7, 37), (7, 37)], "tensor.concat"),
    "long_rows": (lambda x: x.sum(-1), [(2, 20000)], "longer than"),
    "long_loops": (lambda x: x.sum(0), [(20000, 2)], "longer than"),
}


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_unsupported_operators_say_why(name: str) -> None:
    fn, shapes, reason = UNSUPPORTED[name]
    (task,) = trace_tasks(_Fn(fn), [torch.randn(s) for s in shapes], get_target("cpu"))
    spec = task.spec
    for rules in (*FLAVOURS.values(), None):
        if rules is not None:
            assert triton_space(task.payload, spec.inputs, spec.outputs, rules) == []
        found = unsupported_reason(task.payload, spec.inputs, spec.outputs, rules)
        assert found is not None and reason in found


def test_the_unified_buffer_reason_matches_an_empty_ascend_space() -> None:
    """Blocks that do not fit a small unified buffer: the space is empty on that target only,
    and the reason says so when given the target's rules."""
    (task,) = _tasks("conv2d_pad_bias")
    spec = task.spec
    small = replace(ASCEND, ub_bytes=1024)
    assert triton_space(task.payload, spec.inputs, spec.outputs, small) == []
    found = unsupported_reason(task.payload, spec.inputs, spec.outputs, small)
    assert found is not None and "unified buffer" in found and "1024" in found
    for rules in (None, CUDA, ASCEND):
        assert unsupported_reason(task.payload, spec.inputs, spec.outputs, rules) is None


NAN_CASES = {  # name -> (function, input shape, the payload's answer, family)
    "amax_last_dim": (lambda x: x.amax(-1), (7, 37), lambda x: x.amax(-1), ROWS),
    "amax_first_dim": (lambda x: x.amax(0), (7, 37), lambda x: x.amax(0), LOOPS),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2, 2), (2, 3, 9, 11), None, LOOPS),
    "argmax_last_dim": (lambda x: x.argmax(-1), (7, 37), None, ROWS),
    "argmax_first_dim": (lambda x: x.argmax(0), (7, 37), None, LOOPS),
}


@pytest.mark.parametrize("name", NAN_CASES)
def test_nan_terms_reduce_as_the_payload_says(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """maximumf propagates NaN, which tl.max does not; argmax's payload (imported from KOPE's
    decomposition, `kope.core.decompositions.REFERENCE_DECOMPOSITIONS`) picks the first NaN, as
    eager does."""
    fn, shape, answer, family = NAN_CASES[name]
    (task,) = trace_tasks(_Fn(fn), [torch.randn(shape)], get_target("cpu"))
    spec = task.spec
    x = torch.randn(shape)
    x[(torch.rand(shape) < 0.05)] = torch.nan
    x.view(-1)[3] = torch.nan  # at least one
    for flavour, rules in FLAVOURS.items():
        (config, _), *_ = triton_space(task.payload, spec.inputs, spec.outputs, rules)
        assert config["family"] == family
        source = render_triton(task.payload, spec.inputs, spec.outputs, config, rules)
        path = tmp_path / f"nan_{flavour}.py"
        (got,), _ = _run(source, path, monkeypatch, [x], spec.outputs)
        want = (answer or fn)(x)
        torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)


def test_constants_fold_by_the_operator_asked_for() -> None:
    """`x + 0` with both constant folds to x: no division by the zero addend (a padded
    convolution's `index - 0` crashed the generator once)."""
    from kope.spaces.triton_index import combine, constant_of, number

    assert constant_of(combine(number(3), "+", number(0))) == 3
    assert constant_of(combine(number(7), "//", number(2))) == 3


def test_a_generator_defect_costs_the_operator_its_kernel_not_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import kope.agents.heuristic as heuristic
    from kope.agents.base import ProposalRequest, TaskView

    def broken(*_: Any) -> Any:
        raise ZeroDivisionError("a defect")

    monkeypatch.setattr(heuristic, "triton_space", broken)
    view = TaskView(
        "k", "aten.relu.default", "relu", "", (), (), "cuda", {}, ("triton",), rules=CUDA
    )
    assert heuristic.HeuristicAgent().propose(ProposalRequest(view)) is None
