"""The Triton spaces read the rules the target supplies: each family's first configurations on
CUDA and Ascend, in order with their prior scores, are what the per-flavour spaces gave before
the rules became data (literal, so any change to a space or a target's rules shows here); and no
module outside `targets/` tells targets apart by name."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import torch

from kope.spaces.triton_kernels import triton_space
from kope.targets import get_target
from kope.targets.ascend import ASCEND_RULES, AscendTarget
from kope.targets.cuda import CUDA_RULES, CudaTarget
from kope.tools.precompile import trace_tasks

ROOT = Path(__file__).resolve().parent.parent
PW, ROWS, MM, LOOPS = "triton-pointwise", "triton-rows", "triton-matmul", "triton-loops"
MM_PRIOR = 1.1597088100795365  # 3.0 - 1.5 * log2(padding of 100x70 in 64x64 tiles)
CASES: dict[str, tuple[Any, list[tuple[int, ...]]]] = {
    "relu_add": (lambda x, y: torch.relu(x + y), [(37, 29), (37, 29)]),
    "softmax": (lambda x: torch.softmax(x, -1), [(64, 768)]),
    "mm": (torch.mm, [(100, 24), (24, 70)]),
    "amax0": (lambda x: x.amax(0), [(7, 37)]),
}
# name -> flavour -> (size of the space, its first configurations with their priors)
EXPECTED: dict[str, dict[str, tuple[int, list[tuple[dict[str, Any], float]]]]] = {
    "relu_add": {
        "cuda": (
            8,
            [
                ({"family": PW, "BLOCK": 1024, "num_warps": 4}, 0.5),
                ({"family": PW, "BLOCK": 1024, "num_warps": 8}, 0.0),
                ({"family": PW, "BLOCK": 512, "num_warps": 4}, -0.5),
            ],
        ),
        "ascend": (
            8,
            [
                ({"family": PW, "BLOCK": 256, "multibuffer": True}, -1.5),
                ({"family": PW, "BLOCK": 256, "multibuffer": False}, -2.0),
                ({"family": PW, "BLOCK": 512, "multibuffer": True}, -2.5),
            ],
        ),
    },
    "softmax": {
        "cuda": (
            2,
            [
                ({"family": ROWS, "BLOCK": 1024, "num_warps": 4}, 1.0),
                ({"family": ROWS, "BLOCK": 1024, "num_warps": 8}, 0.0),
            ],
        ),
        "ascend": (
            2,
            [
                ({"family": ROWS, "BLOCK": 1024, "multibuffer": True}, 0.5),
                ({"family": ROWS, "BLOCK": 1024, "multibuffer": False}, 0.0),
            ],
        ),
    },
    "mm": {
        "cuda": (
            7,
            [
                (
                    {"family": MM, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}
                    | {"num_warps": 4, "num_stages": 3},
                    MM_PRIOR,
                ),
                (
                    {"family": MM, "BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}
                    | {"num_warps": 4, "num_stages": 3},
                    MM_PRIOR - 0.2,
                ),
            ],
        ),
        "ascend": (
            10,
            [
                (
                    {"family": MM, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32}
                    | {"multibuffer": True},
                    MM_PRIOR + 0.5,
                ),
                (
                    {"family": MM, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32}
                    | {"multibuffer": False},
                    MM_PRIOR,
                ),
            ],
        ),
    },
    "amax0": {
        "cuda": (
            2,
            [
                ({"family": LOOPS, "BLOCK": 64, "num_warps": 4}, -0.5),
                ({"family": LOOPS, "BLOCK": 64, "num_warps": 8}, -1.0),
            ],
        ),
        "ascend": (
            2,
            [
                ({"family": LOOPS, "BLOCK": 64, "multibuffer": True}, -1.5),
                ({"family": LOOPS, "BLOCK": 64, "multibuffer": False}, -2.0),
            ],
        ),
    },
}


class _Fn(torch.nn.Module):
    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: torch.Tensor) -> Any:
        return self.fn(*args)


@pytest.mark.parametrize("name", CASES)
def test_each_family_keeps_its_configurations_on_both_targets(name: str) -> None:
    fn, shapes = CASES[name]
    (task,) = trace_tasks(_Fn(fn), [torch.randn(s) for s in shapes], get_target("cpu"))
    for flavour, rules in (("cuda", CUDA_RULES), ("ascend", ASCEND_RULES)):
        space = triton_space(task.payload, task.spec.inputs, task.spec.outputs, rules)
        size, first = EXPECTED[name][flavour]
        assert len(space) == size, flavour
        for (config, prior), (want, want_prior) in zip(space, first, strict=False):
            assert list(config.items()) == list(want.items()), flavour  # the same key order
            assert prior == pytest.approx(want_prior, abs=1e-12), (flavour, config)


def test_the_targets_supply_their_rules() -> None:
    """Under the interpreter, each Triton target hands the spaces its rules and names its
    device's Ray resource."""
    assert CudaTarget().kernel_rules() == CUDA_RULES
    assert AscendTarget().kernel_rules() == ASCEND_RULES
    assert (CudaTarget.ray_resource, AscendTarget.ray_resource) == ("GPU", "NPU")
    assert get_target("cpu").kernel_rules() is None


def test_no_module_outside_targets_compares_a_target_name() -> None:
    """A new Triton-style device is one module in `targets/`: nothing else compares a string
    with a target's name or flavour."""
    names = {"cuda", "ascend", "npu", "flavour"}
    wrong = []
    for folder in ("kope_compiler", "passes", "memory", "vocabulary"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Compare):
                    parts = [node.left, *node.comparators]
                    if any(isinstance(p, ast.Constant) and p.value in names for p in parts):
                        wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not wrong, "\n".join(wrong)
