"""Every schedule the heuristic agent proposes verifies, on the shapes and values that broke
schedule families before: convolutions of every window shape, stride, dilation and grouping
(1x1 convs came out with one output channel per tile; depthwise ones had no schedule), integer
powers (whose vectorized form did not lower), and NaN/Inf-sensitive ops with boolean inputs
or outputs (whose vectors of i1 were stored bit-packed into byte-per-element buffers), and
reductions whose whole tensor was vectorized at once (minutes to build)."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.fx.experimental.proxy_tensor import make_fx

from kope.agents.base import Feedback, ProposalRequest
from kope.agents.heuristic import HeuristicAgent
from kope.core.task import Task
from kope.frontend.partition import partition
from kope.passes.analysis import analyze, prepare_payload
from kope.passes.refine_reshapes import common_refinement
from kope.spaces.cpu import prepared_space, schedule_space
from kope.spaces.kernels import kernel_source
from kope.spaces.schedules import COLLAPSE
from kope.targets.cpu import CpuTarget
from kope.tools.precompile import trace_tasks
from kope.tuner.optimize import task_view
from kope.vocabulary.kernels import Kernel

ATTEMPTS = 3  # proposals checked per operator: the agent's first choices, in its own order


def _conv(
    channels: int, size: tuple[int, int], out: int, kernel: tuple[int, int], **options: Any
) -> tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]:
    groups = options.get("groups", 1)
    x = torch.randn(1, channels, *size)
    w = torch.randn(out, channels // groups, *kernel)

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv2d(x, w, None, **options)

    return fn, (x, w)


CONVOLUTIONS = {
    "1x1": _conv(16, (8, 8), 32, (1, 1)),
    "1x1_wide": _conv(8, (4, 16), 16, (1, 1)),
    "1x1_stride2": _conv(8, (16, 32), 16, (1, 1), stride=2),
    "1x3": _conv(8, (6, 16), 16, (1, 3), padding=(0, 1)),
    "5x9": _conv(8, (8, 16), 16, (5, 9), padding=(2, 4)),
    "3x3_stride2": _conv(8, (9, 33), 16, (3, 3), stride=2, padding=1),
    "3x3_dilation2": _conv(8, (8, 16), 16, (3, 3), dilation=2, padding=2),
    "3x3_groups2": _conv(16, (6, 16), 16, (3, 3), groups=2, padding=1),
    "depthwise": _conv(16, (6, 16), 16, (3, 3), groups=16, padding=1),
    "depthwise_partial": _conv(16, (6, 12), 16, (3, 3), groups=16, padding=1),
    "depthwise_5x3_dilation2": _conv(8, (6, 16), 8, (5, 3), groups=8, dilation=2, padding=(4, 2)),
    "depthwise_stride2": _conv(8, (7, 33), 8, (3, 3), groups=8, stride=2, padding=1),
    # 1-D convolutions (no schedule family took them), one with 33 output channels, which
    # neither channel tile of 16 nor of 8 divides.
    "conv1d_33_channels": (
        lambda x, w: torch.nn.functional.conv1d(x, w),
        (torch.randn(2, 17, 45), torch.randn(33, 17, 3)),
    ),
    "conv1d_stride2": (
        lambda x, w: torch.nn.functional.conv1d(x, w, stride=2, padding=2),
        (torch.randn(2, 16, 64), torch.randn(32, 16, 5)),
    ),
    # Its reference inserts the input into zeros with strides 2 (a strided insert_slice), which
    # MLIR's whole-function vectorization wrote as if contiguous: every schedule mismatched.
    "transposed_stride2": (
        lambda x, w: torch.nn.functional.conv_transpose2d(x, w, stride=2, padding=1),
        (torch.randn(1, 16, 9, 16), torch.randn(16, 8, 4, 4)),
    ),
}


def _x() -> torch.Tensor:
    return torch.randn(4, 8, 32)


ELEMENTWISE = {
    "pow2": (lambda x: x.pow(2), (_x(),)),
    "pow3": (lambda x: x.pow(3), (_x(),)),
    "pow_minus2": (lambda x: x.pow(-2), (_x(),)),
    "isnan": (torch.isnan, (_x(),)),
    "isinf": (torch.isinf, (_x(),)),
    "gt": (lambda x: x > 0, (_x(),)),
    "where_mask": (torch.where, (_x() > 0, _x(), _x())),
    "where_fused": (lambda x, y: torch.where(x > 0, x, y), (_x(), _x())),
    "logical_not": (torch.logical_not, (_x() > 0,)),
    "nan_to_num": (torch.nan_to_num, (_x(),)),
    "maximum": (torch.maximum, (_x(), _x())),
    "minimum": (torch.minimum, (_x(), _x())),
    # references from NaN-keeping decompositions (torch-mlir's clamp drops a NaN)
    "clamp": (lambda x: x.clamp(-0.5, 0.5), (_x(),)),
    "relu6_of_sum": (lambda x, y: torch.nn.functional.relu6(x + y), (_x(), _x())),
}


def _rows_of(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _group_norm_by_hand(
    x: torch.Tensor, groups: int, w: torch.Tensor, b: torch.Tensor
) -> torch.Tensor:
    n, c = x.shape[:2]
    xg = x.reshape(n, groups, c // groups, -1)
    d = xg - xg.mean((2, 3), keepdim=True)
    var = (d * d).mean((2, 3), keepdim=True)
    y = d * torch.rsqrt(var + 1e-5) * w.reshape(groups, c // groups, 1)
    return (y + b.reshape(groups, c // groups, 1)).reshape(x.shape)


def _group_norm_inputs() -> tuple[torch.Tensor, ...]:
    return (_rows_of(2, 20, 7, 9), _rows_of(20), _rows_of(20))


#: Reductions whose rows schedules vectorized a whole tensor at once and took minutes to build
#: (a loss reduced to a scalar, a variance and a norm whose root divides per row, a middle dim).
REDUCTIONS = {
    "mse_loss": (
        lambda x, y: torch.nn.functional.mse_loss(x, y),
        (_rows_of(256, 512), _rows_of(256, 512)),
    ),
    "var_last": (lambda x: x.var(-1), (_rows_of(128, 256),)),
    "norm_last": (lambda x: torch.linalg.vector_norm(x, dim=-1), (_rows_of(256, 512),)),
    "mean_middle": (lambda x: x.mean(1), (_rows_of(8, 256, 128),)),
    "sum_long_rows": (lambda x: x.sum(-1), (_rows_of(4, 4096),)),
    # Ops a row loop cannot fuse: the scale before a 4-D softmax, read through a reshape
    # (fusing it failed every schedule), and a second output, the mean of var_mean (fusing
    # a returned value crashed LLVM in the build).
    "scaled_softmax_4d": (lambda x: torch.softmax(x * 0.25, -1), (_rows_of(1, 4, 37, 37),)),
    "var_mean": (lambda x: torch.var_mean(x, -1), (_rows_of(64, 256),)),
    "group_norm": (
        lambda x, w, b: torch.nn.functional.group_norm(x, 6, w, b),
        (_rows_of(4, 36, 15, 15), _rows_of(36), _rows_of(36)),
    ),
    # Group norm as user code writes it, one fused Task: reshape propagation gave its last op
    # a unit dim, so it shared no loop with the deviation it reads, and the variance's loop
    # fused that deviation although the last op reads it after the loop (LLVM aborted).
    "group_norm_by_hand": (lambda x, w, b: _group_norm_by_hand(x, 4, w, b), _group_norm_inputs()),
    # nll_loss_forward, one Task: a scalar root fed by other scalars (the agent raised an
    # IndexError on them), a gather and a count of the targets that are not ignored.
    "nll_loss": (
        lambda x, t: torch.ops.aten.nll_loss_forward(x, t, None, 1, -100)[0],
        (_rows_of(37, 101).log_softmax(-1), torch.randint(0, 101, (37,))),
    ),
}

#: Activations built on log, log1p and expm1, whose first schedules compute them as polynomials
#: (libm computed them one lane at a time: ELU ran 0.22x eager, softplus 0.41x).
LOGARITHMIC = {
    "log": (torch.log, (_x().abs(),)),
    "elu": (lambda x: torch.nn.functional.elu(x), (_x(),)),
    "softplus": (lambda x: torch.nn.functional.softplus(x), (_x() * 30,)),
    "mish": (lambda x: torch.nn.functional.mish(x), (_x() * 30,)),
    "logsigmoid": (lambda x: torch.nn.functional.logsigmoid(x), (_x() * 30,)),
}

#: Operators the agent does not schedule (no family covers them): it must say so, not fail.
UNSCHEDULED = {"3x3_groups2"}


@pytest.fixture(scope="module")
def target() -> CpuTarget:
    cpu = CpuTarget(workers=1, timeout_s=120)
    yield cpu
    cpu.close()


def _proposals_verify(name: str, fn: Callable[..., Any], args: tuple, target: CpuTarget) -> None:
    tasks = partition(make_fx(fn, tracing_mode="fake")(*args), target).tasks
    assert len(tasks) == 1, [t.label for t in tasks]
    _task_proposals_verify(name, tasks[0], target)


def _task_proposals_verify(name: str, task: Task, target: CpuTarget) -> None:
    view = task_view(task, target)
    agent = HeuristicAgent(seed=0)
    history: list[Feedback] = []
    for attempt in range(ATTEMPTS):
        proposal = agent.propose(ProposalRequest(view, history=history))
        if proposal is None:
            assert attempt > 0 or name in UNSCHEDULED, f"{task.label}: no schedule proposed"
            return
        assert name not in UNSCHEDULED, f"{task.label}: {proposal.decision}"
        result = target.evaluate(
            task.spec, Kernel(proposal.source), oracle=Kernel(task.payload), measure=False
        )
        assert result.verdict == "verified", f"{task.label}, {proposal.config}: {result.error}"
        history.append(
            Feedback(f"a{attempt}", proposal.decision, proposal.config, result.verdict,
                     result.error, None, None, None, None)
        )  # fmt: skip


@pytest.mark.parametrize("name", sorted(CONVOLUTIONS))
def test_convolution_schedules_verify(name: str, target: CpuTarget) -> None:
    fn, args = CONVOLUTIONS[name]
    _proposals_verify(name, fn, args, target)


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_nan_sensitive_and_power_schedules_verify(name: str, target: CpuTarget) -> None:
    fn, args = ELEMENTWISE[name]
    _proposals_verify(name, fn, args, target)


@pytest.mark.parametrize("name", sorted(LOGARITHMIC))
def test_logarithmic_activations_take_polynomials_that_verify(name: str, target: CpuTarget) -> None:
    fn, args = LOGARITHMIC[name]
    (task,) = partition(make_fx(fn, tracing_mode="fake")(*args), target).tasks
    proposal = HeuristicAgent(seed=0).propose(ProposalRequest(task_view(task, target)))
    assert proposal is not None and proposal.config.get("approximate_math"), proposal
    _task_proposals_verify(name, task, target)


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction_schedules_verify(name: str, target: CpuTarget) -> None:
    fn, args = REDUCTIONS[name]
    _proposals_verify(name, fn, args, target)


@pytest.mark.parametrize("name", ["var_last", "var_mean", "group_norm"])
def test_a_widened_variance_is_first_computed_in_f32(name: str, target: CpuTarget) -> None:
    """torch-mlir computes these variances in f64; the agent's first kernel computes them in
    f32, and it verifies."""
    fn, args = REDUCTIONS[name]
    (task,) = partition(make_fx(fn, tracing_mode="fake")(*args), target).tasks
    assert "f64" in task.payload
    proposal = HeuristicAgent(seed=0).propose(ProposalRequest(task_view(task, target)))
    assert proposal is not None and proposal.config.get("narrow_f64"), proposal
    assert "f64" not in proposal.source.split("transform.named_sequence")[0]
    result = target.evaluate(
        task.spec, Kernel(proposal.source), oracle=Kernel(task.payload), measure=False
    )
    assert result.verdict == "verified", result.error


def test_common_refinement_of_two_regroupings() -> None:
    """The shape both sides of a collapse-then-expand regroup, with the dim each side's
    dims fall in; none where dims straddle without dividing or a unit dim meets a larger."""
    assert common_refinement([4, 8, 4096], [4, 32, 32, 32]) == (
        [4, 8, 4, 32, 32],
        [0, 1, 2, 2, 2],
        [0, 1, 1, 2, 3],
    )
    assert common_refinement([1, 6, 1350], [1, 36, 15, 15]) == (
        [1, 6, 6, 15, 15],
        [0, 1, 2, 2, 2],
        [0, 1, 1, 2, 3],
    )
    assert common_refinement([2, 3], [3, 2]) is None
    assert common_refinement([6, 1], [1, 6]) is None


def _group_norm_silu(groups: int) -> Callable[..., torch.Tensor]:
    return lambda x, w, b: torch.nn.functional.silu(torch.nn.functional.group_norm(x, groups, w, b))


@pytest.mark.parametrize(
    "shape, groups, first",
    [((2, 16, 8, 16), 4, True), ((2, 12, 3, 5), 3, False)],
    ids=["rows_of_whole_vectors", "rows_of_5"],
)
def test_a_regrouped_group_norm_shares_one_row_loop_and_verifies(
    shape: tuple[int, ...], groups: int, first: bool, target: CpuTarget
) -> None:
    """Group norm + SiLU with its reshapes refined: every op over (batch, groups) first, so
    one row loop fuses the statistics and the epilogue. Ranked first where the refined rows
    are whole vectors (16 floats), last where they are not (5, and 15 collapsed); either
    verifies."""
    args = (_rows_of(*shape), _rows_of(shape[1]), _rows_of(shape[1]))
    (task,) = partition(make_fx(_group_norm_silu(groups), tracing_mode="fake")(*args), target).tasks
    info = analyze(prepare_payload(task.payload, refine_reshapes=True))
    assert all(op.ranges[:2] == [shape[0], groups] for op in info.ops if not op.is_fill), info
    view = task_view(task, target)
    agent = HeuristicAgent(seed=0)
    proposal = agent.propose(ProposalRequest(view))
    assert proposal is not None and bool(proposal.config.get("regroup")) == first, proposal
    assert ("reshapes regrouped" in proposal.decision) == first
    if not first:  # the regrouped kernel, built all the same
        config = {**proposal.config, "regroup": True}
        payload = prepare_payload(
            task.payload,
            approximate_math=bool(config.get("approximate_math")),
            narrow_f64=bool(config.get("narrow_f64")),
            refine_reshapes=True,
        )
        proposal = dataclasses.replace(
            proposal, source=kernel_source(payload, analyze(payload), config)
        )
    result = target.evaluate(
        task.spec, Kernel(proposal.source), oracle=Kernel(task.payload), measure=False
    )
    assert result.verdict == "verified", result.error


def _first_proposal(
    fn: Callable[..., torch.Tensor], args: tuple[torch.Tensor, ...], target: CpuTarget
) -> tuple[Task, Any]:
    (task,) = partition(make_fx(fn, tracing_mode="fake")(*args), target).tasks
    proposal = HeuristicAgent(seed=0).propose(ProposalRequest(task_view(task, target)))
    assert proposal is not None
    return task, proposal


@pytest.mark.parametrize(
    "name, fn, shapes, collapsed",
    [
        ("silu_rows_of_7", lambda x: torch.nn.functional.silu(x), [(2, 16, 7, 7)], [1568]),
        (
            "scale_rows_of_7",
            lambda x, s: torch.relu(x * s.view(1, -1, 1, 1)),
            [(2, 16, 7, 7), (16,)],
            [2, 16, 49],
        ),
        ("mean_rows_of_7", lambda x: x.mean((2, 3)), [(2, 16, 7, 7)], [2, 16, 49]),
        (
            "group_norm_rows_of_7",
            _group_norm_silu(4),
            [(2, 8, 7, 7), (8,), (8,)],
            [2, 4, 2, 49],
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_short_rows_are_collapsed_first_and_verify(
    name: str,
    fn: Callable[..., torch.Tensor],
    shapes: list[tuple[int, ...]],
    collapsed: list[int],
    target: CpuTarget,
) -> None:
    """Over NCHW maps 7 floats wide, the agent's first kernel runs on the payload with its
    innermost loops collapsed (rows of 49 floats or more: whole vectors on AVX2 and AVX-512),
    a group norm's also regrouped, and verifies."""
    task, proposal = _first_proposal(fn, tuple(_rows_of(*shape) for shape in shapes), target)
    assert proposal.config.get("collapse_dims"), proposal
    assert "inner loops collapsed" in proposal.decision
    assert bool(proposal.config.get("regroup")) == name.startswith("group_norm"), proposal
    info = analyze(
        prepare_payload(
            task.payload,
            refine_reshapes=bool(proposal.config.get("regroup")),
            collapse_dims=True,
        )
    )
    assert collapsed in [op.ranges for op in info.ops], info.ops
    result = target.evaluate(
        task.spec, Kernel(proposal.source), oracle=Kernel(task.payload), measure=False
    )
    assert result.verdict == "verified", result.error


