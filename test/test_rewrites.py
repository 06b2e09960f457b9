"""Graph rewrites (`kope.frontend.rewrites`): batch norm folded into convolutions, attention as
one kernel.

Each model is written as user code writes it, at odd shapes; the rewritten graph must match
eager, say what it rewrote in `kope.report()`, and give every road the same Tasks. Weights
written after compiling must be used; a rewrite that disagrees with the original is not made.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import kope
from kope.frontend import rewrites
from kope.frontend.model_module import model_module
from kope.frontend.rewrites import (
    CHANNELS_LAST,
    FOLDED_BATCH_NORM,
    FUSED_ATTENTION,
    FUSED_CONVOLUTION,
    POINTWISE_CONVOLUTION,
    FoldedBatchNorm,
)
from kope.targets.cpu import CpuTarget
from kope.tools.precompile import trace_tasks


class ConvBn(nn.Module):
    def __init__(self, conv: nn.Conv2d, affine: bool = True, relu: bool = True):
        super().__init__()
        self.conv = conv
        self.bn = nn.BatchNorm2d(conv.out_channels, affine=affine)
        self.relu = relu
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            if affine:
                self.bn.weight.uniform_(0.5, 1.5)
                self.bn.bias.uniform_(-1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(x))
        return torch.relu(y) if self.relu else y


class ConvUsedTwice(ConvBn):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.bn(y) + y


class Attention(nn.Module):
    """softmax(q kᵀ · scale) v, the scale written as `scale` says."""

    def __init__(self, scale: str):
        super().__init__()
        self.scale = scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = q @ k.transpose(-2, -1)
        if self.scale == "div":
            scores = scores / math.sqrt(q.shape[-1])
        elif self.scale == "mul":
            scores = scores * q.shape[-1] ** -0.5
        return torch.softmax(scores, dim=-1) @ v


class MaskedAttention(nn.Module):
    """Attention by hand that fills the scores a boolean mask marks with -inf: a causal mask
    built in `forward` (`triu(1)`, as GPT-style code writes it; a constant once folded), a
    band built there, or a causal mask in a buffer (an input of the graph)."""

    def __init__(self, length: int, mask: str):
        super().__init__()
        self.kind = mask
        self.register_buffer("causal", torch.ones(length, length, dtype=torch.bool).triu(1))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))
        ones = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool)
        if self.kind == "causal":
            mask = ones.triu(1)
        elif self.kind == "band":
            mask = ones.triu(3) | ones.tril(-3)
        else:
            mask = self.causal
        scores = scores.masked_fill(mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v


def _compiled(model: nn.Module, tmp_path: Path, kernels: str = "eager") -> nn.Module:
    torch._dynamo.reset()
    kope.reset_report()
    options = {"store": str(tmp_path / "store"), "kernels": kernels}
    return torch.compile(model.eval(), backend="kope", options=options)  # type: ignore[return-value]


def _rewrites() -> list[str]:
    return [r for g in kope.report().graphs for r in g.rewrites]


CONVS = {
    "bias_free": lambda: ConvBn(nn.Conv2d(5, 7, 3, padding=1, bias=False)),
    "with_bias": lambda: ConvBn(nn.Conv2d(5, 7, 3, stride=2, padding=1)),
    "depthwise": lambda: ConvBn(nn.Conv2d(6, 6, 3, padding=1, groups=6, bias=False)),
    "not_affine": lambda: ConvBn(nn.Conv2d(5, 7, (1, 3), padding=(0, 1)), affine=False, relu=False),
}


@pytest.mark.parametrize("name", list(CONVS))
def test_batch_norm_after_a_convolution_is_folded_into_its_weights(
    name: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    model = CONVS[name]().eval()
    x = torch.randn(2, model.conv.in_channels, 11, 13)
    tasks = trace_tasks(model, (x,), CpuTarget())
    assert not any("batch_norm" in t.op for t in tasks), [t.label for t in tasks]
    conv = next(t for t in tasks if "convolution" in t.op)
    assert len(conv.input_nodes) == 3  # input, folded weight, folded bias
    with torch.no_grad():
        for kernels in ("eager", "reference"):
            compiled = _compiled(model, tmp_path, kernels)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
            assert _rewrites() == [FOLDED_BATCH_NORM]
    assert "rewritten: batch norm folded" in kope.report().format_table()


def test_folded_weights_follow_writes_after_compiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folds = []

    def counted(sources: list[torch.Tensor], eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        folds.append(1)
        return fold(sources, eps)

    fold = rewrites.fold_batch_norm
    monkeypatch.setattr(rewrites, "fold_batch_norm", counted)
    torch.manual_seed(0)
    model = ConvBn(nn.Conv2d(5, 7, 3, padding=1)).eval()
    x = torch.randn(2, 5, 9, 9)
    with torch.no_grad():
        compiled = _compiled(model, tmp_path)
        compiled(x)
        folds.clear()  # the compile's own check folds random weights once
        compiled(x)
        compiled(x)
        assert len(folds) == 0  # kept between calls
        model.bn.running_var.mul_(3)  # written in place
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        state["conv.weight"].uniform_(-1, 1)
        state["bn.bias"].uniform_(-1, 1)
        model.load_state_dict(state)  # a checkpoint loaded
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
        model.conv.weight.data.mul_(0.5)  # through .data: no version bump
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
        assert len(folds) == 3


def test_a_fold_of_inference_tensors_is_redone_on_every_call() -> None:
    """Inference tensors count no writes, so nothing tells a kept fold is stale."""
    with torch.inference_mode():
        weight, mean, var = torch.randn(4, 3, 1, 1), torch.randn(4), torch.rand(4) + 0.5
    folder = FoldedBatchNorm(1e-5)
    for _ in range(3):
        folder(weight, None, None, None, mean, var)
    assert folder.computed == 3
    kept = FoldedBatchNorm(1e-5)
    weight, mean, var = weight.clone(), mean.clone(), var.clone()
    for _ in range(3):
        kept(weight, None, None, None, mean, var)
    assert kept.computed == 1


def test_a_convolution_whose_output_is_used_elsewhere_is_not_folded(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = ConvUsedTwice(nn.Conv2d(5, 7, 3, padding=1)).eval()
    x = torch.randn(2, 5, 9, 9)
    with torch.no_grad():
        compiled = _compiled(model, tmp_path)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert _rewrites() == []


@pytest.mark.parametrize("scale", ["div", "mul", "none"])
def test_attention_written_by_hand_runs_as_one_kernel(scale: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Attention(scale)
    # Odd sizes; keys and queries of different lengths, values of another width.
    q, k, v = torch.randn(2, 3, 37, 16), torch.randn(2, 3, 29, 16), torch.randn(2, 3, 29, 24)
    with torch.no_grad():
        compiled = _compiled(model, tmp_path)
        torch.testing.assert_close(compiled(q, k, v), model(q, k, v), rtol=1e-4, atol=1e-5)
    assert _rewrites() == [FUSED_ATTENTION]
    (graph,) = kope.report().graphs
    # One Task, the attention kernel family's (`kope.spaces.attention`), not its pieces
    assert [t.op for t in graph.tasks] == ["aten.scaled_dot_product_attention.default"]


@pytest.mark.parametrize("mask", ["causal", "band", "buffer"])
def test_attention_with_a_mask_by_hand_runs_as_one_kernel(mask: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MaskedAttention(21, mask)
    q, k, v = (torch.randn(2, 3, 21, 16) for _ in range(3))
    with torch.no_grad():
        compiled = _compiled(model, tmp_path)
        torch.testing.assert_close(compiled(q, k, v), model(q, k, v), rtol=1e-4, atol=1e-5)
    assert _rewrites() == [FUSED_ATTENTION]
    (graph,) = kope.report().graphs
    (task,) = [t for t in graph.tasks if "attention" in t.op]
    assert not any("bmm" in t.op or "softmax" in t.op for t in graph.tasks)
    # A causal constant becomes is_causal (the kernel reads only the keys a block sees);
    # another mask SDPA's boolean mask of the scores kept.
    assert ("is_causal=True" in task.label) is (mask == "causal")
    assert ("21x21xi1" in task.label) is (mask != "causal")


def test_attention_inside_a_transformer_encoder_layer_taken_apart(tmp_path: Path) -> None:
    """KOPE's decomposition of the fused fast path writes attention out; it is fused again
    (`kope precompile` finds no softmax to optimize), except under kernels="reference", where
    every operator runs its reference lowering and no library call stands in for them."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 11, 32)
    tasks = trace_tasks(layer, (x,), CpuTarget())
    assert tasks and not any("softmax" in t.op for t in tasks), [t.op for t in tasks]
    with torch.no_grad():
        compiled = _compiled(layer, tmp_path, "reference")  # takes the fast path apart
        torch.testing.assert_close(compiled(x), layer(x), rtol=1e-4, atol=1e-4)
    assert FUSED_ATTENTION not in _rewrites()
    (graph,) = kope.report().graphs
    assert any("softmax" in t.op for t in graph.tasks) and graph.jit_share() == 1.0


