"""How alike two tasks are: op family, op, target, dtype, rank and shapes.

A task's features are codes for its op, op family, target (name + hardware fingerprint) and
primary dtype, its rank, and a shape vector of log2 sizes: the last four dims of its first
output (right-aligned, padded with 1) and the total input element count. The distance is
tiered so that a sort by it puts the same op on the same target first:

    d = shape + [dtype differs] + [rank differs]        in [0, 3]   same op, same target
      + 4 [target or hardware differs]                   in [4, 7]   same op, other target
      + 8 [op differs within the family]                 in [8, 15]  same family
      + 16 [family differs]                              >= 16

`shape` is the mean absolute log2 ratio over the shape vector, divided by 4 and capped at 1,
so 512^3 against 256^3 matmul is 0.2 and a factor 16 in every dim or more is 1.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

SHAPE_DIMS = 4  # trailing output dims kept in the shape vector (+1 slot for input numel)
W_DTYPE, W_RANK, W_TARGET, W_OP, W_FAMILY = 1.0, 1.0, 4.0, 8.0, 16.0

_FAMILIES: dict[str, tuple[str, ...]] = {
    "matmul": (
        "mm",
        "bmm",
        "addmm",
        "matmul",
        "linear",
        "baddbmm",
        "addbmm",
        "dot",
        "mv",
        "addmv",
        "einsum",
    ),
    "conv": (
        "convolution",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "_convolution",
    ),
    "softmax": (
        "softmax",
        "_softmax",
        "log_softmax",
        "_log_softmax",
        "safe_softmax",
        "_safe_softmax",
    ),
    "norm": (
        "layer_norm",
        "native_layer_norm",
        "batch_norm",
        "native_batch_norm",
        "_native_batch_norm_legit_no_training",
        "group_norm",
        "native_group_norm",
        "rms_norm",
        "_fused_rms_norm",
        "instance_norm",
    ),
    "reduce": (
        "sum",
        "mean",
        "amax",
        "amin",
        "max",
        "min",
        "prod",
        "var",
        "std",
        "argmax",
        "argmin",
        "logsumexp",
        "var_mean",
        "norm",
        "linalg_vector_norm",
        "cumsum",
    ),
    "pool": (
        "max_pool2d",
        "avg_pool2d",
        "adaptive_avg_pool2d",
        "max_pool2d_with_indices",
        "_adaptive_avg_pool2d",
        "avg_pool1d",
        "max_pool1d",
    ),
    "elementwise": (
        "add",
        "sub",
        "mul",
        "div",
        "relu",
        "gelu",
        "tanh",
        "sigmoid",
        "exp",
        "log",
        "neg",
        "sqrt",
        "rsqrt",
        "pow",
        "where",
        "clamp",
        "clamp_min",
        "clamp_max",
        "maximum",
        "minimum",
        "silu",
        "abs",
        "erf",
        "hardtanh",
        "leaky_relu",
        "reciprocal",
        "sin",
        "cos",
        "elu",
        "mish",
        "hardswish",
        "softplus",
        "fused",
        "rsub",
        "square",
        "threshold",
        "masked_fill",
        "copy",
        "_to_copy",
        "fill",
        "zeros_like",
        "ones_like",
        "sign",
        "floor",
        "ceil",
        "round",
    ),
}
_FAMILY_OF = {name: family for family, names in _FAMILIES.items() for name in names}


def op_base(op: str) -> str:
    """`aten.mm.default` -> `mm`; `aten.add_.Tensor` -> `add`; `fused:add+relu` -> `fused`."""
    name = op.split(":", 1)[0]
    parts = name.split(".")
    if parts[0] in ("aten", "prims", "torch", "ops") and len(parts) > 1:
        parts = parts[1:]
    base = parts[0]
    return base[:-1] if base.endswith("_") and not base.startswith("_") else base


def op_family(op: str) -> str:
    """The family an op belongs to (matmul, conv, softmax, norm, reduce, pool, elementwise),
    or its base name when it belongs to none."""
    base = op_base(op)
    return _FAMILY_OF.get(base, base)


def normalize_decision(text: str) -> str:
    """A decision's identity for grouping: what was done, without the trailing "(why)" an
    agent may add; lower case, `×` as `x`, single spaces."""
    what = re.sub(r"\s*\([^()]*\)\s*$", "", text.strip())
    return re.sub(r"\s+", " ", what.replace("×", "x").strip().lower())


def decision_hash(text: str) -> int:
    """A signed 64-bit hash of the normalised decision (0 for no decision)."""
    norm = normalize_decision(text)
    if not norm:
        return 0
    return int.from_bytes(
        hashlib.blake2b(norm.encode(), digest_size=8).digest(), "little", signed=True
    )


@dataclass(frozen=True)
class Features:
    """What similarity compares of one task."""

    op: str
    family: str
    target: str  # target name + hardware fingerprint
    dtype: str
    rank: int
    shape: tuple[float, ...]  # SHAPE_DIMS + 1 log2 sizes


def features(
    op: str, inputs: list[list[Any]], outputs: list[list[Any]], target: str, hardware: str
) -> Features:
    """The features of a task from its op, signature and target."""
    first = outputs[0] if outputs else (inputs[0] if inputs else [[], ""])
    shape = [int(d) for d in (first[0] if first else [])]
    dtype = str(first[1]) if len(first) > 1 else ""
    dims = ([1] * SHAPE_DIMS + shape)[-SHAPE_DIMS:]
    numel = sum(math.prod(int(d) for d in spec[0]) for spec in inputs if spec) or 1
    vector = tuple(math.log2(max(d, 1)) for d in dims) + (math.log2(max(numel, 1)),)
    return Features(op, op_family(op), f"{target}|{hardware}", dtype, len(shape), vector)


def distance(a: Features, b: Features) -> float:
    """The tiered distance between two tasks (see the module docstring)."""
    shape = sum(abs(x - y) for x, y in zip(a.shape, b.shape, strict=True)) / len(a.shape)
    d = min(shape / 4.0, 1.0)
    d += W_DTYPE * (a.dtype != b.dtype) + W_RANK * (a.rank != b.rank)
    d += W_TARGET * (a.target != b.target)
    if a.family != b.family:
        d += W_FAMILY
    elif a.op != b.op:
        d += W_OP
    return d


def distances(
    query: Features, codes: dict[str, int | None], table: dict[str, np.ndarray]
) -> np.ndarray:
    """`distance` from `query` to every task of a feature table at once.

    `table` holds integer code columns `op`, `family`, `target`, `dtype`, `rank` and a float
    `shape` matrix; `codes` maps each of the query's strings to its code (None if unseen).
    """

    def differs(name: str) -> np.ndarray:
        code = codes[name]
        column = table[name]
        return np.ones(len(column), dtype=bool) if code is None else column != code

    shape = np.abs(table["shape"] - np.asarray(query.shape, dtype=np.float32)).mean(axis=1)
    d = np.minimum(shape / 4.0, 1.0).astype(np.float64)
    d += W_DTYPE * differs("dtype") + W_RANK * (table["rank"] != query.rank)
    d += W_TARGET * differs("target")
    family_differs = differs("family")
    d += np.where(family_differs, W_FAMILY, np.where(differs("op"), W_OP, 0.0))
    return d
