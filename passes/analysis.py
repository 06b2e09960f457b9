"""What a kernel payload computes, for whoever writes a schedule for it.

`prepare_payload` cleans a linalg payload (unit dimensions folded, elementwise producers
fused, dead results dropped, optionally math approximated) and tags every linalg op with its
index (`kope.op = i`), so that a transform schedule can address each op by
`transform.structured.match attributes{kope.op = i : i64}`. `analyze` reports, per op, its
name, iterator types and static loop ranges, and classifies the whole payload.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from torch_mlir import ir
from torch_mlir.passmanager import PassManager

from kope.passes.abi import function_type
from kope.passes.base import PipelineElement, defining_op
from kope.passes.collapse_dims import CollapseDims
from kope.passes.integer_powers import ExpandPowers
from kope.passes.narrow_f64 import NarrowF64, boundary_has_f64, has_f64
from kope.passes.refine_reshapes import RefineReshapes

OP_ATTR = "kope.op"
CLEANUP = (
    "linalg-fold-unit-extent-dims",
    "canonicalize",
    "cse",
    "linalg-fuse-elementwise-ops",
    # Elementwise fusion propagates reshapes by expanding ops, which can give them unit dims
    # again (a hand-written group norm's last op came out 2x4x8x1x256), and an op with a
    # unit dim the ops around it lack shares no row loop with them.
    "linalg-fold-unit-extent-dims",
    "canonicalize",
    "cse",
)
CONTRACTIONS = {
    "linalg.matmul",
    "linalg.batch_matmul",
    "linalg.matmul_transpose_a",
    "linalg.matmul_transpose_b",
    "linalg.batch_matmul_transpose_a",
    "linalg.batch_matmul_transpose_b",
    "linalg.batch_reduce_matmul",
    "linalg.contract",
    "linalg.mmt4d",
    "linalg.batch_mmt4d",
    "linalg.vecmat",
    "linalg.matvec",
}


@dataclass
class OpInfo:
    """One linalg op of a payload."""

    index: int
    name: str  # e.g. linalg.matmul, linalg.generic
    iterators: list[str]  # "parallel" / "reduction" per loop
    ranges: list[int]  # static trip count per loop (0 if unknown)
    init_producers: list[int] = field(default_factory=list)  # ops whose results are its outs
    is_root: bool = False  # produces the function's (first) result
    # linalg.transpose's: output dim i is input dim permutation[i] (its loops are the output's)
    permutation: list[int] = field(default_factory=list)
    # ops whose results it reads or writes as they are (not through a reshape): the only ones
    # a loop around it can fuse, since fusion follows the slices of its operands
    producers: list[int] = field(default_factory=list)
    # ops whose results it reads, as they are or through reshapes and casts
    reads: list[int] = field(default_factory=list)
    # a result of the function besides the root's (a multi-output op's statistics): fusing
    # such an op into a loop crashes MLIR's fusion, so it is computed on its own
    returned: bool = False
    # a convolution's window strides and dilations, per spatial dim (empty for other ops)
    strides: list[int] = field(default_factory=list)
    dilations: list[int] = field(default_factory=list)

    @property
    def reduction_dims(self) -> list[int]:
        return [i for i, kind in enumerate(self.iterators) if kind == "reduction"]

    @property
    def parallel_dims(self) -> list[int]:
        return [i for i, kind in enumerate(self.iterators) if kind == "parallel"]

    @property
    def is_fill(self) -> bool:
        return self.name == "linalg.fill"


@dataclass(frozen=True)
class PlainMatmul:
    """A payload that is `A @ B` of two `@main` arguments, maybe followed by an elementwise
    epilogue over the product (a bias row, an activation, a gate, a residual): `mm`, `addmm`
    and `linear` as torch-mlir lowers them, and those with the elementwise ops the partitioner
    fuses after them. The form a schedule may rewrite to take B in another layout
    (`kope.vocabulary.layouts`): B is read by the matmul alone."""

    m: int
    k: int
    n: int
    arguments: tuple[str, ...]  # @main's argument types, in order
    a: int  # argument indices
    b: int
    epilogue: int = 0  # all-parallel M x N generics after the matmul


# On a Task's function whose payload is attention's decomposition (`kope.core.task`): what the
# decomposition no longer says plainly, {causal, scale}; the strides of q, k and v where they
# reach it as views of a larger tensor ({q_strides, k_strides, v_strides}, elements; each only
# where it is not contiguous); and `heads_inner` where its output is laid out B x Lq x H x E
# (as ATen's CPU attention writes it, so that the transpose back to B x Lq x H*E is free). A
# kernel family rewrites it whole.
ATTENTION_ATTR = "kope.attention"
_VIEW_MARKS = ("q_strides", "k_strides", "v_strides")


@dataclass(frozen=True)
class Attention:
    """One attention: q B x H x Lq x D, k B x H x Lk x D, v B x H x Lk x E -> B x H x Lq x E,
    and a mask of the scores (added, or where False, -inf) of a shape that broadcasts to
    B x H x Lq x Lk, if there is one."""

    batch: int
    heads: int
    queries: int
    keys: int
    depth: int
    value_depth: int
    causal: bool
    scale: float
    mask: tuple[int, ...] = ()  # its shape; () where there is none
    mask_bool: bool = False
    # q's, k's and v's strides where each arrives as a view of a larger tensor; None: contiguous
    views: tuple[tuple[int, ...] | None, ...] = (None, None, None)
    heads_inner: bool = False  # the output laid out B x Lq x H x E (`heads_inner_strides`)
    kv_heads: int = 0  # k's and v's heads where fewer than q's (grouped: H a multiple); 0: H

    @property
    def group(self) -> int:
        """The query heads that share one head of k and v."""
        return self.heads // self.kv_heads if self.kv_heads else 1

    @property
    def pairs(self) -> int:
        return self.batch * self.heads

    @property
    def mask4(self) -> tuple[int, int, int, int]:
        """The mask's shape with unit dims before it, to rank 4."""
        b, h, q, k = (1,) * (4 - len(self.mask)) + self.mask
        return b, h, q, k