def test_a_softmax_that_is_no_attention_is_left_alone(tmp_path: Path) -> None:
    torch.manual_seed(0)
    q, k = torch.randn(3, 37, 16), torch.randn(3, 29, 16)

    def probabilities(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1)

    with torch.no_grad():
        torch._dynamo.reset()
        kope.reset_report()
        compiled = torch.compile(
            probabilities, backend="kope", options={"store": str(tmp_path), "kernels": "eager"}
        )
        torch.testing.assert_close(compiled(q, k), probabilities(q, k))
    assert _rewrites() == []


def test_a_rewrite_that_disagrees_with_the_original_is_not_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A defect in a rewrite (here: the scale inverted) is caught by its check at compile time."""
    monkeypatch.setitem(rewrites._SCALES, torch.ops.aten.div.Tensor, lambda c: c)
    torch.manual_seed(0)
    model = Attention("div")
    q, k, v = torch.randn(1, 2, 17, 8), torch.randn(1, 2, 17, 8), torch.randn(1, 2, 17, 8)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kope.compiler"):
        compiled = _compiled(model, tmp_path)
        torch.testing.assert_close(compiled(q, k, v), model(q, k, v), rtol=1e-4, atol=1e-5)
    assert _rewrites() == []
    assert "rewrite not made (attention" in caplog.text


class Residual(nn.Module):
    """A ResNet basic block at odd sizes, with a scale per channel between its convolutions
    (a broadcast operand the NHWC region must permute alike)."""

    def __init__(self, channels: int):
        super().__init__()
        self.a = ConvBn(nn.Conv2d(channels, channels, 3, padding=1, bias=False))
        self.b = ConvBn(nn.Conv2d(channels, channels, 3, padding=1), relu=False)
        self.scale = nn.Parameter(torch.rand(channels, 1, 1) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b(self.a(x) * self.scale) + x)


def _stack(blocks: int, channels: int = 5) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[Residual(channels) for _ in range(blocks)]).eval()


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("bias", [True, False])
def test_a_pointwise_convolution_runs_as_a_matrix_product(
    batch: int, bias: bool, tmp_path: Path
) -> None:
    """A 1x1 convolution (its batch norm folded in, then a ReLU) is the product of its weight
    and each sample's channels x positions: one matmul Task at batch 1, a batched one with the
    weight read for every sample beyond, the bias and ReLU its epilogue (the view back to
    NCHW sunk below them); eager's result on every road."""
    torch.manual_seed(0)
    model = ConvBn(nn.Conv2d(37, 11, 1, bias=bias)).eval()
    x = torch.randn(batch, 37, 23, 29)  # oneDNN's size, where eager reorders it per call
    tasks = trace_tasks(model, (x,), CpuTarget())
    assert not any("convolution" in t.op for t in tasks), [t.label for t in tasks]
    (product,) = tasks  # its bias and ReLU are the product's epilogue
    assert ("aten.bmm" in product.op) == (batch > 1), product.label
    assert "relu" in product.op, product.label
    with torch.no_grad():
        for kernels in ("eager", "reference"):
            compiled = _compiled(model, tmp_path, kernels)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
            assert _rewrites() == [FOLDED_BATCH_NORM, POINTWISE_CONVOLUTION]