@pytest.mark.parametrize("vector_bits", [256, 512])
def test_whole_rows_are_not_collapsed(vector_bits: int, target: CpuTarget) -> None:
    """Rows of whole vectors (256 floats, 16) offer no collapsed points, where they would
    only spend the search's attempts; rows of 7 do, ranked above the plain points."""
    for shape, offered in (((2, 4, 256), False), ((2, 4, 8, 16), False), ((2, 4, 7, 7), True)):
        (task,) = partition(
            make_fx(lambda x: torch.nn.functional.silu(x), tracing_mode="fake")(_rows_of(*shape)),
            target,
        ).tasks
        plain = analyze(prepare_payload(task.payload))
        collapsed = analyze(prepare_payload(task.payload, collapse_dims=True))
        capabilities = {"vector_bits": vector_bits, "threads": 1}
        points, _ = prepared_space(collapsed, plain, capabilities, {COLLAPSE: True})
        assert bool(points) == offered
        if offered:
            best_plain = max(score for _, score in schedule_space(plain, capabilities)[0])
            assert max(score for _, score in points) > best_plain
            assert all(config[COLLAPSE] for config, _ in points)


@pytest.mark.parametrize("channels, size", [(5, (9, 11)), (32, (7, 12)), (16, (28, 28))])
def test_layout_copy_schedules_verify(
    channels: int, size: tuple[int, int], target: CpuTarget
) -> None:
    """The transposes around a stack of convolutions computed channels-last (NCHW to NHWC and
    back), at sizes whose tiles divide and sizes whose do not."""
    layers = [nn.Conv2d(channels, channels, 3, padding=1) for _ in range(4)]
    model = nn.Sequential(*[m for conv in layers for m in (conv, nn.ReLU())]).eval()
    tasks = trace_tasks(model, (torch.randn(2, channels, *size),), CpuTarget())
    copies = [t for t in tasks if "permute" in t.op]
    assert len(copies) == 2, [t.label for t in tasks]
    for task in copies:
        first = HeuristicAgent(seed=0).propose(ProposalRequest(task_view(task, target)))
        assert first is not None and first.config["family"] == "transpose", first
        _task_proposals_verify(task.label, task, target)


