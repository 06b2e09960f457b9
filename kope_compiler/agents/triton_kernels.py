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
the module text (`launch(*inputs, *outputs)` computes the outputs in place). The Triton
target's `capabilities` choose the flavour: `cuda` (a 3-D grid, warps and stages) or `ascend`
(a 1-D grid no larger than the core count, tiles looped inside programs, the block footprint
bounded by the unified buffer). The IR half lives in `kope.agents.triton_lowering`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from functools import lru_cache
from typing import Any

from torch_mlir import ir

from kope.agents.triton_lowering import (
    CASTS,
    FUNC_LEVEL,
    ZERO,
    Index,
    Looped,
    Lowering,
    Payload,
    Scalar,
    Unsupported,
    address,
    delinearize,
    dim_positions,
    iterators,
    linearize,
    maps,
    owner,
    plain,
    ranges,
    shape,
    strip_reshapes,
)
from kope.vocabulary.specs import TensorSpec

Config = dict[str, Any]
POINTWISE, ROWS, MATMUL = "triton-pointwise", "triton-rows", "triton-matmul"
LOOPS = "triton-loops"
MAX_ROW = 16384  # longest row held in one block; longer ones would need a looped reduction
MAX_LOOP = 16384  # most iterations of a reduction looped in one program (few outputs, slow)
HEADER = "import triton\nimport triton.language as tl\n"
UB_BYTES = 196608  # an Ascend unified buffer, when the capabilities do not say


def triton_space(
    payload: str,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    capabilities: dict[str, Any],
) -> list[tuple[Config, float]]:
    """Every configuration worth trying for this operator with a prior score (higher: try
    first); [] when the operator is not of a supported kind (`unsupported_reason` says why)."""
    try:
        kernel = _lower(payload, tuple(inputs), tuple(outputs))
    except Unsupported:
        return []
    return _space(kernel, capabilities)


def unsupported_reason(
    payload: str,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    capabilities: dict[str, Any] | None = None,
) -> str | None:
    """Why `triton_space` is empty for this operator on a target of these capabilities (a
    phrase for logs); None if it is not. Without capabilities: on a CUDA-like target."""
    try:
        kernel = _lower(payload, tuple(inputs), tuple(outputs))
    except Unsupported as err:
        return str(err)
    if capabilities is None or _space(kernel, capabilities):
        return None
    if capabilities.get("flavour", "cuda") == "ascend":
        smallest = kernel.smallest_footprint()
        ub = int(capabilities.get("ub_bytes", UB_BYTES))
        return (
            f"the smallest {kernel.family} block needs {smallest} bytes of the unified buffer, "
            f"which holds {ub}"
        )
    return f"no {kernel.family} configuration suits the capabilities {capabilities}"


def render_triton(
    payload: str,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    config: Config,
    capabilities: dict[str, Any],
) -> str:
    """The kernel module text for one configuration of `triton_space`."""
    kernel = _lower(payload, tuple(inputs), tuple(outputs))
    if config.get("family") != kernel.family:
        raise ValueError(
            f"configuration of family {config.get('family')!r} for a {kernel.family} operator"
        )
    return kernel.source(config, capabilities)


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


def _space(kernel: _Kernel, capabilities: dict[str, Any]) -> list[tuple[Config, float]]:
    ascend = capabilities.get("flavour", "cuda") == "ascend"
    found = kernel.ascend_space(capabilities) if ascend else kernel.cuda_space(capabilities)
    return sorted(found, key=lambda pair: -pair[1])


# -- choosing the family -----------------------------------------------------------------------


@lru_cache(maxsize=32)  # the space, each render and the reason all start from the lowering
def _lower(text: str, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]) -> _Kernel:
    payload = Payload.parse(text)
    if len(payload.arguments) != len(inputs) or len(payload.results) != len(outputs):
        raise Unsupported("the payload's signature does not match the operator's")
    for op in payload.ops:
        if op.name not in FUNC_LEVEL:
            raise Unsupported(f"{op.name} at function level")
    contractions = [op for op in payload.generics() if _roles(op) is not None]
    if len(contractions) > 1:
        raise Unsupported("more than one contraction")
    if contractions:
        return _Matmul(payload, inputs, outputs, contractions[0])
    reductions = [op for op in payload.generics() if "reduction" in iterators(op)]
    if not reductions:
        return _Pointwise(payload, inputs, outputs)
    families: list[type[_Kernel]] = [_Rows, _Loops]
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