@pytest.mark.parametrize(
    "conv",
    [
        nn.Conv2d(37, 11, 1, stride=2),  # not every position
        nn.Conv2d(37, 11, 1, padding=1),  # zeros around
        nn.Conv2d(36, 12, 1, groups=3),  # three products
        nn.Conv2d(37, 11, 3, padding=1),
    ],
    ids=["strided", "padded", "grouped", "3x3"],
)
def test_convolutions_that_are_no_single_product_stay_convolutions(
    conv: nn.Conv2d, tmp_path: Path
) -> None:
    model = ConvBn(conv).eval()
    x = torch.randn(2, conv.in_channels, 23, 29)
    with torch.no_grad():
        compiled = _compiled(model, tmp_path)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert POINTWISE_CONVOLUTION not in _rewrites()


def test_a_stack_of_convolutions_is_computed_channels_last(tmp_path: Path) -> None:
    """Two blocks: four convolutions, two layout copies (the input in, the output back)."""
    model = _stack(2)
    x = torch.randn(2, 5, 9, 11)
    tasks = trace_tasks(model, (x,), CpuTarget())
    copies = [t for t in tasks if "permute" in t.op]  # a transpose Task each
    assert [t.spec.outputs[0].shape for t in copies] == [(2, 9, 11, 5), (2, 5, 9, 11)]
    elementwise = [t for t in tasks if "convolution" not in t.op and t not in copies]
    assert elementwise and all(t.spec.inputs[0].shape == (2, 9, 11, 5) for t in elementwise)
    with torch.no_grad():
        for kernels in ("eager", "reference"):
            compiled = _compiled(model, tmp_path, kernels)
            got = compiled(x)
            torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-5)
            assert got.is_contiguous()  # back in the layout eager returns
            assert _rewrites().count(CHANNELS_LAST) == 1
            ran = [t for g in kope.report().graphs for t in g.tasks if "permute" in t.op]
            assert len(ran) == 2, ran