def heads_inner_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides of a B x H x L x E attention output laid out B x L x H x E."""
    _, h, length, e = shape
    return (length * h * e, e, h * e, 1)


def mark_attention(
    payload: str,
    causal: bool,
    scale: float,
    views: Sequence[Sequence[int] | None] = (None, None, None),
    heads_inner: bool = False,
) -> str:
    """The payload with its function marked as attention (`ATTENTION_ATTR`); `views`: the
    strides of q, k and v, for those that reach it as views of a larger tensor; `heads_inner`:
    its output laid out B x Lq x H x E."""
    context = ir.Context()
    context.enable_multithreading(False)
    module = ir.Module.parse(payload, context)
    with context, ir.Location.unknown():
        marks: dict[str, ir.Attribute] = {
            "causal": ir.BoolAttr.get(causal),
            "scale": ir.FloatAttr.get(ir.F64Type.get(), scale),
        }
        for name, strides in zip(_VIEW_MARKS, views, strict=True):
            if strides is not None:
                marks[name] = ir.DenseI64ArrayAttr.get([int(s) for s in strides])
        if heads_inner:
            marks["heads_inner"] = ir.BoolAttr.get(True)
        main_function(module).attributes[ATTENTION_ATTR] = ir.DictAttr.get(marks)
    return module.operation.get_asm(enable_debug_info=False)


def _attention(func: ir.Operation) -> Attention | None:
    """The attention `func` computes, if it is marked as one and takes q, k, v of rank 4
    (f32), and maybe a mask (f32 or i1, rank 1 to 4), to one result."""
    if ATTENTION_ATTR not in func.attributes:
        return None
    marks = ir.DictAttr(func.attributes[ATTENTION_ATTR])
    signature = function_type(func)
    types = [ir.RankedTensorType(t) for t in [*signature.inputs, *signature.results]]
    mask = types.pop(3) if len(types) == 5 else None
    if len(types) != 4 or any(t.rank != 4 or str(t.element_type) != "f32" for t in types):
        return None
    (b, h, lq, d), (_, hk, lk, _), (_, hv, _, e), _ = (t.shape for t in types)
    if hk != hv or h % hk:
        return None
    views = tuple(
        tuple(ir.DenseI64ArrayAttr(marks[name])) if name in marks else None for name in _VIEW_MARKS
    )
    if any(v is not None and (len(v) != 4 or v[-1] != 1) for v in views):
        return None  # the kernel reads each row of q, k and v as vectors
    found = Attention(
        b,
        h,
        lq,
        lk,
        d,
        e,
        ir.BoolAttr(marks["causal"]).value,
        ir.FloatAttr(marks["scale"]).value,
        views=views,
        heads_inner="heads_inner" in marks and ir.BoolAttr(marks["heads_inner"]).value,
        kv_heads=hk if hk != h else 0,
    )
    if mask is None:
        return found
    element = str(mask.element_type)
    shape = tuple(mask.shape)
    if element not in ("f32", "i1") or not 1 <= len(shape) <= 4:
        return None
    attention = dataclasses.replace(found, mask=shape, mask_bool=element == "i1")
    full = (b, h, lq, lk)
    if any(m not in (1, f) for m, f in zip(attention.mask4, full, strict=True)):
        return None
    return attention


@dataclass
class PayloadInfo:
    """The linalg ops of a payload in program order, and what kind of kernel it is."""

    ops: list[OpInfo] = field(default_factory=list)
    kind: str = "elementwise"  # contraction | convolution | reduction | elementwise | attention
    math: set[str] = field(default_factory=set)  # math.* ops in op bodies
    element_type: str = "f32"
    plain_matmul: PlainMatmul | None = None
    # A `tensor.insert_slice` with a stride other than 1 (a transposed convolution's zero
    # insertion). MLIR's whole-function vectorization writes such a slice as if its strides
    # were 1, so a schedule must not vectorize the function around it.
    strided_insert: bool = False
    # f64 intermediates in a function of f32 tensors (torch-mlir's widened variance): a
    # kernel may compute them in f32 (`kope.passes.narrow_f64`).
    wide_f64: bool = False
    attention: Attention | None = None  # a Task marked as attention (`ATTENTION_ATTR`)

    @property
    def root(self) -> OpInfo:
        return next(op for op in self.ops if op.is_root)

    def find(self, names: set[str]) -> OpInfo | None:
        return next((op for op in self.ops if op.name in names), None)


def main_function(module: ir.Module) -> ir.Operation:
    """A payload's function: the module's first `func.func`."""
    for op in module.body.operations:
        if op.operation.name == "func.func":
            return op.operation
    raise ValueError("the payload has no func.func")


def _linalg_ops(func: ir.Operation) -> list[ir.Operation]:
    return [
        op.operation
        for op in func.regions[0].blocks[0].operations
        if op.operation.name.startswith("linalg.")
    ]


def prepare_payload(
    text: str,
    *,
    approximate_math: bool = False,
    narrow_f64: bool = False,
    refine_reshapes: bool = False,
    collapse_dims: bool = False,
) -> str:
    """The payload cleaned up (math approximated, f64 intermediates computed in f32,
    regrouping reshapes refined (`kope.passes.refine_reshapes`) and loops that every operand
    indexes alike collapsed (`kope.passes.collapse_dims`), if asked) with every linalg op
    tagged."""
    cleanup: tuple[PipelineElement, ...] = CLEANUP
    if refine_reshapes:
        at = CLEANUP.index("linalg-fuse-elementwise-ops")
        cleanup = (*CLEANUP[:at], RefineReshapes(), *CLEANUP[at:])
    if collapse_dims:  # after fusion, which would expand the ops again
        cleanup = (*cleanup, CollapseDims(), "canonicalize", "cse")
    prepared, lost_contraction = _prepared(text, cleanup, approximate_math, narrow_f64)
    if lost_contraction:
        # Elementwise fusion propagates a reshape by expanding the ops around it, and a
        # per-row epilogue operand (a 1x1 convolution's bias, 64x1) had it expand the
        # matmul into a 64x1x784 generic that no contraction schedule takes. Unfused, the
        # epilogue stays a chain of generics over the product's M x N.
        unfused = tuple(p for p in cleanup if p != "linalg-fuse-elementwise-ops")
        prepared, _ = _prepared(text, unfused, approximate_math, narrow_f64)
    return prepared


def _prepared(
    text: str, cleanup: tuple[PipelineElement, ...], approximate_math: bool, narrow_f64: bool
) -> tuple[str, bool]:
    """The payload prepared with `cleanup`, and whether that lost its named contractions."""
    context = ir.Context()
    context.enable_multithreading(False)
    module = ir.Module.parse(text, context)
    contracted = any(op.name in CONTRACTIONS for op in _linalg_ops(main_function(module)))
    from kope.passes.pipeline import build_pass_manager

    # Integer powers become multiplications before any schedule vectorizes them: a vector
    # `math.fpowi` has no valid lowering, and a multiply chain vectorizes with the rest.
    elements: list[PipelineElement] = [ExpandPowers(), *cleanup]
    if approximate_math:
        from kope.passes.approximate_math import ApproximateMath

        # After elementwise fusion, where an exp of x minus its row's maximum is one op's
        # body (the approximation then needs no overflow handling), and cleaned up again.
        elements = [*elements, ApproximateMath(), "canonicalize", "cse"]
    if narrow_f64:
        elements = [NarrowF64(), *elements]
    pm = build_pass_manager(elements, context)
    with context:
        pm.run(module.operation)
        _split_shared_empties(main_function(module))
        i64 = ir.IntegerType.get_signless(64)
        ops = _linalg_ops(main_function(module))
        for index, op in enumerate(ops):
            op.attributes[OP_ATTR] = ir.IntegerAttr.get(i64, index)
    lost = contracted and not any(op.name in CONTRACTIONS for op in ops)
    return module.operation.get_asm(enable_debug_info=False), lost


def _split_shared_empties(func: ir.Operation) -> None:
    """Give each use of a `tensor.empty` its own: an empty shared by a producer and the root
    (as CSE leaves it) ties the producer's temporary to the output buffer, which
    bufferization then resolves with a copy per tile."""
    for op in list(func.regions[0].blocks[0].operations):
        op = op.operation
        if op.name != "tensor.empty" or op.operands:
            continue
        uses = list(op.results[0].uses)
        for use in uses[1:]:
            with ir.InsertionPoint(op):
                clone = op.clone()
            use.owner.operands[use.operand_number] = clone.results[0]


def analyze(text: str) -> PayloadInfo:
    """Describe a payload's linalg ops (names from the text, loops from a generalized copy)."""
    context = ir.Context()
    context.enable_multithreading(False)
    module = ir.Module.parse(text, context)
    func = main_function(module)
    originals = _linalg_ops(func)
    names = [op.name for op in originals]
    permutations = [
        list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
        if op.name == "linalg.transpose"
        else []
        for op in originals
    ]
    init_producers = [_init_producers(op, originals) for op in originals]
    producers = [_producers(op, originals) for op in originals]
    reads = [_reads(op, originals) for op in originals]
    root_index = _root_index(func)
    returned = _returned(func, originals)
    math_ops: set[str] = set()
    strided_insert = False
    f64_inside = False

    def collect(op: ir.Operation) -> ir.WalkResult:
        nonlocal strided_insert, f64_inside
        # f64 arithmetic, not an f64 constant truncated where it is used (an epsilon)
        f64_inside |= op.name not in ("func.func", "arith.constant") and any(
            has_f64(r.type) for r in op.results
        )
        if op.name.startswith("math."):
            math_ops.add(op.name)
        if op.name == "tensor.insert_slice":
            strides = ir.DenseI64ArrayAttr(op.attributes["static_strides"])
            strided_insert |= any(stride != 1 for stride in strides)
        return ir.WalkResult.ADVANCE

    func.walk(collect)
    plain_matmul = _plain_matmul(func)  # of the named ops, before they are generalized
    # named ops' attributes
    strides = [_window(op, "strides") for op in _linalg_ops(main_function(module))]
    dilations = [_window(op, "dilations") for op in _linalg_ops(main_function(module))]
    with context:
        PassManager.parse("builtin.module(func.func(linalg-generalize-named-ops))").run(
            module.operation
        )
    wide_f64 = f64_inside and not boundary_has_f64(func)
    info = PayloadInfo(math=math_ops, strided_insert=strided_insert, wide_f64=wide_f64)
    for index, op in enumerate(_linalg_ops(main_function(module))):
        iterators, ranges = _loops(op)
        info.ops.append(
            OpInfo(
                index,
                names[index],
                iterators,
                ranges,
                init_producers[index],
                index == root_index,
                permutations[index],
                producers[index],
                reads[index],
                index in returned and index != root_index,
                strides[index],
                dilations[index],
            )
        )
        if op.results:
            element = op.results[0].type.element_type
            info.element_type = str(element)
    info.attention = _attention(func)
    info.kind = "attention" if info.attention is not None else _classify(info)
    info.plain_matmul = plain_matmul
    return info