def _roles(op: ir.Operation) -> dict[str, list[int]] | None:
    """The batch, m, n and k loops of a multiply-add reduction of two operands that has an M
    and an N loop (a matrix product); None for any other op (a matvec is a row reduction)."""
    kinds = iterators(op)
    if len(op.operands) != 3 or "reduction" not in kinds or not all(map(plain, maps(op))):
        return None
    body = op.regions[0].blocks[0]
    add = owner(list(body.operations)[-1].operands[0])
    if add is None or add.name != "arith.addf" or body.arguments[2] not in list(add.operands):
        return None
    operands = list(add.operands)
    mul = owner(operands[1 - operands.index(body.arguments[2])])
    if mul is None or mul.name != "arith.mulf":
        return None
    sources = []
    for value in mul.operands:
        while (cast := owner(value)) is not None and cast.name in CASTS:
            value = cast.operands[0]
        sources.append(value)
    if sorted(v.arg_number for v in sources if isinstance(v, ir.BlockArgument)) != [0, 1]:
        return None
    pa, pb, pc = (set(dim_positions(m)) - {None} for m in maps(op))
    parallel = {d for d, kind in enumerate(kinds) if kind == "parallel"}
    roles = {
        "batch": sorted(parallel & pa & pb & pc),
        "m": sorted((parallel & pa & pc) - pb),
        "n": sorted((parallel & pb & pc) - pa),
        "k": sorted(set(range(len(kinds))) - parallel),
    }
    if not roles["m"] or not roles["n"]:
        return None
    shapes_ok = all(len(roles[r]) == 1 for r in ("m", "n", "k"))
    if not shapes_ok or (pa | pb | pc) != set(range(len(kinds))) or not parallel <= pc:
        raise Unsupported("a contraction with several M, N or K loops")
    if roles["k"][0] in pc:
        raise Unsupported("a contraction whose result keeps its K loop")
    return roles


# -- shared --------------------------------------------------------------------------------------


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _signature(count_in: int, count_out: int) -> tuple[list[str], list[str]]:
    return [f"x{i}" for i in range(count_in)], [f"out{i}" for i in range(count_out)]


def _launch(kernel: str, grid: str, args: list[str], kwargs: dict[str, Any]) -> str:
    options = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    names = ", ".join(args)
    return f"\n\ndef launch({names}):\n    {kernel}[({grid},)]({names}, {options})\n"


def _indent(lines: list[str], depth: int) -> str:
    return "".join(" " * (4 * depth) + line + "\n" for line in lines)


def _warps(capabilities: dict[str, Any], wanted: int) -> int:
    allowed = [int(w) for w in capabilities.get("num_warps", [4, 8])]
    return min(allowed, key=lambda w: (abs(w - wanted), w))


def _ub_fits(capabilities: dict[str, Any], nbytes: int, multibuffer: bool) -> bool:
    return nbytes * (2 if multibuffer else 1) <= int(capabilities.get("ub_bytes", UB_BYTES))


def _buffering(capabilities: dict[str, Any]) -> list[bool]:
    return [True, False] if capabilities.get("multibuffer", True) else [False]


class _NoSpecials:
    """A frame with neither reductions nor a contraction (pointwise kernels)."""

    def reduction(self, extents: list[int]) -> tuple[list[Index], str]:
        raise Unsupported("a reduction in a pointwise kernel")

    def looped(self, extents: list[int]) -> Looped | None:
        return None

    def contraction(self, op: ir.Operation, idx: tuple[Index, ...]) -> Scalar | None:
        return None


class _LoopFrame(_NoSpecials):
    """Reductions as loops inside each program, accumulating a block of outputs."""

    def looped(self, extents: list[int]) -> Looped | None:
        total = math.prod(extents)
        if total > MAX_LOOP:
            raise Unsupported(f"a looped reduction over {total} elements (longer than {MAX_LOOP})")
        return Looped("[BLOCK]", frozenset({"x"}))