def test_small_convolutions_eager_runs_without_onednn_stay_nchw(tmp_path: Path) -> None:
    """Batch 1 at 5x9x11: ATen runs these 3x3 convolutions with its own loops, faster than
    oneDNN there, so they are not moved to oneDNN's channels-last path."""
    model = _stack(2)
    x = torch.randn(1, 5, 9, 11)
    with torch.no_grad():
        compiled = _compiled(model, tmp_path)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert CHANNELS_LAST not in _rewrites()


def test_a_lone_convolution_stays_nchw_its_copy_costs_what_it_saves(tmp_path: Path) -> None:
    """One convolution and its ReLU: one copy in (the copy out is the ReLU's kernel writing
    its result transposed), against one convolution's saving."""
    torch.manual_seed(0)
    model = ConvBn(nn.Conv2d(5, 5, 3, padding=1)).eval()
    x = torch.randn(2, 5, 9, 11)
    with torch.no_grad():
        compiled = _compiled(model, tmp_path)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert CHANNELS_LAST not in _rewrites()


def test_one_block_writes_its_output_transposed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A residual block without oneDNN's fused convolutions: its last add and ReLU and the
    copy back to NCHW are one kernel."""
    monkeypatch.setattr(rewrites, "packed_convolutions_available", lambda: False)
    model = _stack(1)
    x = torch.randn(2, 5, 9, 11)
    tasks = trace_tasks(model, (x,), CpuTarget())
    last = tasks[-1]
    assert last.op.endswith("aten.permute.default+aten.clone.default"), last.op
    assert "add" in last.op and "relu" in last.op
    with torch.no_grad():
        compiled = _compiled(model, tmp_path, "reference")
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert _rewrites().count(CHANNELS_LAST) == 1


class ConvAct(nn.Module):
    """A convolution and `act`; one, a residual add and a ReLU; one whose output is read
    twice."""

    def __init__(self, act: nn.Module, channels: int = 6):
        super().__init__()
        self.a = nn.Conv2d(channels, channels, 3, padding=1)
        self.b = nn.Conv2d(channels, channels, 3, padding=2, dilation=2, bias=False)
        self.c = nn.Conv2d(channels, channels, 1)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.a(x))
        z = torch.relu(self.b(y) + x)
        w = self.c(z)
        return z + w.sigmoid() + w


ACTIVATIONS = {
    "relu": nn.ReLU(),
    "gelu": nn.GELU(),
    "silu": nn.SiLU(),
    "tanh": nn.Tanh(),
    "sigmoid": nn.Sigmoid(),
}


@pytest.mark.skipif(not rewrites.packed_convolutions_available(), reason="no oneDNN here")
@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_activations_and_residual_adds_run_inside_the_convolution(act: str, tmp_path: Path) -> None:
    """Channels-last convolutions take the op after them into oneDNN's call, with their
    weights packed once: the unary activation, and the residual add with its ReLU. A
    convolution read twice keeps its ops outside. The results match eager at odd shapes."""
    torch.manual_seed(0)
    model = ConvAct(ACTIVATIONS[act]).eval()
    x = torch.randn(2, 6, 9, 11)
    tasks = trace_tasks(model, (x,), CpuTarget())
    convolutions = [t for t in tasks if "convolution" in t.op]
    assert len(convolutions) == 1, [t.label for t in tasks]  # the one read twice
    with torch.no_grad():
        compiled = _compiled(model, tmp_path)
        got, want = compiled(x), model(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert got.is_contiguous()
    made = _rewrites()
    assert made.count(CHANNELS_LAST) == 1
    assert made.count(FUSED_CONVOLUTION) == 2, made
    assert "elementwise ops fused into the convolution" in kope.report().format_table()


class Downsampling(nn.Module):
    """A ResNet downsampling block: a strided convolution, and a strided 1x1 convolution on
    the shortcut, added."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.a = ConvBn(nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False))
        self.b = ConvBn(nn.Conv2d(cout, cout, 3, padding=1, bias=False), relu=False)
        self.shortcut = ConvBn(nn.Conv2d(cin, cout, 1, stride=2, bias=False), relu=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b(self.a(x)) + self.shortcut(x))