def _argument(value: ir.Value) -> int | None:
    return ir.BlockArgument(value).arg_number if isinstance(value, ir.BlockArgument) else None


_MATMUL = ["linalg.fill", "linalg.matmul"]


def _maps(op: ir.Operation) -> list[str]:
    return [str(ir.AffineMapAttr(a).value) for a in ir.ArrayAttr(op.attributes["indexing_maps"])]


# A plain (untransposed) matmul's maps, as linalg.matmul carries them.
_MATMUL_MAPS = [
    "(d0, d1, d2) -> (d0, d2)",
    "(d0, d1, d2) -> (d2, d1)",
    "(d0, d1, d2) -> (d0, d1)",
]


def _plain_matmul(func: ir.Operation) -> PlainMatmul | None:
    """`func` (the payload before generalization) as a `PlainMatmul`, if it is one: a fill,
    `linalg.matmul` of two f32 arguments (no transposing maps) into it, B used by nothing
    else, and after it only all-parallel generics with one M x N result each."""
    ops = _linalg_ops(func)
    if [op.name for op in ops[:2]] != _MATMUL:
        return None
    fill, matmul = ops[0], ops[1]
    a, b = _argument(matmul.operands[0]), _argument(matmul.operands[1])
    maps = _maps(matmul)
    if a is None or b is None or a == b or maps != _MATMUL_MAPS:
        return None
    if defining_op(matmul.operands[2]) != fill or len(list(matmul.operands[1].uses)) != 1:
        return None
    a_type = ir.RankedTensorType(matmul.operands[0].type)
    b_type = ir.RankedTensorType(matmul.operands[1].type)
    if str(a_type.element_type) != "f32" or str(b_type.element_type) != "f32":
        return None
    (m, k), (_, n) = a_type.shape, b_type.shape
    epilogue = ops[2:]
    if not all(_is_epilogue(op, m, n) for op in epilogue):
        return None
    arguments = tuple(str(t) for t in function_type(func).inputs)
    return PlainMatmul(m, k, n, arguments, a, b, len(epilogue))