class _Kernel(ABC):
    """A payload lowered for one family; configurations only choose its launch."""

    family = ""

    def __init__(
        self, payload: Payload, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]
    ) -> None:
        self.payload = payload
        self.inputs = inputs
        self.outputs = outputs
        self.names, self.outs = _signature(len(inputs), len(outputs))
        self.float64 = any(s.dtype == "float64" for s in (*inputs, *outputs))
        # Offsets past int32 (with a block's overhang) need 64-bit program coordinates.
        self.large = max(math.prod(s.shape) for s in (*inputs, *outputs)) >= 2**30
        self.wide = ".to(tl.int64)" if self.large else ""
        values = (*payload.arguments, *payload.results)
        for spec, value in zip((*inputs, *outputs), values, strict=True):
            if tuple(spec.shape) != shape(value):
                raise Unsupported(f"a tensor of shape {spec.shape} typed {value.type}")

    def lowering(self, frame: Any) -> Lowering:
        dtypes = [s.dtype for s in self.inputs]
        return Lowering(self.payload, frame, self.names, dtypes, self.float64)

    def store(self, low: Lowering, j: int, idx: tuple[Index, ...], masks: str | None) -> str:
        """The statement storing output `j` evaluated at `idx` (its own coordinates)."""
        value = low.element(self.payload.results[j], idx)
        where = low.offset(idx, tuple(self.outputs[j].shape))
        pointer = self.outs[j] if where == ZERO else f"{self.outs[j]} + {where.code}"
        stored = low.store_value(value, self.outputs[j].dtype)
        return f"tl.store({pointer}, {stored}" + (f", mask={masks})" if masks else ")")

    @abstractmethod
    def cuda_space(self, capabilities: dict[str, Any]) -> list[tuple[Config, float]]:
        """Configurations for a CUDA Triton target, with prior scores."""

    @abstractmethod
    def ascend_space(self, capabilities: dict[str, Any]) -> list[tuple[Config, float]]:
        """Configurations for Triton-Ascend, with prior scores."""

    @abstractmethod
    def source(self, config: Config, capabilities: dict[str, Any]) -> str:
        """The kernel module text for `config`."""

    @abstractmethod
    def smallest_footprint(self) -> int:
        """Bytes of the unified buffer the smallest Ascend block holds, single-buffered."""


# -- pointwise ----------------------------------------------------------------------------------


