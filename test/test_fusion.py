"""Fusion beyond chains: connected groups of elementwise and row ops as one Task, verified.

Each model is written the way user code writes it (RMSNorm, softmax and layer norm by hand,
GELU-tanh expanded, eval batch norm + relu, a scaled softmax) and elementwise epilogues
after a contraction (linear + GELU, a SwiGLU gate, a scaled residual), at odd shapes. The
partition must make its fused part one Task, and the compiled model, running every Task's
reference lowering, must match eager.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

import kope
from kope.targets.cpu import CpuTarget
from kope.tools.precompile import trace_tasks


class RmsNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class HfRmsNorm(RmsNorm):
    """As transformers writes it (LlamaRMSNorm): the dtype conversions leave a metadata check
    in the backend's graph, which must not cut the group there and not under precompile."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * x.to(dtype)


class HandSoftmax(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)


class HandLayerNorm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        centred = x - mean
        var = (centred * centred).mean(-1, keepdim=True)
        return centred / torch.sqrt(var + 1e-5)


class GeluTanh(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1 + torch.tanh(inner))


class LinearBnRelu(nn.Module):
    """Batch norm after a linear layer (after a convolution it is folded into the weights:
    `test_rewrites.py`)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(5, 7)
        self.bn = nn.BatchNorm1d(7)
        self.bn.running_mean.uniform_(-1, 1)
        self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.linear(x)))


class GroupNormSilu(nn.Module):
    """A diffusion UNet's residual block without its convolution: GroupNorm, SiLU, skip."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(3, 12)
        nn.init.uniform_(self.norm.weight, 0.5, 1.5)
        nn.init.uniform_(self.norm.bias, -0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.norm(x))


class ScaledSoftmax(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)


class LinearGelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(29, 45)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(self.linear(x), approximate="tanh")


class SwiGlu(nn.Module):
    """The gate's SiLU and the product with the up projection become the up matmul's
    epilogue; the gate's matmul is read by the group (a second contraction stays apart)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(23, 41, bias=False)
        self.up = nn.Linear(23, 41, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.silu(self.gate(x)) * self.up(x)


class ScaledResidual(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return r + 0.5 * torch.bmm(a, b)


class LinearResidual(nn.Module):
    """A linear on a 3-D activation with a scaled residual; `other` is added as well, read
    with other strides (it cannot be viewed as the product's rows, so it stays apart)."""

    def __init__(self, transposed: bool = False) -> None:
        super().__init__()
        self.linear = nn.Linear(31, 31)
        self.transposed = transposed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + 0.5 * self.linear(x)
        return y + x.transpose(0, 1) if self.transposed else y


CASES = {
    # name: (model, inputs, ops the fused Task must hold)
    "rms_norm": (RmsNorm(129), (torch.randn(37, 129),), {"mean", "rsqrt", "mul"}),
    "rms_norm_hf": (HfRmsNorm(129), (torch.randn(3, 37, 129),), {"mean", "rsqrt", "mul"}),
    "softmax": (HandSoftmax(), (torch.randn(37, 129) * 4,), {"amax", "exp", "sum", "div"}),
    "layer_norm": (HandLayerNorm(), (torch.randn(5, 37, 33),), {"mean", "sub", "sqrt", "div"}),
    "gelu_tanh": (GeluTanh(), (torch.randn(37, 129),), {"tanh", "mul", "add"}),
    "linear_bn_relu": (LinearBnRelu(), (torch.randn(11, 5),), {"batch_norm", "relu"}),
    "group_norm_silu": (
        GroupNormSilu(),
        (torch.randn(2, 12, 7, 9) * 3 + 1,),
        {"group_norm", "silu", "add"},
    ),
    "scaled_softmax": (
        ScaledSoftmax(),
        (torch.randn(3, 37, 16), torch.randn(3, 29, 16)),
        {"mul", "_softmax"},
    ),
    # Elementwise epilogues with the contraction they read as their head.
    # GELU's tanh form is expanded first (torch-mlir's lowering misstates sqrt(2/pi)).
    "linear_gelu": (LinearGelu(), (torch.randn(13, 29),), {"addmm", "tanh", "mul"}),
    "swiglu": (SwiGlu(), (torch.randn(19, 23),), {"mm", "silu", "mul"}),
    "scaled_residual": (
        ScaledResidual(),
        (torch.randn(3, 11, 17), torch.randn(3, 17, 9), torch.randn(3, 11, 9)),
        {"bmm", "mul", "add"},
    ),
    # A linear on a 3-D activation reads and writes it through views (x viewed as rows,
    # the product viewed back): they sink below the epilogue (`kope.frontend.partition.sink_views`).
    "linear_gelu_3d": (LinearGelu(), (torch.randn(3, 5, 29),), {"addmm", "tanh", "mul"}),
    "swiglu_3d": (SwiGlu(), (torch.randn(3, 7, 23),), {"mm", "silu", "mul"}),
    "linear_residual_3d": (LinearResidual(), (torch.randn(2, 9, 31),), {"addmm", "mul", "add"}),
    "linear_residual_strided": (
        LinearResidual(transposed=True),
        (torch.randn(9, 9, 31),),
        {"addmm", "mul", "add"},
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fused_group_is_one_task_and_matches_eager(name: str) -> None:
    torch.manual_seed(0)
    model, inputs, ops = CASES[name]
    model.eval()
    tasks = trace_tasks(model, inputs, CpuTarget())
    fused = [t for t in tasks if "+" in t.op]
    assert len(fused) == 1, [t.label for t in tasks]
    held = {op.split(".")[1] for op in fused[0].op.split("+")}
    assert ops <= held, (ops - held, fused[0].op)
    with torch.no_grad():
        compiled = torch.compile(model, backend="kope", options={"kernels": "reference"})
        got, want = compiled(*inputs), model(*inputs)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    compiled_keys = {t.key for t in kope.report().graphs[-1].tasks}
    assert compiled_keys == {t.key for t in tasks}, "precompile and the backend cut it apart"


def test_a_3d_linear_and_its_epilogue_are_the_same_task_as_on_rows() -> None:
    """The views sink, so a linear + GELU on (3, 5, d) is the Task of (15, d) rows, key and
    all: what was learned on one layout serves the other."""
    torch.manual_seed(0)
    model = LinearGelu().eval()
    rows = trace_tasks(model, (torch.randn(15, 29),), CpuTarget())
    batched = trace_tasks(model, (torch.randn(3, 5, 29),), CpuTarget())
    assert [t.key for t in batched] == [t.key for t in rows]
