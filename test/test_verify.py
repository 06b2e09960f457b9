"""The verifier's rules: tolerances by dtype, NaN never passes, poison and canaries work."""

from __future__ import annotations

import math

import pytest
import torch

from kope.targets import verify
from kope.targets.base import TensorSpec


def test_close_values_pass_and_far_ones_fail() -> None:
    want = torch.randn(100, dtype=torch.float32)
    assert verify.compare(want + 1e-7, want).ok
    bad = want.clone()
    bad[17] += 0.01
    result = verify.compare(bad, want, index=2)
    assert not result.ok and "output 2" in result.message and "[17]" in result.message


def test_nan_never_passes_for_a_number() -> None:
    want = torch.ones(4)
    got = want.clone()
    got[1] = math.nan
    assert not verify.compare(got, want).ok


def test_nan_and_inf_must_match_exactly() -> None:
    want = torch.tensor([math.nan, math.inf, -math.inf, 1.0])
    assert verify.compare(want.clone(), want).ok
    assert not verify.compare(torch.tensor([math.nan, math.inf, math.inf, 1.0]), want).ok
    assert not verify.compare(torch.tensor([0.0, math.inf, -math.inf, 1.0]), want).ok


def test_tolerance_scales_with_the_output_magnitude() -> None:
    want = torch.tensor([1e4, 0.0], dtype=torch.float32)
    assert verify.compare(torch.tensor([1e4, 5e-2]), want).ok  # atol 1e-5 * 1e4
    assert not verify.compare(torch.tensor([1e4, 5e-1]), want).ok


def test_integers_are_exact() -> None:
    want = torch.tensor([1, 2, 3])
    assert verify.compare(want.clone(), want).ok
    assert not verify.compare(torch.tensor([1, 2, 4]), want).ok


def test_bool_poison_is_visible() -> None:
    outputs = verify.GuardedOutputs([TensorSpec((3,), "bool")])
    want = torch.tensor([True, True, True])
    assert not verify.compare(outputs.views[0], want).ok


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int64", "int32", "bool"])
def test_poisoned_outputs_and_intact_canaries(dtype: str) -> None:
    outputs = verify.GuardedOutputs([TensorSpec((5, 3), dtype)])
    view = outputs.views[0]
    assert view.shape == (5, 3) and str(view.dtype) == f"torch.{dtype}"
    if view.dtype.is_floating_point:
        assert torch.isnan(view).all()
    assert outputs.check() is None
    view.fill_(0)
    assert outputs.check() is None


def test_canary_catches_a_write_past_the_end() -> None:
    outputs = verify.GuardedOutputs([TensorSpec((4,), "float32")])
    buffer = outputs.buffers[0]
    buffer[verify.GUARD_BYTES + 16] = 0  # the first byte after the 4 floats
    message = outputs.check()
    assert message is not None and "after output 0" in message and "nearest 1 bytes" in message


def test_canary_catches_a_write_before_the_start() -> None:
    outputs = verify.GuardedOutputs([TensorSpec((4,), "float32")])
    outputs.buffers[0][verify.GUARD_BYTES - 8] = 0
    message = outputs.check()
    assert message is not None and "before output 0" in message and "nearest 8 bytes" in message


def test_trials_are_seeded_and_cover_edge_values() -> None:
    specs = [TensorSpec((64, 64), "float32"), TensorSpec((64,), "float32")]
    a = verify.make_inputs(specs, verify.Trial("random", 7))
    b = verify.make_inputs(specs, verify.Trial("random", 7))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    edge = verify.make_inputs(specs, verify.Trial("edge", 1))[0]
    assert (edge == 0).any() and (edge.abs() >= 1e4).any() and torch.isfinite(edge).all()
    assert torch.signbit(edge[edge == 0]).any()  # negative zero
    nonfinite = verify.make_inputs(specs, verify.Trial("nonfinite", 1))
    assert torch.isnan(nonfinite[0]).any() and torch.isinf(nonfinite[0]).any()
    assert torch.isfinite(nonfinite[1]).all()  # only the data operand gets NaN and Inf


def test_integer_inputs_are_small_and_non_negative() -> None:
    ints = verify.make_inputs([TensorSpec((1000,), "int64")], verify.Trial("random", 3))[0]
    assert ints.min() >= 0 and ints.max() < 4
