"""`kope import`: a model as one module cut by the backend's partitioner, `@main` calling its
Tasks and glue, weights as constants. Lowered by `kope-lower-cpu` alone (every Task its
reference lowering), the ExecutionEngine runs it and it computes what eager does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch_mlir import ir

from kope.frontend.model_module import ModelImportError, model_module
from kope.passes.pipeline import parse_pipeline, run_pipeline
from kope.targets.cpu import CpuTarget
from kope.targets.jit import JitKernel
from kope.tools.cli import main
from kope.tools.zoo import ZOO
from kope.vocabulary.specs import TensorSpec


class MaskedScores(torch.nn.Module):
    """Bool and integer buffers as constants, a fused group, two outputs (one of rank 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mask", torch.tril(torch.ones(6, 6)).bool())
        self.register_buffer("rows", torch.tensor([3, 0, 5, 1]))
        self.weight = torch.nn.Parameter(torch.randn(6, 6))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = (x @ self.weight).masked_fill(~self.mask, float("-inf")).softmax(-1)
        return scores.index_select(0, self.rows), scores.sum()


class SmallAttention(torch.nn.Module):
    """A split into q, k and v (a multi-output glue function) and attention written by hand,
    which the backend rewrites to scaled_dot_product_attention and leaves to ATen: in the
    module, a glue function."""

    def __init__(self, dim: int = 8, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = (
            t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2)
            for t in self.qkv(x).split(dim, dim=-1)
        )
        scores = (q @ k.transpose(-2, -1)) * (dim // self.heads) ** -0.5
        return (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, length, dim)


def small_models() -> dict[str, tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    return {
        "masked_scores": (MaskedScores().eval(), (torch.randn(6, 6),)),
        "small_attention": (SmallAttention().eval(), (torch.randn(2, 4, 8),)),
        "cnn": ZOO["cnn"](),  # batch norm folded into the convolutions: constants
        "odd_shapes": ZOO["odd_shapes"](),  # two inputs, one transposed; two outputs
    }


@pytest.mark.parametrize("name", list(small_models()))
def test_the_module_runs_under_the_execution_engine_and_matches_eager(name: str) -> None:
    model, inputs = small_models()[name]
    written = model_module(model, inputs, CpuTarget())
    assert written.tasks and "kope.graph" in written.text
    module = ir.Module.parse(written.text, ir.Context())
    run_pipeline(module, parse_pipeline("kope-outline-operators"), description="outline")
    assert "kope_op_" not in str(module)  # the backend's cut stands
    run_pipeline(module, parse_pipeline("kope-lower-cpu"), description="lower")
    with torch.no_grad():
        want = model(*inputs)
    wants = want if isinstance(want, tuple) else (want,)
    jit = JitKernel(module, [TensorSpec.of(x) for x in inputs], [TensorSpec.of(w) for w in wants])
    for got, expected in zip(jit(*inputs), wants, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_glue_is_marked_and_never_keyed() -> None:
    model, inputs = small_models()["small_attention"]
    written = model_module(model, inputs, CpuTarget())
    glue = [line for line in written.text.splitlines() if "kope.glue" in line]
    assert any('kope.glue = "aten.split.Tensor"' in g for g in glue)
    assert not any("kope.key" in g for g in glue)
    # Attention is a Task of its own (`kope.spaces.attention`), keyed, no glue.
    assert not any("attention" in g for g in glue)
    assert any(t.op == "aten.scaled_dot_product_attention.default" for t in written.tasks)


class Broken(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.relu()
        torch._dynamo.graph_break()
        return y + 1


def test_a_model_with_graph_breaks_is_an_error_that_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ModelImportError, match=r"2 graphs \(graph breaks\).*--tasks"):
        model_module(Broken(), (torch.randn(3),), CpuTarget())
    (tmp_path / "broken.py").write_text(
        "import torch\n\n"
        "class Model(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        y = x.relu()\n"
        "        torch._dynamo.graph_break()\n"
        "        return y + 1\n\n"
        "def get_inputs():\n    return [torch.randn(3)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    assert main(["import", str(tmp_path / "broken.py")]) == 2
    assert "graph breaks" in capsys.readouterr().err


def test_torch_mlir_import_is_one_function_for_outlining(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mlp.mlir"
    assert main(["import", "mlp", "--torch-mlir", "-o", str(out)]) == 0
    text = out.read_text()
    assert re.findall(r"func\.func @(\w+)", text) == ["main"]
    assert "linalg.matmul" in text and "kope." not in text
