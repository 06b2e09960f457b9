"""Multi-output operators through the backend: every family gives eager's answers, whatever runs.

The class of defect these catch: a graph rewritten by KOPE (decompositions traced by make_fx)
that calls a namedtuple class (`return_types_nll_loss_forward`) by a module path it does not
live at, so the model raised at its first call instead of running.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import kope

aten = torch.ops.aten


def _inputs() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "x": torch.randn(9, 21, generator=gen),
        "target": torch.randint(0, 21, (9,), generator=gen),
        "img": torch.randn(2, 3, 4, 5, generator=gen),
        "w3": torch.rand(3, generator=gen) + 0.5,
        "b3": torch.randn(3, generator=gen),
        "w21": torch.rand(21, generator=gen) + 0.5,
        "b21": torch.randn(21, generator=gen),
    }


FAMILIES: dict[str, Callable[[dict[str, torch.Tensor]], object]] = {
    "cross_entropy": lambda a: F.cross_entropy(a["x"], a["target"]),
    "cross_entropy_smoothed": lambda a: F.cross_entropy(a["x"], a["target"], label_smoothing=0.1),
    "nll_loss_sum": lambda a: F.nll_loss(F.log_softmax(a["x"], -1), a["target"], reduction="sum"),
    "max_dim": lambda a: torch.max(a["x"], dim=1),
    "min_dim_keepdim": lambda a: torch.min(a["x"], dim=0, keepdim=True),
    "topk": lambda a: torch.topk(a["x"], 3, dim=-1),
    "sort": lambda a: torch.sort(a["x"], dim=-1, descending=True),
    "native_layer_norm": lambda a: aten.native_layer_norm(a["x"], [21], a["w21"], a["b21"], 1e-5),
    "batch_norm_stats": lambda a: aten._native_batch_norm_legit_no_training(
        a["img"], a["w3"], a["b3"], a["b3"].abs(), a["w3"], 0.1, 1e-5
    ),
    "var_mean": lambda a: torch.var_mean(a["x"], dim=1),
    "std_mean": lambda a: torch.std_mean(a["x"], dim=0),
    "aminmax": lambda a: torch.aminmax(a["x"], dim=1),
    "cummax": lambda a: torch.cummax(a["x"], dim=1),
}


class Family(torch.nn.Module):
    def __init__(self, fn: Callable[[dict[str, torch.Tensor]], object]):
        super().__init__()
        self.fn = fn

    def forward(self, *tensors: torch.Tensor) -> object:
        return self.fn(dict(zip(sorted(_inputs()), tensors, strict=True)))


def _flat(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    assert isinstance(value, (tuple, list))
    return [t for v in value for t in _flat(v)]


@pytest.mark.parametrize("kernels", ["auto", "reference", "eager"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_multi_output_family_matches_eager(family: str, kernels: str) -> None:
    inputs = _inputs()
    tensors = [inputs[k] for k in sorted(inputs)]
    model = Family(FAMILIES[family]).eval()
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(model, backend="kope", options={"kernels": kernels})
        got = compiled(*tensors)
        want = model(*tensors)
    got_flat, want_flat = _flat(got), _flat(want)
    assert len(got_flat) == len(want_flat)
    for g, w in zip(got_flat, want_flat, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert type(got) is type(want) or isinstance(got, tuple)


def test_cross_entropy_is_partitioned_not_refused() -> None:
    """The loss runs as Tasks (its parts lower), not as one operator left to eager."""
    inputs = _inputs()
    torch._dynamo.reset()
    kope.reset_report()
    with torch.no_grad():
        compiled = torch.compile(
            Family(FAMILIES["cross_entropy"]), backend="kope", options={"kernels": "reference"}
        )
        compiled(*[inputs[k] for k in sorted(inputs)])
    report = kope.report()
    assert report.tasks, report.format_table()