class _Pointwise(_Kernel):
    """All outputs over one flat block of offsets `offs` (every output has the same size)."""

    family = POINTWISE

    def __init__(
        self, payload: Payload, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]
    ) -> None:
        super().__init__(payload, inputs, outputs)
        sizes = {math.prod(s.shape) for s in outputs}
        if len(sizes) != 1:
            raise Unsupported(f"outputs of different sizes in one {self.family} kernel")
        self.numel = sizes.pop()
        low = self.lowering(self.frame())
        flat = Index("offs", frozenset({"x"}), frozenset({"mask"}))
        self.stores = []
        for j, spec in enumerate(outputs):
            dims = tuple(spec.shape)
            idx = tuple(delinearize(flat, dims))
            low.flat[(idx, dims)] = "offs"
            self.stores.append(self.store(low, j, idx, "mask"))
        self.body = low.lines
        self.tiles = low.vector_loads[0] + len(outputs) + 1  # blocks live at once, roughly

    def frame(self) -> _NoSpecials:
        return _NoSpecials()

    def smallest_footprint(self) -> int:
        return min(256, max(64, _pow2(self.numel))) * 4 * self.tiles

    def cuda_space(self, capabilities: dict[str, Any]) -> list[tuple[Config, float]]:
        cap = max(64, _pow2(self.numel))
        target = min(1024, cap)
        found = []
        for block in sorted({min(b, cap) for b in (256, 512, 1024, 2048)}):
            for warps in sorted({int(w) for w in capabilities.get("num_warps", [4, 8])}):
                score = -abs(math.log2(block / target))
                score += 0.5 if warps == (4 if block <= 1024 else 8) else 0.0
                found.append(({"family": POINTWISE, "BLOCK": block, "num_warps": warps}, score))
        return found

    def ascend_space(self, capabilities: dict[str, Any]) -> list[tuple[Config, float]]:
        programs = int(capabilities.get("max_programs", 40))
        cap = max(64, _pow2(self.numel))
        target = max(64, _pow2(math.ceil(self.numel / programs)))
        found = []
        for block in sorted({min(b, cap) for b in (256, 512, 1024, 2048, 4096, 8192, 16384)}):
            for buffered in _buffering(capabilities):
                if not _ub_fits(capabilities, block * 4 * self.tiles, buffered):
                    continue
                score = -abs(math.log2(block / min(target, 8192))) + (0.5 if buffered else 0.0)
                config = {"family": POINTWISE, "BLOCK": block, "multibuffer": buffered}
                found.append((config, score))
        return found

    def source(self, config: Config, capabilities: dict[str, Any]) -> str:
        block = int(config["BLOCK"])
        tiles = math.ceil(self.numel / block)
        wide = self.wide
        params = ", ".join([*self.names, *self.outs, "BLOCK: tl.constexpr"])
        body = [f"mask = offs < {self.numel}", *self.body, *self.stores]
        kernel = "_kope_" + self.family.removeprefix("triton-")
        text = HEADER + f"\n\n@triton.jit\ndef {kernel}({params}):\n"
        if capabilities.get("flavour", "cuda") == "ascend":
            programs = min(tiles, int(capabilities.get("max_programs", 40)))
            text += f"    for tile in range(tl.program_id(0), {tiles}, {programs}):\n"
            text += _indent([f"offs = tile{wide} * BLOCK + tl.arange(0, BLOCK)", *body], 2)
            grid, kwargs = str(programs), {"BLOCK": block}
        else:
            text += _indent([f"offs = tl.program_id(0){wide} * BLOCK + tl.arange(0, BLOCK)"], 1)
            text += _indent(body, 1)
            grid, kwargs = f"triton.cdiv({self.numel}, {block})", {"BLOCK": block}
            kwargs["num_warps"] = int(config.get("num_warps", 4))
        return text + _launch(kernel, grid, [*self.names, *self.outs], kwargs)


# -- loops ---------------------------------------------------------------------------------------


class _Loops(_Pointwise):
    """A block of output offsets per program, as the pointwise family; each reduction is its
    body run over the reduced loops inside the program, a block of accumulators at a time."""

    family = LOOPS
    BLOCKS = (128, 256, 512, 1024)  # from one element per thread of 4 warps

    def frame(self) -> _NoSpecials:
        return _LoopFrame()

    def smallest_footprint(self) -> int:
        return self.blocks()[0] * 4 * self.tiles

    def blocks(self) -> list[int]:
        cap = max(16, _pow2(self.numel))
        return sorted({min(b, cap) for b in self.BLOCKS})

    def cuda_space(self, capabilities: dict[str, Any]) -> list[tuple[Config, float]]:
        # Each program loops over the reduction: blocks of 128-256 outputs keep enough programs
        # for the multiprocessors on small feature maps and coalesce the loads along the rows.
        machines = int(capabilities.get("multiprocessors", 100))
        target = min(256, max(32, _pow2(math.ceil(self.numel / (2 * machines)))))
        found = []
        for block in self.blocks():
            for warps in sorted({int(w) for w in capabilities.get("num_warps", [4, 8])}):
                score = -abs(math.log2(block / target))
                score += 0.5 if warps == (4 if block <= 512 else 8) else 0.0
                found.append(({"family": LOOPS, "BLOCK": block, "num_warps": warps}, score))
        return found

    def ascend_space(self, capabilities: dict[str, Any]) -> list[tuple[Config, float]]:
        programs = int(capabilities.get("max_programs", 40))
        target = max(16, _pow2(math.ceil(self.numel / programs)))
        found = []
        for block in self.blocks():
            for buffered in _buffering(capabilities):
                if not _ub_fits(capabilities, block * 4 * self.tiles, buffered):
                    continue
                score = -abs(math.log2(block / min(target, 1024))) + (0.5 if buffered else 0.0)
                config = {"family": LOOPS, "BLOCK": block, "multibuffer": buffered}
                found.append((config, score))
        return found


