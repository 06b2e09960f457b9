"""Do the roads from a model to its operators cut it the same way? Where not, why.

Road one is the backend's (`torch.compile(backend="kope")`, `kope precompile`): the aten graph
partitioned into Tasks, each lowered alone with its weights as inputs. Road two is `kope
import` + `kope-opt`: the module `kope import` writes is cut by the backend's own partitioner
(each Task a keyed function, `@main` calling them), so every Task, fused groups included, has
the same key on both roads, and outlining leaves the module as it is.

IR from elsewhere takes outlining's own cut: `kope import --torch-mlir` (torch-mlir's import of
the whole model, weights as constants) + `kope-outline-operators`, one function per linalg
operator. A Task whose key that outlining also produces shares its kernels with it; the rest
are listed below by operator with the reason they differ, and the test fails when an operator
differs for an unlisted reason, or when a listed one starts to agree (then its line must go).
"""

from __future__ import annotations

import re

import pytest
import torch
from torch_mlir import fx as torch_mlir_fx
from torch_mlir import ir

from kope.frontend.model_module import model_module
from kope.passes.pipeline import parse_pipeline, run_pipeline
from kope.targets.cpu import CpuTarget
from kope.tools.precompile import trace_tasks
from kope.tools.zoo import ZOO

WEIGHTS = (
    "the whole-model import folds the weights into constants and splits off their layout "
    "(linalg.transpose, padding) as operators of their own; the backend's Task takes them as "
    "inputs and computes in one function"
)
DIFFERS = {
    "aten.addmm.default": WEIGHTS + " (transpose + matmul + bias add, three outlined functions)",
    "aten.convolution.default": WEIGHTS + " (the padded input is a separate operator)",
    "aten.max_pool2d.default": "the import pads the input with -inf as an operator of its own",
    "aten.layer_norm.default": (
        "torch.export decomposes layer norm into mean, variance and normalization generics; "
        "the backend keeps it one Task"
    ),
    "aten.clone.default": (
        "the import folds the contiguous copy of a transposed view into the transpose itself"
    ),
    "aten.scaled_dot_product_attention.default": (
        "the backend imports attention through its decomposition, marked as attention, as one "
        "Task; the whole-model import lowers the decomposition's operators one by one"
    ),
    "fused": (
        "the backend fuses connected elementwise and row-reduction operators (a scaled "
        "softmax, eval batch norm + relu) into one Task; outlining makes one function per "
        "linalg operator"
    ),
}


def outlined_keys(text: str) -> list[str]:
    """The keys in `text` after `kope-outline-operators`, in order."""
    parsed = ir.Module.parse(text, ir.Context())
    run_pipeline(parsed, parse_pipeline("kope-outline-operators"), description="outline")
    return re.findall(r'kope\.key = "([0-9a-f]+)"', str(parsed))


def torch_mlir_import(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> str:
    with torch.no_grad():
        module = torch_mlir_fx.export_and_import(
            model.eval(), *inputs, output_type="linalg-on-tensors"
        )
    return str(module)


def reason_group(op: str) -> str:
    return "fused" if "+" in op else op


@pytest.fixture(scope="module")
def roads() -> dict[str, tuple[list[tuple[str, str, bool]], list[str], list[str]]]:
    """Per zoo model: (op, label, agrees with torch-mlir's import outlined) per backend Task,
    the backend's keys, and the keys of `kope import`'s module once outlined."""
    target = CpuTarget()
    found = {}
    for name, factory in ZOO.items():
        model, inputs = factory()
        keys = set(outlined_keys(torch_mlir_import(model, inputs)))
        tasks = trace_tasks(model, inputs, target)
        imported = outlined_keys(model_module(model, inputs, target).text)
        found[name] = (
            [(t.op, t.label, t.key in keys) for t in tasks],
            [t.key for t in tasks],
            imported,
        )
    return found


def test_kope_import_cuts_every_model_as_the_backend_does(roads) -> None:
    for name, (tasks, backend, imported) in roads.items():
        assert imported == backend, f"{name}: " + ", ".join(
            label for (_, label, _), key in zip(tasks, backend, strict=True) if key not in imported
        )


def test_every_task_agrees_or_differs_for_a_listed_reason(roads) -> None:
    unexplained = [
        f"{name}: {label}"
        for name, (tasks, _, _) in roads.items()
        for op, label, agrees in tasks
        if not agrees and reason_group(op) not in DIFFERS
    ]
    assert not unexplained, "keys differ between the roads for:\n" + "\n".join(unexplained)
    agreeing = [label for tasks, _, _ in roads.values() for _, label, agrees in tasks if agrees]
    assert len(agreeing) >= 5, agreeing  # elementwise and reduction operators share keys


def test_every_listed_reason_is_still_seen(roads) -> None:
    seen = {
        reason_group(op) for tasks, _, _ in roads.values() for op, _, agrees in tasks if not agrees
    }
    stale = sorted(set(DIFFERS) - seen)
    assert not stale, f"these operators now agree on both roads; remove them: {stale}"