#: Rows that neither the row step (4, 8) nor the vector tile (8 to 32) divides: a tile of
#: dynamic size is not vectorized at all, so such schedules ran as scalar loops (a 129x257
#: GELU at 4 rows a step took 7x the time of 1 row a step) until the loops were peeled.
RAGGED = {
    "gelu_129x257": (lambda x: torch.nn.functional.gelu(x), (_rows_of(129, 257),)),
    "softmax_37x1001": (lambda x: torch.softmax(x, -1), (_rows_of(37, 1001),)),
    "log_softmax_27x100": (lambda x: torch.log_softmax(x, -1), (_rows_of(27, 100),)),
    "layer_norm_64x100": (
        lambda x: torch.nn.functional.layer_norm(x, (100,)),
        (_rows_of(64, 100),),
    ),
    "mse_loss_ragged": (
        lambda x, y: torch.nn.functional.mse_loss(x, y),
        (_rows_of(37, 100), _rows_of(37, 100)),
    ),
}


def _scheduled(fn: Callable[..., Any], args: tuple, target: CpuTarget, config: dict) -> str:
    """The payload after `config`'s schedule (the transform script applied, canonicalized)."""
    from torch_mlir import ir
    from torch_mlir.passmanager import PassManager

    from kope.passes.analysis import analyze, prepare_payload
    from kope.spaces.kernels import kernel_source

    (task,) = partition(make_fx(fn, tracing_mode="fake")(*args), target).tasks
    payload = prepare_payload(task_view(task, target).payload)
    context = ir.Context()
    module = ir.Module.parse(kernel_source(payload, analyze(payload), config), context)
    PassManager.parse("builtin.module(transform-interpreter,canonicalize)", context).run(
        module.operation
    )
    return str(module).split("transform.named_sequence")[0]