@pytest.mark.parametrize("fused", [True, False])
def test_a_downsampling_stage_is_one_channels_last_region(
    fused: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shortcut convolution reads the block's input and feeds its add: grown from it or
    from the block's first convolution, the region is the same one (two overlapping regions
    crashed the compile). Its add of two convolutions fuses into one of them."""
    if not fused:
        monkeypatch.setattr(rewrites, "packed_convolutions_available", lambda: False)
    torch.manual_seed(0)
    model = nn.Sequential(Downsampling(5, 8), Downsampling(8, 12)).eval()
    x = torch.randn(2, 5, 15, 17)
    with torch.no_grad():
        compiled = _compiled(model, tmp_path)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    made = _rewrites()
    assert made.count(CHANNELS_LAST) == 1
    if fused and rewrites.packed_convolutions_available():
        assert made.count(FUSED_CONVOLUTION) == 4, made  # two ReLUs, two residual adds


def test_channels_last_weights_follow_writes_after_compiling(tmp_path: Path) -> None:
    model = _stack(2)
    x = torch.randn(2, 5, 8, 8)  # batch 2: eager runs these convolutions with oneDNN
    with torch.no_grad():
        compiled = _compiled(model, tmp_path, "reference")
        compiled(x)
        model[1].b.conv.weight.mul_(-2)  # written in place
        model[0].scale.add_(1)  # a broadcast operand, read each call
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
        # Folded and packed by one node: a write through .data to a batch norm's statistics
        # (no version bump) must still reach the packed weight.
        model[0].a.bn.running_var.data.mul_(4)
        model[1].a.conv.weight.data.mul_(0.5)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert _rewrites().count(CHANNELS_LAST) == 1


def test_a_channels_last_model_imports_as_one_module() -> None:
    """`kope import` writes the layout copies as the backend runs them: transpose Tasks."""
    module = model_module(_stack(2), (torch.randn(2, 5, 9, 11),), CpuTarget())
    assert sum("permute" in task.op for task in module.tasks) == 2