# -- rows ----------------------------------------------------------------------------------------


class _RowFrame:
    """Reductions over the block `cols`: every reduced loop nest is flattened into it."""

    def __init__(self) -> None:
        self.extents: set[int] = set()

    def mask(self, extent: int) -> str:
        self.extents.add(extent)
        return f"cmask{extent}"

    def reduction(self, extents: list[int]) -> tuple[list[Index], str]:
        total = math.prod(extents)
        if total > MAX_ROW:
            raise Unsupported(f"a reduction over {total} elements (longer than {MAX_ROW})")
        mask = self.mask(total)
        cols = Index("cols", frozenset({"c"}), frozenset({mask}))
        return delinearize(cols, extents), mask

    def looped(self, extents: list[int]) -> Looped | None:
        return None

    def contraction(self, op: ir.Operation, idx: tuple[Index, ...]) -> Scalar | None:
        return None


class _Rows(_Kernel):
    """One program per row: each output's leading dims are the row, the rest the block."""

    family = ROWS

    def __init__(
        self, payload: Payload, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]
    ) -> None:
        super().__init__(payload, inputs, outputs)
        failure = Unsupported("outputs with no common number of rows")
        # The split of each output into row and block dims is the one with the widest block
        # whose values can be computed: a reduction's own rows may not lie along the block.
        # The last split tried (one element per row) fails only for a reason of its own.
        for split in _splits(outputs):
            try:
                self._build(split)
                return
            except Unsupported as err:
                failure = err
        raise failure

    def _build(self, split: list[int]) -> None:
        frame = _RowFrame()
        low = self.lowering(frame)
        self.stores: list[str] = []
        self.rows = math.prod(self.outputs[0].shape[: split[0]])
        for j, spec in enumerate(self.outputs):
            dims = tuple(spec.shape)
            row_dims, col_dims = dims[: split[j]], dims[split[j] :]
            width = math.prod(col_dims)
            if width > MAX_ROW:
                raise Unsupported(f"rows of {width} elements (longer than {MAX_ROW})")
            masks = frozenset({frame.mask(width)}) if width > 1 else frozenset()
            cols = Index("cols", frozenset({"c"}) if width > 1 else frozenset(), masks)
            idx = (*delinearize(Index("row"), row_dims), *delinearize(cols, col_dims))
            if width == 1 and self.rows > 1:
                low.flat[(idx, dims)] = "row"
            elif width > 1:
                low.flat[(idx, dims)] = "cols" if self.rows == 1 else f"row * {width} + cols"
            self.stores.append(self.store(low, j, idx, next(iter(masks), None)))
        self.body = low.lines
        self.block = max(16, _pow2(max(frame.extents, default=1)))
        self.masks = [f"cmask{e} = cols < {e}" for e in sorted(frame.extents)]
        self.tiles = low.vector_loads[0] + len(self.outputs) + 2

    def cuda_space(self, capabilities: dict[str, Any]) -> list[tuple[Config, float]]:
        wanted = 4 if self.block <= 2048 else 8
        found = []
        for warps in sorted({int(w) for w in capabilities.get("num_warps", [4, 8])}):
            score = 1.0 if warps == _warps(capabilities, wanted) else 0.0
            found.append(({"family": ROWS, "BLOCK": self.block, "num_warps": warps}, score))
        return found

    def smallest_footprint(self) -> int:
        return self.block * 4 * self.tiles

    def ascend_space(self, capabilities: dict[str, Any]) -> list[tuple[Config, float]]:
        found = []
        for buffered in _buffering(capabilities):
            if _ub_fits(capabilities, self.block * 4 * self.tiles, buffered):
                config = {"family": ROWS, "BLOCK": self.block, "multibuffer": buffered}
                found.append((config, 0.5 if buffered else 0.0))
        return found

    def source(self, config: Config, capabilities: dict[str, Any]) -> str:
        block = int(config["BLOCK"])
        if block < self.block:
            raise ValueError(f"BLOCK {block} is shorter than the rows ({self.block})")
        params = ", ".join([*self.names, *self.outs, "BLOCK: tl.constexpr"])
        text = HEADER + f"\n\n@triton.jit\ndef _kope_rows({params}):\n"
        text += _indent(["cols = tl.arange(0, BLOCK)", *self.masks], 1)
        body = [*self.body, *self.stores]
        if capabilities.get("flavour", "cuda") == "ascend":
            programs = min(self.rows, int(capabilities.get("max_programs", 40)))
            text += f"    for tile in range(tl.program_id(0), {self.rows}, {programs}):\n"
            text += _indent([f"row = tile{self.wide}", *body], 2)
            grid, kwargs = str(programs), {"BLOCK": block}
        else:
            text += _indent([f"row = tl.program_id(0){self.wide}", *body], 1)
            grid = str(self.rows)
            kwargs = {"BLOCK": block, "num_warps": int(config.get("num_warps", 4))}
        return text + _launch("_kope_rows", grid, [*self.names, *self.outs], kwargs)