def test_a_softmax_computes_its_row_maximum_once(target: CpuTarget) -> None:
    """Fusion clones a producer into the row loop once per use: the max and x - max, read by
    both the sum and the output, were computed twice a row until the clones were merged."""
    config = {"family": "rows", "threads": 1, "rows": 1, "vector": 32}
    ir_text = _scheduled(lambda x: torch.softmax(x, -1), (_rows_of(37, 1001),), target, config)
    assert ir_text.count("vector.reduction <maximumf>") == 1, ir_text


def test_an_op_also_read_outside_the_row_loop_is_not_vectorized_whole(target: CpuTarget) -> None:
    """Instance norm's statistics (batch norm's over one instance) are returned, so the row
    loop cannot fuse the variance that reads the centred values; fused into the loop anyway,
    those values were also computed whole outside it, as one vector of the whole tensor, and
    the build ran past its timeout. Its schedules now build and verify."""

    def instance_norm(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.ops.aten._native_batch_norm_legit.no_stats(x, None, None, True, 0.1, 1e-5)

    x = _rows_of(1, 32, 33, 21)
    config = {"family": "rows", "threads": 1, "rows": 1, "vector": 32}
    ir_text = _scheduled(instance_norm, (x,), target, config)
    vectors = re.findall(r"vector<([0-9x]+)x[fi][0-9]+>", ir_text)
    assert vectors and max(math.prod(map(int, v.split("x"))) for v in vectors) <= 1024, vectors
    _proposals_verify("instance_norm", instance_norm, (x,), target)


@pytest.mark.parametrize("name", sorted(RAGGED))
def test_ragged_rows_are_vectorized(name: str, target: CpuTarget) -> None:
    """Every rows schedule the agent offers for an operator whose rows no tile divides
    leaves no linalg op unvectorized (row steps that would be partial are not offered; a
    partial vector tile is peeled), and schedules of each kind verify."""
    from torch_mlir import ir
    from torch_mlir.passmanager import PassManager

    from kope.agents.heuristic import candidate_space
    from kope.passes.analysis import analyze, prepare_payload
    from kope.spaces.kernels import kernel_source

    fn, args = RAGGED[name]
    (task,) = partition(make_fx(fn, tracing_mode="fake")(*args), target).tasks
    view = task_view(task, target)
    configs = [
        c for c, _ in candidate_space(analyze(prepare_payload(view.payload)), view.capabilities)
    ]
    configs = [c for c in configs if c["family"] == "rows" and not c.get("approximate_math")]
    for config in configs:
        payload = prepare_payload(view.payload)
        source = kernel_source(payload, analyze(payload), config)
        context = ir.Context()
        module = ir.Module.parse(source, context)
        PassManager.parse("builtin.module(transform-interpreter,canonicalize)", context).run(
            module.operation
        )
        scheduled = str(module).split("transform.named_sequence")[0]
        assert "linalg.generic" not in scheduled, f"{config}: an op stayed scalar loops"
    for config in configs[:2] + configs[-1:]:
        payload = prepare_payload(view.payload)
        source = kernel_source(payload, analyze(payload), config)
        result = target.evaluate(
            task.spec, Kernel(source), oracle=Kernel(task.payload), measure=False
        )
        assert result.verdict == "verified", f"{config}: {result.error}"


def test_a_product_with_a_per_row_epilogue_operand_takes_contraction_schedules(
    target: CpuTarget,
) -> None:
    """A 1x1 convolution as a product: W @ X + bias[F, 1], then ReLU. Elementwise fusion
    would expand the matmul into a generic around the bias's unit dim; prepared without it,
    the payload stays a matmul with its epilogue, and the contraction schedules verify."""

    def product(w: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.mm(w, x) + b)

    args = (torch.randn(13, 7), torch.randn(7, 37), torch.randn(13, 1))
    tasks = partition(make_fx(product, tracing_mode="fake")(*args), target).tasks
    assert len(tasks) == 1, [t.label for t in tasks]
    info = analyze(prepare_payload(tasks[0].payload))
    assert info.kind == "contraction" and info.plain_matmul is not None
    assert info.plain_matmul.epilogue == 2
    _task_proposals_verify("per-row epilogue", tasks[0], target)


#: Products whose rows, columns or both no register tile divides (k does), plain and batched.
RAGGED_PRODUCTS = {
    "rows": (torch.mm, (_rows_of(37, 16), _rows_of(16, 64))),
    "columns": (torch.mm, (_rows_of(32, 16), _rows_of(16, 71))),
    "both": (torch.mm, (_rows_of(45, 8), _rows_of(8, 70))),
    "batched": (torch.bmm, (_rows_of(3, 21, 8), _rows_of(3, 8, 37))),
}


@pytest.mark.parametrize("name", sorted(RAGGED_PRODUCTS))
@pytest.mark.parametrize("threads", [1, 2])
def test_ragged_products_are_split_not_padded(name: str, threads: int, target: CpuTarget) -> None:
    """The rows and columns a product's register tile leaves over are split off as products
    of their own, each tiled statically, instead of padding A, B and C with zeros (copies of
    all three, and the zeros computed: a 129x64x96 product took 1.25x its 128-row version's
    time on one thread); every part is vectorized, and the kernel verifies."""
    fn, args = RAGGED_PRODUCTS[name]
    (task,) = partition(make_fx(fn, tracing_mode="fake")(*args), target).tasks
    lanes = 8
    config = {
        "family": "contraction",
        "threads": threads,
        "cache": [64, 128, 256],
        "register": [4, 2 * lanes, 1],
    }
    scheduled = _scheduled(fn, args, target, config)
    assert "tensor.pad" not in scheduled, "a ragged product was padded"
    assert "linalg.matmul" not in scheduled and "linalg.batch_matmul" not in scheduled, (
        "a part of the product stayed scalar loops"
    )
    from kope.spaces.kernels import kernel_source

    payload = prepare_payload(task.payload)
    source = kernel_source(payload, analyze(payload), config)
    result = target.evaluate(task.spec, Kernel(source), oracle=Kernel(task.payload), measure=False)
    assert result.verdict == "verified", f"{config}: {result.error}"
