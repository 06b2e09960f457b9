"""Triton kernels written from an operator's linalg payload, for operators no agent has seen.

The kernel is derived from the payload's structure, never from the operator's name:

- `triton-pointwise`: every op is parallel; the whole payload fuses into one kernel over a
  flat block of output offsets (broadcasts, permutations and reshapes become index maths).
- `triton-rows`: ops reduce trailing loops of rows (softmax, norms, sum/mean/amax); one
  program per row holds the row in one block, reduces it with `tl.sum`/`tl.max`/`tl.min`,
  and finishes the ops that consume the reduced values.
- `triton-matmul`: a multiply-add reduction with M, N and K loops (mm, bmm, addmm, linear),
  as a `tl.dot` tile loop in the manner of inductor's mm template, with the pointwise
  epilogue fused.
- `triton-loops`: reductions that are not rows of contiguous elements: windows (pooling, and
  convolution, whose input maps are compound, `d2 * 2 + d4`, and whose padding is a
  `tensor.pad`), and reductions over leading or middle dims. Like the pointwise family it
  blocks over the flat output offsets; each program runs the reduction's body over the
  reduced loops (static loops where they are short), so any body reduces, and fuses the
  epilogue. A payload goes to the family its reductions suit (rows when every reduction reads
  trailing dims), and to the other when that one refuses it.

`triton_space` lists the configurations of the family with prior scores, as the heuristic
agent's search expects (flat decisions it can change one at a time); `render_triton` writes
the module text (`launch(*inputs, *outputs)` computes the outputs in place). Both read the
rules the Triton target supplies (`kope.targets.triton_rules.TritonRules`): a grid as large as
the work with warps and stages (a GPU), or a few programs that loop over the tiles, with block
footprints bounded by a unified buffer (Ascend); never the target's name.

This module chooses the family; each family is a module of its own (`triton_pointwise` with
the loops family, `triton_rows`, `triton_matmul`, on the shared `triton_family`). The IR half,
which evaluates the payload's tensors at a family's coordinates, is `triton_lowering`.
"""

from __future__ import annotations

from functools import lru_cache

from torch_mlir import ir

from kope.spaces.triton_family import LOOPS, MATMUL, POINTWISE, ROWS, Config, Kernel
from kope.spaces.triton_ir import (
    FUNC_LEVEL,
    Payload,
    Unsupported,
    dim_positions,
    iterators,
    maps,
    plain,
    shape,
)
from kope.spaces.triton_matmul import Matmul, contraction_roles
from kope.spaces.triton_pointwise import Loops, Pointwise
from kope.spaces.triton_rows import Rows
from kope.targets.triton_rules import TritonRules
from kope.vocabulary.specs import TensorSpec

__all__ = [
    "LOOPS",
    "MATMUL",
    "POINTWISE",
    "ROWS",
    "Config",
    "describe_config",
    "render_triton",
    "triton_space",
    "unsupported_reason",
]


def triton_space(
    payload: str,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    rules: TritonRules,
) -> list[tuple[Config, float]]:
    """Every configuration worth trying for this operator with a prior score (higher: try
    first); [] when the operator is not of a supported kind (`unsupported_reason` says why)."""
    try:
        kernel = _lower(payload, tuple(inputs), tuple(outputs))
    except Unsupported:
        return []
    return _space(kernel, rules)


def unsupported_reason(
    payload: str,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    rules: TritonRules | None = None,
) -> str | None:
    """Why `triton_space` is empty for this operator on a target of these rules (a phrase for
    logs); None if it is not. Without rules: whether the operator lowers at all."""
    try:
        kernel = _lower(payload, tuple(inputs), tuple(outputs))
    except Unsupported as err:
        return str(err)
    if rules is None or _space(kernel, rules):
        return None
    if rules.ub_bytes is not None:
        smallest = kernel.smallest_footprint(rules)
        return (
            f"the smallest {kernel.family} block needs {smallest} bytes of the unified buffer, "
            f"which holds {rules.ub_bytes}"
        )
    return f"no {kernel.family} configuration suits the rules {rules}"


def render_triton(
    payload: str,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    config: Config,
    rules: TritonRules,
) -> str:
    """The kernel module text for one configuration of `triton_space`."""
    kernel = _lower(payload, tuple(inputs), tuple(outputs))
    if config.get("family") != kernel.family:
        raise ValueError(
            f"configuration of family {config.get('family')!r} for a {kernel.family} operator"
        )
    return kernel.source(config, rules)


def describe_config(config: Config) -> str:
    """A one-line decision text, e.g. "triton matmul BLOCK 64x64x32 GROUP_M 8, 4 warps"."""
    family = str(config.get("family", "?")).removeprefix("triton-")
    if "BLOCK_M" in config:
        blocks = f"{config['BLOCK_M']}x{config['BLOCK_N']}x{config['BLOCK_K']}"
    else:
        blocks = str(config.get("BLOCK", "?"))
    head = f"triton {family} BLOCK {blocks}"
    if "GROUP_M" in config:
        head += f" GROUP_M {config['GROUP_M']}"
    parts = [head]
    if "num_warps" in config:
        parts.append(f"{config['num_warps']} warps")
    if "num_stages" in config:
        parts.append(f"{config['num_stages']} stages")
    if config.get("multibuffer"):
        parts.append("multibuffer")
    return ", ".join(parts)


def _space(kernel: Kernel, rules: TritonRules) -> list[tuple[Config, float]]:
    return sorted(kernel.space(rules), key=lambda pair: -pair[1])


# -- choosing the family -----------------------------------------------------------------------


@lru_cache(maxsize=32)  # the space, each render and the reason all start from the lowering
def _lower(text: str, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]) -> Kernel:
    payload = Payload.parse(text)
    if len(payload.arguments) != len(inputs) or len(payload.results) != len(outputs):
        raise Unsupported("the payload's signature does not match the operator's")
    for op in payload.ops:
        if op.name not in FUNC_LEVEL:
            raise Unsupported(f"{op.name} at function level")
    contractions = [op for op in payload.generics() if contraction_roles(op) is not None]
    if len(contractions) > 1:
        raise Unsupported("more than one contraction")
    if contractions:
        return Matmul(payload, inputs, outputs, contractions[0])
    reductions = [op for op in payload.generics() if "reduction" in iterators(op)]
    if not reductions:
        return Pointwise(payload, inputs, outputs)
    families: list[type[Kernel]] = [Rows, Loops]
    if not all(_reads_rows(op) for op in reductions):
        families.reverse()
    failures = []
    for family in families:
        try:
            return family(payload, inputs, outputs)
        except Unsupported as err:
            failures.append(err)
    raise failures[0]  # the reason of the family the payload suits


def _reads_rows(op: ir.Operation) -> bool:
    """Whether a reduction reads each operand that it reduces along its trailing dims only
    (rows of contiguous elements), not along leading or middle dims or through a window."""
    reduced = {d for d, kind in enumerate(iterators(op)) if kind == "reduction"}
    inputs = len(op.operands) - len(op.results)
    for amap, operand in zip(maps(op)[:inputs], op.operands[:inputs], strict=True):
        if not isinstance(operand.type, ir.ShapedType):
            continue
        if not plain(amap):
            return False
        live = [p for p, n in zip(dim_positions(amap), shape(operand), strict=True) if n != 1]
        along = [p in reduced for p in live if p is not None]
        first = along.index(True) if True in along else len(along)
        if not all(along[first:]):
            return False
    return True