def _is_epilogue(op: ir.Operation, m: int, n: int) -> bool:
    """Whether `op` is elementwise over an M x N result (a schedule tiles it like the product),
    or over N where M is 1 (its unit row dropped: a linear layer's bias at batch 1)."""
    if op.name != "linalg.generic" or len(op.results) != 1:
        return False
    iterators = [str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
    result = ir.RankedTensorType(op.results[0].type)
    return all("parallel" in i for i in iterators) and (
        (result.shape == [m, n] and _maps(op)[-1] == "(d0, d1) -> (d0, d1)")
        or (m == 1 and result.shape == [n] and _maps(op)[-1] == "(d0) -> (d0)")
    )


def _produced_by(values: Iterable[ir.Value], ops: list[ir.Operation]) -> list[int]:
    """The indices in `ops` of the ops that produce `values`, in the values' order."""
    found = []
    for value in values:
        owner = defining_op(value)
        for index, candidate in enumerate(ops):
            if owner is not None and candidate == owner:
                found.append(index)
    return found


def _init_producers(op: ir.Operation, ops: list[ir.Operation]) -> list[int]:
    return _produced_by(op.operands[len(op.operands) - len(op.results) :], ops)


def _producers(op: ir.Operation, ops: list[ir.Operation]) -> list[int]:
    return _produced_by(op.operands, ops)


def _reads(op: ir.Operation, ops: list[ir.Operation]) -> list[int]:
    found = (_returned_op(value, ops) for value in op.operands)
    return sorted({index for index in found if index is not None})


def _returned_op(value: ir.Value, ops: list[ir.Operation]) -> int | None:
    """The index in `ops` of the linalg op that computes `value` (through reshapes and casts);
    None if the walk reaches an argument or a constant first."""
    while True:
        owner = defining_op(value)
        if owner is None:
            return None
        if owner.name.startswith("linalg."):
            for index, op in enumerate(ops):
                if op == owner:
                    return index
        if not owner.operands:
            return None
        value = owner.operands[0]


def _returns(func: ir.Operation) -> ir.Operation:
    return [op.operation for op in func.regions[0].blocks[0].operations][-1]


def _returned(func: ir.Operation, ops: list[ir.Operation]) -> set[int]:
    """The linalg ops whose results the function returns (through reshapes and casts)."""
    found = (_returned_op(value, ops) for value in _returns(func).operands)
    return {index for index in found if index is not None}


def _root_index(func: ir.Operation) -> int:
    """The linalg op whose (first) result the function returns; the last one if none does."""
    ops = _linalg_ops(func)
    index = _returned_op(_returns(func).operands[0], ops)
    return len(ops) - 1 if index is None else index


def _window(op: ir.Operation, name: str) -> list[int]:
    """A convolution's `strides` or `dilations` attribute as integers; empty where the op
    has none."""
    if name not in op.attributes:
        return []
    return [int(v) for v in ir.DenseIntElementsAttr(op.attributes[name])]


def _loops(op: ir.Operation) -> tuple[list[str], list[int]]:
    if "iterator_types" not in op.attributes:
        return [], []
    iterators = [
        str(a).split("<")[-1].rstrip(">") for a in ir.ArrayAttr(op.attributes["iterator_types"])
    ]
    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    ranges = [0] * len(iterators)
    for operand, amap in zip(op.operands, maps, strict=True):
        if not isinstance(operand.type, ir.ShapedType):
            continue
        for position, expr in enumerate(amap.results):
            if isinstance(expr, ir.AffineDimExpr) and not ranges[expr.position]:
                size = operand.type.shape[position]
                ranges[expr.position] = size if size >= 0 else 0
    return iterators, ranges


def _classify(info: PayloadInfo) -> str:
    names = {op.name for op in info.ops}
    if any("conv" in name for name in names):
        return "convolution"
    if names & CONTRACTIONS:
        return "contraction"
    if any(op.reduction_dims for op in info.ops):
        return "reduction"
    return "elementwise"