def _splits(outputs: tuple[TensorSpec, ...]) -> list[list[int]]:
    """Per output, how many leading dims are the row: widest blocks first, and all outputs
    with the same number of rows (one program computes a row of each)."""
    first = outputs[0].shape
    found = []
    for cut in range(len(first) + 1):
        rows = math.prod(first[:cut])
        split = [cut]
        for spec in outputs[1:]:
            cuts = [c for c in range(len(spec.shape) + 1) if math.prod(spec.shape[:c]) == rows]
            if not cuts:
                break
            split.append(cuts[0])
        else:
            found.append(split)
    return found


# -- matmul --------------------------------------------------------------------------------------


class _MatmulFrame:
    """The contraction's result is the accumulator, read at the tile's own coordinates."""

    def __init__(self, op: ir.Operation, idx: tuple[Index, ...]) -> None:
        self.op = op
        self.idx = idx

    def reduction(self, extents: list[int]) -> tuple[list[Index], str]:
        raise Unsupported("a reduction besides the contraction")

    def looped(self, extents: list[int]) -> Looped | None:
        return None

    def contraction(self, op: ir.Operation, idx: tuple[Index, ...]) -> Scalar | None:
        if op != self.op:
            return None
        if idx != self.idx:
            raise Unsupported("an epilogue that reads the product at other coordinates")
        kind = str(ir.ShapedType(op.results[0].type).element_type)
        return Scalar("acc", kind, frozenset({"m", "n"}))


M_TILE = Index("offs_m[:, None]", frozenset({"m"}), frozenset({"mask_m"}))
N_TILE = Index("offs_n[None, :]", frozenset({"n"}), frozenset({"mask_n"}))
K_OF_A = Index("ks[None, :]", frozenset({"k"}), frozenset({"mask_ka"}))
K_OF_B = Index("ks[:, None]", frozenset({"k"}), frozenset({"mask_kb"}))
# Inductor's mm configurations, best first for large problems: (M, N, K, stages, warps, prior)
CUDA_TILES = [
    (64, 64, 32, 3, 4, 3.0),
    (128, 64, 32, 3, 4, 2.8),
    (64, 128, 32, 3, 4, 2.6),
    (128, 128, 32, 3, 8, 2.4),
    (64, 64, 64, 3, 8, 2.0),
    (128, 128, 64, 3, 8, 1.8),
    (32, 32, 32, 2, 4, 1.5),
    (64, 32, 32, 4, 4, 1.2),
]
ASCEND_TILES = [
    (128, 128, 64, 3.0),
    (128, 128, 32, 2.8),
    (128, 64, 64, 2.5),
    (64, 128, 64, 2.5),
    (64, 64, 64, 2.0),
    (64, 64, 128, 1.5),
    (32, 32, 64, 1.0),
]


