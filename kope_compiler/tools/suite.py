"""The operator suite: one model per operator, in the `module:factory` form of `kope precompile`.

    kope precompile kope.suite:softmax --budget 16

`OPSET` is the suite of the agents issue (matmuls at three shapes, one odd; a padded 3x3
conv; softmax; layer norm; row sum; row max; a 4-op elementwise chain). `SEQUENCE` is the
fixed sequence of related operators of the memory ablation. Inputs are seeded.

`load_suite(directory)` reads a suite kept as files (`benchmarks/suite/` is the operator suite
of issue 13): one file per operator in the convention of public kernel benchmarks (`Model`,
`get_inputs()`, `get_init_inputs()`), named `NNN_<family>_<name>.py` so that sorted order groups
a family and puts its smaller shapes first; files starting with `_` are skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from kope.core.errors import ModelLoadError

Example = tuple[nn.Module, tuple[torch.Tensor, ...]]


class Op(nn.Module):
    """A model that is one operator (weights, if any, are parameters)."""

    def __init__(self, fn: Callable[..., torch.Tensor], *params: torch.Tensor):
        super().__init__()
        self.fn = fn
        self.params = nn.ParameterList([nn.Parameter(p, requires_grad=False) for p in params])

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.fn(*inputs, *self.params)


def _seeded(*shapes: tuple[int, ...]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=gen) for shape in shapes]


def matmul(m: int, k: int, n: int) -> Callable[[], Example]:
    def factory() -> Example:
        a, b = _seeded((m, k), (k, n))
        return Op(torch.mm).eval(), (a, b)

    factory.__name__ = f"matmul_{m}x{k}x{n}"
    return factory


def conv3x3(n: int, c: int, hw: int, f: int) -> Callable[[], Example]:
    def factory() -> Example:
        x, w = _seeded((n, c, hw, hw), (f, c, 3, 3))
        return Op(lambda t, weight: F.conv2d(t, weight, padding=1), w).eval(), (x,)

    factory.__name__ = f"conv3x3_{n}x{c}x{hw}x{hw}_{f}"
    return factory


def softmax(rows: int, cols: int) -> Callable[[], Example]:
    def factory() -> Example:
        return Op(lambda t: torch.softmax(t, dim=-1)).eval(), tuple(_seeded((rows, cols)))

    factory.__name__ = f"softmax_{rows}x{cols}"
    return factory


def layer_norm(rows: int, cols: int) -> Callable[[], Example]:
    def factory() -> Example:
        x, w, b = _seeded((rows, cols), (cols,), (cols,))
        return Op(lambda t, weight, bias: F.layer_norm(t, (cols,), weight, bias), w, b).eval(), (x,)

    factory.__name__ = f"layer_norm_{rows}x{cols}"
    return factory


def row_sum(rows: int, cols: int) -> Callable[[], Example]:
    def factory() -> Example:
        return Op(lambda t: t.sum(dim=-1)).eval(), tuple(_seeded((rows, cols)))

    factory.__name__ = f"row_sum_{rows}x{cols}"
    return factory


def row_max(rows: int, cols: int) -> Callable[[], Example]:
    def factory() -> Example:
        return Op(lambda t: t.amax(dim=-1)).eval(), tuple(_seeded((rows, cols)))

    factory.__name__ = f"row_max_{rows}x{cols}"
    return factory


def elementwise_chain(rows: int, cols: int) -> Callable[[], Example]:
    def factory() -> Example:
        return Op(lambda t: torch.tanh(t * 0.5 + 1.0) * t).eval(), tuple(_seeded((rows, cols)))

    factory.__name__ = f"elementwise_chain_{rows}x{cols}"
    return factory


OPSET: dict[str, Callable[[], Example]] = {
    "matmul_256": matmul(256, 256, 256),
    "matmul_512": matmul(512, 512, 512),
    "matmul_odd": matmul(255, 129, 193),
    "conv3x3": conv3x3(1, 32, 56, 64),
    "softmax": softmax(512, 1024),
    "layer_norm": layer_norm(512, 1024),
    "row_sum": row_sum(1024, 1024),
    "row_max": row_max(1024, 1024),
    "elementwise_chain": elementwise_chain(1024, 1024),
}
ELEMENTWISE = {"elementwise_chain"}

# The memory ablation's sequence: related operators, in this order.
SEQUENCE: dict[str, Callable[[], Example]] = {
    "matmul_128": matmul(128, 128, 128),
    "matmul_192": matmul(192, 192, 192),
    "matmul_320": matmul(320, 256, 320),
    "matmul_384": matmul(384, 384, 384),
    "softmax_256x512": softmax(256, 512),
    "softmax_512x512": softmax(512, 512),
    "softmax_384x1024": softmax(384, 1024),
    "layer_norm_256x512": layer_norm(256, 512),
    "layer_norm_512x512": layer_norm(512, 512),
    "layer_norm_384x1024": layer_norm(384, 1024),
}

globals().update({name: factory for name, factory in {**OPSET, **SEQUENCE}.items()})


def load_suite(directory: str | Path) -> dict[str, Callable[[], Example]]:
    """One factory per suite file of `directory`, in sorted file-name order, keyed by file stem.

    A factory imports its file afresh and returns `(Model(*get_init_inputs()).eval(),
    tuple(get_inputs()))`, seeding torch with 0 before building the model and again before
    making the inputs, so weights and inputs are the same on every call. A file that does not
    import, or lacks `Model`, `get_inputs` or `get_init_inputs` (as `kope precompile FILE.py`
    needs them too), raises ModelLoadError when its factory is called."""
    root = Path(directory)
    if not root.is_dir():
        raise ModelLoadError(
            f"suite directory {str(root)!r} does not exist or is not a directory: "
            "give a directory of operator files such as benchmarks/suite"
        )
    files = sorted(p for p in root.glob("*.py") if not p.name.startswith("_"))
    if not files:
        raise ModelLoadError(
            f"suite directory {str(root)!r} has no suite files: add files NNN_<family>_<name>.py "
            "defining Model, get_inputs() and get_init_inputs()"
        )
    return {path.stem: _file_factory(path) for path in files}


def _file_factory(path: Path) -> Callable[[], Example]:
    def factory() -> Example:
        from kope.tools.models import _from_file  # as `kope precompile FILE.py` reads one

        model, inputs = _from_file(path, seed=0)
        return model.eval(), inputs

    factory.__name__ = path.stem
    return factory
