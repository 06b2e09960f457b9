"""The verifier's rules: tolerances by dtype and reduction length, comparison in the output's
dtype, NaN never passes for a number, poison and canaries work."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kope.frontend.partition import partition
from kope.targets import verify
from kope.targets.cpu import CpuTarget, build_kernel
from kope.targets.evaluation import EvalJob, _verify
from kope.targets.measure import estimate_work
from kope.vocabulary.kernels import Kernel
from kope.vocabulary.specs import InputRef, OpCall, TaskSpec, TensorSpec


def test_close_values_pass_and_far_ones_fail() -> None:
    want = torch.randn(100, dtype=torch.float32)
    assert verify.compare(want + 1e-7, want).ok
    bad = want.clone()
    bad[17] += 0.01
    result = verify.compare(bad, want, index=2)
    assert not result.ok and "output 2" in result.message and "[17]" in result.message


def test_a_comparison_in_chunks_judges_as_one_over_the_whole_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Chunks of 4 elements: the scale comes from the largest value in any chunk, and the
    # message counts and places failures over the whole output.
    monkeypatch.setattr(verify, "COMPARE_CHUNK", 4)
    want = torch.zeros(3, 5)
    want[2, 4] = 1e4  # the last chunk sets the scale: atol 1e-5 x 1e4 = 0.1
    got = want.clone()
    got[0, 1] = 0.05  # within the scaled tolerance, in the first chunk
    assert verify.compare(got, want).ok
    got[1, 3] = 0.5
    got[2, 0] = 0.5
    result = verify.compare(got, want)
    assert not result.ok
    assert "2 of 15 elements" in result.message and "first at [1, 3]" in result.message
    assert result.max_abs_err == pytest.approx(0.5)
    ints = torch.arange(10)
    wrong = ints.clone()
    wrong[9] = -1
    result = verify.compare(wrong, ints)
    assert "1 of 10 elements differ, first at [9]" in result.message


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


@pytest.mark.parametrize(
    "dtype", ["float32", "float64", "float16", "bfloat16", "int64", "int32", "bool"]
)
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
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    edge = verify.make_inputs(specs, verify.Trial("edge", 1))[0]
    assert (edge == 0).any() and (edge.abs() >= 1e4).any() and torch.isfinite(edge).all()
    assert torch.signbit(edge[edge == 0]).any()  # negative zero
    nonfinite = verify.make_inputs(specs, verify.Trial("nonfinite", 1))
    assert torch.isnan(nonfinite[0]).any() and torch.isinf(nonfinite[0]).any()
    assert torch.isfinite(nonfinite[1]).all()  # only the data operand gets NaN and Inf


def test_integer_inputs_are_small_and_non_negative() -> None:
    ints = verify.make_inputs([TensorSpec((1000,), "int64")], verify.Trial("random", 3))[0]
    assert ints.min() >= 0 and ints.max() < 4


def test_integer_inputs_stay_in_the_domain_their_operator_defines() -> None:
    """Indices into a 3-row tensor, a 2-row embedding (BERT's token types) and 2 classes, drawn
    in [0, 4), made the eager oracle itself fail; EmbeddingBag's offsets must be sorted from 0."""
    ref = [InputRef(i) for i in range(3)]
    cases = [
        (OpCall("aten.index.Tensor", (ref[0], [ref[1], ref[2]])), [(3, 16), (3,), (3,)], [3, 16]),
        (OpCall("aten.embedding.default", (ref[0], ref[1])), [(2, 8), (3, 4)], [2]),
        (OpCall("aten.gather.default", (ref[0], -1, ref[1])), [(5, 3), (5, 7)], [3]),
        (
            OpCall("aten.nll_loss_forward.default", (ref[0], ref[1], None, 1, -100)),
            [(9, 2), (9,)],
            [2],
        ),
    ]
    for call, shapes, highs in cases:
        dtypes = ["float32"] + ["int64"] * (len(shapes) - 1)
        specs = tuple(TensorSpec(s, d) for s, d in zip(shapes, dtypes, strict=True))
        task = TaskSpec(call.op, specs, (), call)
        domains = verify.integer_domains(task)
        assert [d.high for d in domains[1:] if d is not None] == highs, call.op
        for seed in range(4):
            drawn = verify.task_inputs(task, verify.Trial("random", seed))
            for tensor, high in zip(drawn[1:], highs, strict=True):
                assert 0 <= int(tensor.min()) and int(tensor.max()) < high
        call.bind(verify.task_inputs(task, verify.Trial("random", 0)))()  # defined
    bag = OpCall("aten._embedding_bag.default", (ref[0], ref[1], ref[2], False, 0))
    specs = (TensorSpec((40, 8), "float32"), TensorSpec((6,), "int64"), TensorSpec((3,), "int64"))
    bag_task = TaskSpec(bag.op, specs, (), bag)
    for trial in verify.trials_for(0):
        offsets = verify.task_inputs(bag_task, trial)[2]
        assert offsets[0] == 0 and bool((offsets.diff() >= 0).all()) and offsets.max() <= 6


# -- comparing in the output's dtype (issue 8, defect 10) -------------------------------------


def test_float64_overflow_is_the_dtypes_infinity() -> None:
    """1e4 / 4.7e-38 is -2.1e41 in float64 and -inf in float32: -inf is the right answer."""
    want = torch.tensor([-2.126765e41, 3.0, 2e39], dtype=torch.float64)
    got = torch.tensor([-math.inf, 3.0, math.inf], dtype=torch.float32)
    result = verify.compare(got, want)
    assert result.ok, result.message
    assert result.max_abs_err < 1e-5  # the overflowed value does not inflate the scale


def test_overflow_still_needs_the_right_sign_and_size() -> None:
    want = torch.tensor([-2.126765e41, 3.0], dtype=torch.float64)
    assert not verify.compare(torch.tensor([math.inf, 3.0]), want).ok
    assert not verify.compare(torch.tensor([-1e30, 3.0]), want).ok
    assert not verify.compare(torch.tensor([math.nan, 3.0]), want).ok
    # The rounded oracle's scale no longer hides an error in the finite elements.
    assert not verify.compare(torch.tensor([-math.inf, 3.5]), want).ok


def test_statistic_over_a_nan_row_may_be_any_non_finite_value() -> None:
    """native_layer_norm's rstd of a row holding NaN: float32 said inf, float64 NaN."""
    want = torch.tensor([[math.nan], [0.5], [-math.inf]], dtype=torch.float64)
    got = torch.tensor([[math.inf], [0.5], [math.nan]], dtype=torch.float32)
    assert verify.compare(got, want, statistic=True).ok
    assert not verify.compare(got, want).ok  # an elementwise output keeps IEEE's answer


def test_statistic_never_invents_a_number() -> None:
    want = torch.tensor([math.nan, 0.5], dtype=torch.float64)
    assert not verify.compare(torch.tensor([0.0, 0.5]), want, statistic=True).ok
    nan_for_number = torch.tensor([math.nan, math.nan])
    assert not verify.compare(nan_for_number, want, statistic=True).ok
    assert not verify.compare(torch.tensor([math.inf, math.inf]), want, statistic=True).ok


def test_tolerance_grows_with_the_reduction_length() -> None:
    """A float32 sum of 2^28 terms (16384x16384) is off by ~sqrt(n)·eps of its magnitude."""
    n = 16384 * 16384
    want = torch.tensor([16384.0], dtype=torch.float64)
    got = (want * (1 + 2e-3)).float()  # 4 · eps · sqrt(n)
    assert not verify.compare(got, want).ok
    assert verify.compare(got, want, reduction=n).ok
    rtol, atol = verify.tolerance(torch.float32, n)
    assert 1e-2 < atol < rtol < 2e-2
    assert verify.tolerance(torch.float32, 1) == verify.TOLERANCES[torch.float32]
    assert verify.tolerance(torch.int64, n) == verify.EXACT


def test_a_long_reduction_still_catches_a_wrong_value() -> None:
    want = torch.randn(64, dtype=torch.float64) * 64  # row sums of 64x4096
    bad = want.float()
    bad[5] += 0.01 * float(want.abs().max())  # one row off by 1% of the scale
    result = verify.compare(bad, want, reduction=4096)
    assert not result.ok and "[5]" in result.message
    nan = want.float()
    nan[3] = math.nan
    assert not verify.compare(nan, want, reduction=4096, statistic=True).ok


def test_a_statistic_that_cancels_is_judged_against_its_terms() -> None:
    """A float32 mean of terms among which ±1e4 cancel to -0.0107 is off by ~8e-5 in any
    summation order (the reference lowering of nll_loss_forward on an edge trial): relative
    to the terms that is rounding, relative to the result it was a 'mismatch'. A result off
    by a share of the terms' own magnitude still fails."""
    want = torch.tensor(-0.0106212, dtype=torch.float64)
    got = torch.tensor(-0.01069935, dtype=torch.float32)
    inputs = [torch.tensor([1e4, -1e4, 0.5, math.inf], dtype=torch.float32)]
    assert verify.magnitude(inputs) == 1e4
    assert not verify.compare(got, want, reduction=128, statistic=True).ok
    assert verify.compare(got, want, reduction=128, statistic=True, terms=1e4).ok
    wrong = torch.tensor(-0.0106212 + 1.0, dtype=torch.float32)
    assert not verify.compare(wrong, want, reduction=128, statistic=True, terms=1e4).ok


def test_the_real_reference_sum_of_2m_floats_verifies() -> None:
    """The reference lowering's float32 sum of 1024x2048 against the float64 oracle: on this
    seed it is 2.4e-4 off relative to the result, past the elementwise float32 tolerance."""
    graph = make_fx(lambda x: x.sum(), tracing_mode="fake")(torch.randn(1024, 2048))
    (task,) = partition(graph, CpuTarget()).tasks
    work = estimate_work(task.spec, task.payload)
    assert work.reduction == 1024 * 2048
    kernel = build_kernel(task.spec, Kernel(task.payload))
    trial = verify.Trial("random", 11)
    inputs = verify.task_inputs(task.spec, trial)
    got = kernel(*inputs)[0]
    want = task.spec.eager(verify.upcast(inputs))[0]
    assert not verify.compare(got, want).ok  # the rule before the reduction length counted
    job = EvalJob(
        CpuTarget, task.spec, Kernel(task.payload), None, False, 11, 1, reduction=work.reduction
    )
    result = _verify(job, kernel, None)
    assert result.verified, result.error


@pytest.mark.parametrize("shape", [(1,), (2,), (3,), (4,), (3, 1), (2, 2, 1), (7,)])
def test_every_nonfinite_trial_holds_nan_and_both_infinities(shape: tuple[int, ...]) -> None:
    """Drawn 1 in 18 per element, a small data operand often held no NaN at all: the nonfinite
    trial then tested nothing non-finite. Each special value is now there, as room allows."""
    for seed in range(40):
        x = verify.make_inputs([TensorSpec(shape, "float32")], verify.Trial("nonfinite", seed))[0]
        assert x.shape == shape
        assert torch.isnan(x).any()
        if x.numel() >= 2:
            assert (x == math.inf).any()
        if x.numel() >= 3:
            assert (x == -math.inf).any()


_NAN_DROPPING_CLAMP = """
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %lo = arith.constant 0.0 : f32
  %hi = arith.constant 1.0 : f32
  %empty = tensor.empty() : tensor<4xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                       iterator_types = ["parallel"]}
      ins(%x : tensor<4xf32>) outs(%empty : tensor<4xf32>) {
  ^bb0(%in: f32, %out: f32):
    %a = arith.maxnumf %in, %lo : f32
    %b = arith.minnumf %a, %hi : f32
    linalg.yield %b : f32
  } -> tensor<4xf32>
  return %r : tensor<4xf32>
}
"""


def test_a_kernel_that_turns_nan_into_a_number_fails_on_a_small_tensor() -> None:
    """torch-mlir's clamp made NaN the lower bound, where eager keeps NaN. On 4 elements that
    lowering passed verification for the seed the key gave it, and
    torch.compile(backend="kope") returned 0.0 for a NaN that eager returns as NaN. (Its
    reference is now a NaN-keeping decomposition; this kernel is that lowering's clamp.)"""
    graph = make_fx(lambda x: torch.clamp(x, 0.0, 1.0), tracing_mode="fake")(torch.randn(4))
    (task,) = partition(graph, CpuTarget()).tasks
    kernel = build_kernel(task.spec, Kernel(_NAN_DROPPING_CLAMP))
    x = torch.tensor([math.nan, 0.5, 2.0, -1.0])
    assert kernel(x)[0][0].item() == 0.0  # the defect, in the kernel itself
    for seed in range(8):
        job = EvalJob(CpuTarget, task.spec, Kernel(_NAN_DROPPING_CLAMP), None, False, seed, 1)
        result = _verify(job, kernel, None)
        assert not result.verified and "nonfinite trial" in (result.error or ""), seed


def test_elements_beyond_the_dtype_are_judged_by_eagers_own_error() -> None:
    """Where eager in float32 misses the float64 oracle (terms that cancel, an intermediate
    that overflows), a kernel may miss by up to ILL_CONDITIONED times as much; elsewhere, and
    beyond that, the rule stands."""
    exact = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    own = torch.tensor([3.0, 1.0, 3.0])  # eager in float32: 2 off, exact, 2 off
    got = torch.tensor([5.0, 1.0, 3.5])
    assert not verify.compare(got, exact).ok
    assert verify.compare(got, exact, own=own).ok
    for wrong in ([20.0, 1.0, 3.5], [5.0, 1.5, 3.5], [math.nan, 1.0, 3.5]):
        assert not verify.compare(torch.tensor(wrong), exact, own=own).ok, wrong
    # An intermediate overflowed: eager's float32 result is NaN where float64's is 5e37.
    exact, own = torch.tensor([5e37], dtype=torch.float64), torch.tensor([math.nan])
    for lost in (math.inf, math.nan, 5e37):
        assert verify.compare(torch.tensor([lost]), exact, own=own).ok
    assert not verify.compare(torch.tensor([math.inf]), exact).ok
    assert not verify.compare(torch.tensor([7.0]), exact, own=own).ok
    # An overflowed quotient meets a division by zero (DeBERTa's c2p/s1 + p2c/s2 on an edge
    # trial): float32 gives NaN, float64 -inf; either special value passes, a number does not.
    exact, own = (
        torch.tensor([-math.inf, math.nan], dtype=torch.float64),
        torch.tensor([math.nan] * 2),
    )
    assert not verify.compare(torch.tensor([math.nan, math.nan]), exact).ok
    for special in ([math.nan, math.nan], [-math.inf, math.nan]):
        assert verify.compare(torch.tensor(special), exact, own=own).ok, special
    for wrong in ([math.inf, math.nan], [0.0, math.nan], [math.nan, math.inf], [-math.inf, 1.0]):
        assert not verify.compare(torch.tensor(wrong), exact, own=own).ok, wrong


def test_a_reduction_in_another_order_than_eagers_is_judged_by_its_spread() -> None:
    """A product whose terms of ±5359 (edge inputs of ±1e4) cancel to 0.87, clamped by a
    hardtanh: summed in k's order it missed float64 by 4.2e-4 where eager's order missed by
    1.4e-4 (within the tolerance), and the kernel was refused. Judged by how far float64's own
    result moves under input rounding, the orders pass on 30 edge trials; an element 0.05
    off fails wherever it lands."""

    def fused(inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        a, b, c = inputs
        return (torch.nn.functional.hardtanh(torch.bmm(a, b) + c, 0.0, 6.0),)

    specs = [TensorSpec((2, 8, 16), "float32"), TensorSpec((2, 16, 64), "float32")]
    specs.append(TensorSpec((8, 1), "float32"))
    refused = 0
    for seed in range(30):
        inputs = verify.make_inputs(specs, verify.Trial("edge", seed))
        a, b, c = inputs
        exact = fused(verify.upcast(inputs))[0]
        own = fused(inputs)[0]
        spread = verify.rounding_spread(fused, inputs, seed, reduction=16)[0]
        for order in (range(16), reversed(range(16))):
            total = torch.zeros(2, 8, 64)
            for k in order:
                total = total + a[:, :, k : k + 1] * b[:, k : k + 1, :]
            got = torch.nn.functional.hardtanh(total + c, 0.0, 6.0)
            refused += not verify.compare(got, exact, reduction=16, own=own).ok
            assert verify.compare(got, exact, reduction=16, own=own, spread=spread).ok, seed
            wrong = got.clone()
            wrong.view(-1)[seed * 31 % wrong.numel()] += 0.05
            assert not verify.compare(wrong, exact, reduction=16, own=own, spread=spread).ok
    assert refused, "no trial cancelled: the test shows nothing"


@pytest.mark.parametrize(
    "op, extra",
    [
        ("aten.div.Tensor_mode", (("rounding_mode", "floor"),)),
        ("aten.div.Tensor_mode", (("rounding_mode", "trunc"),)),
        ("aten.remainder.Tensor", ()),
        ("aten.fmod.Tensor", ()),
    ],
)
def test_integer_divisions_draw_divisors_of_both_signs_and_never_zero(
    op: str, extra: tuple[tuple[str, str], ...]
) -> None:
    """Drawn blind in [0, 4), an integer divisor held zeros: eager's oracle raised on every
    trial and the operator could never get a kernel. Dividends of both signs tell floor from
    trunc."""
    ref = [InputRef(i) for i in range(2)]
    call = OpCall(op, (ref[0], ref[1]), extra)
    specs = (TensorSpec((8, 16), "int64"), TensorSpec((8, 16), "int64"))
    task = TaskSpec(op, specs, (), call)
    for trial in verify.trials_for(0):
        dividend, divisor = verify.task_inputs(task, trial)
        assert bool((divisor != 0).all()) and bool((divisor < 0).any()), trial
        if trial.kind == "random":
            assert bool((dividend < 0).any()), trial
        call.bind([dividend, divisor])()  # defined


def test_integer_data_is_drawn_across_its_dtype() -> None:
    """An image's bytes are data, not indices: drawn in [0, 4), `(img > 128).sum()` of a uint8
    image verified a lowering that counted wrongly (no element passed 128 in any trial)."""
    for dtype in (torch.uint8, torch.int8, torch.int16):
        info = torch.iinfo(dtype)
        for trial in verify.trials_for(0):
            (drawn,) = verify.make_inputs([TensorSpec((64, 64), str(dtype).split(".")[1])], trial)
            low, high = int(drawn.min()), int(drawn.max())
            if trial.kind == "random":
                assert high - low > (info.max - info.min) // 2, (dtype, trial)
            else:  # the extremes, and both sides of the middle (128 for a byte)
                assert (low, high) == (info.min, info.max), (dtype, trial)
    # Indices keep their small non-negative draws.
    (index,) = verify.make_inputs([TensorSpec((64,), "int64")], verify.trials_for(0)[0])
    assert 0 <= int(index.min()) and int(index.max()) < 4


def test_probabilities_are_drawn_in_the_unit_interval() -> None:
    """Binary cross-entropy raises on any input or target outside [0, 1]."""
    ref = [InputRef(i) for i in range(2)]
    call = OpCall("aten.binary_cross_entropy.default", (ref[0], ref[1], None, 1))
    specs = (TensorSpec((3, 50), "float32"), TensorSpec((3, 50), "float32"))
    task = TaskSpec(call.op, specs, (), call)
    for trial in verify.trials_for(0):
        drawn = verify.task_inputs(task, trial)
        assert all(0 <= float(t.min()) and float(t.max()) <= 1 for t in drawn), trial
        call.bind(drawn)()  # defined


def test_integers_computed_through_a_narrower_float_are_refused_unrun() -> None:
    """torch-mlir lowers an int64 negation through f32 and an int64 floor division through
    f64: exact on the small integers verification draws, wrong from 2^24 and 2^53 on."""
    from kope.targets.verify import lossy_integers

    neg = """
      ^bb0(%in: i64, %out: i64):
        %3 = arith.sitofp %in : i64 to f32
        %4 = arith.negf %3 : f32
        %5 = arith.fptosi %4 : f32 to i64
        linalg.yield %5 : i64"""
    assert "i64 input values through f32" in (lossy_integers(neg) or "")
    floor = neg.replace("i64 to f32", "i64 to f64").replace("f32 to i64", "f64 to i64")
    assert "above 2^53" in (lossy_integers(floor) or "")
    assert lossy_integers(neg.replace("i64", "i16")) is None  # f32 holds every int16
    # A loop index made a coordinate, and an input converted to a float result, are exact or
    # what eager computes: neither is refused.
    index = neg.replace("arith.sitofp %in", "arith.sitofp %idx")
    assert lossy_integers(index) is None
    to_float = neg.replace("%5 = arith.fptosi %4 : f32 to i64", "%5 = arith.addf %4, %4 : f32")
    assert lossy_integers(to_float) is None


def test_berts_mask_pattern_is_judged_beyond_the_dtype_on_random_trials_too(
    tmp_path: Path,
) -> None:
    """`(1 - mask) * finfo.min` added to scores, then softmax: a random trial's mask of either
    sign overflows float32, where eager's own float32 result is NaN and float64's a number.
    The reference lowering, which computes what eager computes, was refused on every model
    that builds its attention mask this way (BERT, T5)."""
    import kope

    def masked_softmax(s: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return (s + (1.0 - m) * torch.finfo(torch.float32).min).softmax(-1)

    torch.manual_seed(0)
    s, m = torch.randn(2, 4, 16, 16), (torch.rand(2, 1, 1, 16) > 0.3).float()
    options = {"kernels": "reference", "store": str(tmp_path)}
    torch._dynamo.reset()
    kope.reset_report()
    got = torch.compile(masked_softmax, backend="kope", options=options)(s, m)
    torch.testing.assert_close(got, masked_softmax(s, m), equal_nan=True)
    (task,) = kope.report().tasks
    assert task.kernel == "reference", task


def test_timing_inputs_are_laid_out_as_the_model_passes_them() -> None:
    """A Task's inputs arrive in the model as views (one half of a chunked projection; a
    weight transposed): they are timed so, with the values a contiguous draw has, the weight a
    view of a parameter (what a kernel derives from it is kept, as in the model). Strides
    that broadcast leave the input as drawn; so does a spec that records none."""
    call = OpCall("aten.addmm.default", (InputRef(2), InputRef(0), InputRef(1)))
    shapes = [TensorSpec((8, 32), "float32"), TensorSpec((32, 16), "float32")]
    shapes.append(TensorSpec((16,), "float32"))
    plain = TaskSpec("addmm", tuple(shapes), (TensorSpec((8, 16), "float32"),), call)
    strided = TaskSpec(plain.label, plain.inputs, plain.outputs, call, ((64, 1), (1, 32), (0,)))
    want = verify.timing_inputs(plain, 7, 2)
    got = verify.timing_inputs(strided, 7, 2)
    for before, after in zip(want, got, strict=True):
        assert [t.stride() for t in before] == [(32, 1), (16, 1), (1,)]
        assert [t.stride() for t in after] == [(64, 1), (1, 32), (1,)]
        assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
        assert isinstance(after[1]._base, torch.nn.Parameter)
        torch.testing.assert_close(call(after)[0], call(before)[0])
    assert got[0][1] is got[1][1]  # the weight is one tensor across the sets, as in a model


def test_a_fused_groups_eager_program_runs_as_written_out_code() -> None:
    """The eager baseline of a fused group, bound to its inputs, is straight code calling each
    overload's C++ entry; it returns what interpreting the steps returns, through nested
    arguments, a step's several results and keyword arguments, a Python keyword among them."""
    from kope.vocabulary.specs import Program, StepRef, _run, _substitute

    i = [InputRef(0), InputRef(1)]
    program = Program(
        (
            OpCall("aten.mul.Tensor", (i[0], 2.0)),
            OpCall("aten.cat.default", ([StepRef(0), i[1]],), (("dim", 0),)),
            OpCall("aten.split.Tensor", (StepRef(1), 2)),
            OpCall("aten.add.Tensor", (StepRef(2, 0), StepRef(2, 1)), (("alpha", 3),)),
            OpCall("aten.clamp.default", (StepRef(3),), (("min", -1.0), ("max", 1.0))),
        ),
        (StepRef(4), StepRef(2, 1)),
    )
    inputs = [torch.randn(2, 3, generator=torch.Generator().manual_seed(k)) for k in range(2)]
    steps = [(step.resolve(), step) for step in program.steps]
    values = _run(steps, inputs)
    want = [_substitute(ref, inputs, values) for ref in program.outputs]
    got = program.bind(inputs)()
    assert len(got) == 2 and all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    fill = Program((OpCall("aten.random_.from", (i[0],), (("from", 3), ("to", 4))),), (StepRef(0),))
    (filled,) = fill.bind([torch.zeros(4)])()
    assert torch.equal(filled, torch.full((4,), 3.0))  # `from=` passed where Python cannot