class _Matmul(_Kernel):
    """C[b, m, n] = sum_k A[b, m, k] B[b, k, n] as tl.dot tiles, then the epilogue."""

    family = MATMUL

    def __init__(
        self,
        payload: Payload,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
        op: ir.Operation,
    ) -> None:
        super().__init__(payload, inputs, outputs)
        if len(outputs) != 1:
            raise Unsupported("a contraction with several outputs")
        roles = _roles(op)
        assert roles is not None
        loops = ranges(op)
        (m,), (n,), (k,) = roles["m"], roles["n"], roles["k"]
        self.m, self.n, self.k = loops[m], loops[n], loops[k]
        self.batch = math.prod(loops[d] for d in roles["batch"])
        batch = delinearize(Index("batch"), [loops[d] for d in roles["batch"]])
        tile = [ZERO] * len(loops)
        for d, index in zip(roles["batch"], batch, strict=True):
            tile[d] = index
        tile[m], tile[n] = M_TILE, N_TILE
        maps_ = maps(op)
        result = address(maps_[2], tile)
        root = strip_reshapes(payload.results[0])
        if shape(root) != shape(op.results[0]):
            raise Unsupported("an epilogue that changes the product's shape")
        low = self.lowering(_MatmulFrame(op, result))
        inner = low.child()
        self.operands = []
        for i, k_index in ((0, K_OF_A), (1, K_OF_B)):
            tile[k] = k_index
            where = address(maps_[i], tile)
            value = inner.element(op.operands[i], where, raw=True)
            source = strip_reshapes(op.operands[i])
            dtype = inputs[source.arg_number].dtype if payload.is_argument(source) else ""
            if dtype == "float64" or (not dtype and low.f64 == "f64"):
                raise Unsupported("a float64 contraction")
            code = value.code
            if not dtype:  # a computed operand: lanes past the edges must not add
                masks = " & ".join(sorted(frozenset().union(*(x.masks for x in where))))
                code = inner.emit(f"tl.where({masks}, {code}, 0.0)", value.type, value.axes).code
            self.operands.append((code, dtype or "float32"))
        self.loop = inner.lines
        init = low.element(op.operands[2], result)
        if not (init.literal and init.value == 0):
            low.lines.append(f"acc = acc + {low.tensor_of(init)}")
        self.stores = [self.store_root(low, root, result)]
        self.body = low.lines
        self.itemsize = [4 if d == "float32" else 2 for _, d in self.operands]

    def store_root(self, low: Lowering, root: ir.Value, idx: tuple[Index, ...]) -> str:
        value = low.element(root, idx)
        where = linearize(idx, shape(root))
        stored = low.store_value(value, self.outputs[0].dtype)
        return f"tl.store(out0 + {where.code}, {stored}, mask=mask_m & mask_n)"

    def clamp(self, bm: int, bn: int, bk: int) -> tuple[int, int, int]:
        """Blocks no larger than the problem needs, and at least 16 (tl.dot's minimum)."""
        return (
            max(16, min(bm, _pow2(self.m))),
            max(16, min(bn, _pow2(self.n))),
            max(16, min(bk, _pow2(self.k))),
        )

    def waste(self, bm: int, bn: int) -> float:
        padded = math.ceil(self.m / bm) * bm * math.ceil(self.n / bn) * bn
        return math.log2(padded / (self.m * self.n))

    def cuda_space(self, capabilities: dict[str, Any]) -> list[tuple[Config, float]]:
        stages = [int(s) for s in capabilities.get("num_stages", [2, 3, 4])]
        found: dict[str, tuple[Config, float]] = {}
        for bm, bn, bk, s, w, prior in CUDA_TILES:
            bm, bn, bk = self.clamp(bm, bn, bk)
            config = {
                "family": MATMUL,
                "BLOCK_M": bm,
                "BLOCK_N": bn,
                "BLOCK_K": bk,
                "GROUP_M": 8,
                "num_warps": _warps(capabilities, w),
                "num_stages": min(stages, key=lambda x: (abs(x - s), x)),
            }
            key = repr(sorted(config.items()))
            score = prior - 1.5 * self.waste(bm, bn)
            if key not in found or found[key][1] < score:
                found[key] = (config, score)
        return list(found.values())

    def footprint(self, bm: int, bn: int, bk: int) -> int:
        ea, eb = self.itemsize
        return bm * bk * ea + bk * bn * eb + bm * bn * 4

    def smallest_footprint(self) -> int:
        return min(self.footprint(*self.clamp(bm, bn, bk)) for bm, bn, bk, _ in ASCEND_TILES)

    def ascend_space(self, capabilities: dict[str, Any]) -> list[tuple[Config, float]]:
        found: dict[str, tuple[Config, float]] = {}
        for bm, bn, bk, prior in ASCEND_TILES:
            bm, bn, bk = self.clamp(bm, bn, bk)
            nbytes = self.footprint(bm, bn, bk)
            for buffered in _buffering(capabilities):
                if not _ub_fits(capabilities, nbytes, buffered):
                    continue
                config = {
                    "family": MATMUL,
                    "BLOCK_M": bm,
                    "BLOCK_N": bn,
                    "BLOCK_K": bk,
                    "multibuffer": buffered,
                }
                key = repr(sorted(config.items()))
                score = prior - 1.5 * self.waste(bm, bn) + (0.5 if buffered else 0.0)
                if key not in found or found[key][1] < score:
                    found[key] = (config, score)
        return list(found.values())

    def source(self, config: Config, capabilities: dict[str, Any]) -> str:
        bm, bn, bk = (int(config[k]) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
        grid_m, grid_n = math.ceil(self.m / bm), math.ceil(self.n / bn)
        ascend = capabilities.get("flavour", "cuda") == "ascend"
        (a, ta), (b, tb) = self.operands
        if ta != tb or ta == "float32":
            a, b = (f"{x}.to(tl.float32)" if t != "float32" else x for x, t in self.operands)
        precision = "tf32" if capabilities.get("allow_tf32") else "ieee"
        extra = f', input_precision="{precision}"' if ta == tb == "float32" or ta != tb else ""
        loop = [
            "ks = k0 + offs_k",
            f"mask_ka = ks[None, :] < {self.k}",
            f"mask_kb = ks[:, None] < {self.k}",
            *self.loop,
            f"acc = tl.dot({a}, {b}, acc{extra})",
        ]
        tile = [
            f"offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)){self.wide}",
            f"offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)){self.wide}",
            "offs_k = tl.arange(0, BLOCK_K)",
            f"mask_m = offs_m[:, None] < {self.m}",
            f"mask_n = offs_n[None, :] < {self.n}",
            "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
            f"for k0 in range(0, {self.k}, BLOCK_K):",
            *("    " + line for line in loop),
            *self.body,
            *self.stores,
        ]
        constexprs = ["BLOCK_M", "BLOCK_N", "BLOCK_K"] + ([] if ascend else ["GROUP_M"])
        params = [*self.names, *self.outs, *(f"{c}: tl.constexpr" for c in constexprs)]
        text = HEADER + f"\n\n@triton.jit\ndef _kope_matmul({', '.join(params)}):\n"
        kwargs: dict[str, Any] = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
        tiles = grid_m * grid_n
        if ascend:
            total = tiles * self.batch
            programs = min(total, int(capabilities.get("ai_cores", 20)))
            text += f"    for tile in range(tl.program_id(0), {total}, {programs}):\n"
            order = [
                f"batch = (tile // {tiles}){self.wide}",
                f"pid_m = (tile // {grid_n}) % {grid_m}",
                f"pid_n = tile % {grid_n}",
            ]
            text += _indent([*order, *tile], 2)
            grid = str(programs)
        else:
            # Grouped order (inductor's and the Triton tutorial's): GROUP_M row tiles share
            # their column tiles of B while those are still in L2.
            order = [
                "pid = tl.program_id(0)",
                f"batch = tl.program_id(1){self.wide}",
                f"width = GROUP_M * {grid_n}",
                "first_m = (pid // width) * GROUP_M",
                f"group_m = tl.minimum({grid_m} - first_m, GROUP_M)",
                "pid_m = first_m + (pid % width) % group_m",
                "pid_n = (pid % width) // group_m",
            ]
            text += _indent([*order, *tile], 1)
            grid = f"{tiles}, {self.batch}"
            kwargs["GROUP_M"] = int(config.get("GROUP_M", 8))
            kwargs["num_warps"] = int(config.get("num_warps", 4))
            kwargs["num_stages"] = int(config.get("num_stages", 3))
        return text + _launch("_kope_matmul", grid, [*self.names, *self.outs], kwargs)
