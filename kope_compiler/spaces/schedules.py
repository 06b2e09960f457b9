"""CPU schedules as transform-dialect scripts, generated from a few decisions per kernel family.

A `Config` is a point of the search space (plain data: it is recorded with every attempt).
`render` turns a config and a payload's analysis into a `@__transform_main` script that
addresses the payload's ops by their `kope.op` index (see `kope.passes.analysis`).

Families:
- `contraction` (matmul, batch matmul, and their elementwise consumers such as a bias add):
  threads over an outer dimension (`scf.forall`, run by OpenMP), cache tiles, register tiles
  with the k-loop innermost (unrolled by the register tile's k), the accumulator tile hoisted
  into registers, contractions lowered to outer products (FMAs); a contraction that is the
  result has the rows and columns its register tile leaves over split off as products of
  their own, each tiled statically (or, where k is ragged or threads split the columns, is
  padded to whole register tiles); other tiles that do not divide the shape are vectorized
  with masks. With `pack`, a plain matmul (plus an elementwise epilogue: bias,
  activation, gate, residual) takes B in panels of the register tile's width, packed once
  per weight by the caller (`packed_kernel`).
- `rows` (reductions and elementwise ops over rows: softmax, layer norm, sums, maxima,
  elementwise chains): threads over row blocks, all producers fused into a per-row loop so a
  row stays in cache across ops, each op vectorized along the row.
- `conv` (2-D convolutions, NCHW/FCHW): threads over output channels, tiles of output
  channels x output columns (x input channels), the 3x3 window decomposed into 1-D
  convolutions, which vectorize into outer products along the output row.
- `depthwise` (depthwise 2-D convolutions, NCHW/CHW, groups = channels): threads over
  channels, tiles of channels x output columns, the window decomposed into 1-D depthwise
  convolutions and those into one multiply-add per window column (the vectorizer has no
  NCW depthwise form), which vectorize along the output row.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

from torch_mlir import ir
from torch_mlir.passmanager import PassManager

from kope.passes.analysis import (
    CONTRACTIONS,
    OP_ATTR,
    OpInfo,
    PayloadInfo,
    PlainMatmul,
    main_function,
)
from kope.vocabulary.layouts import LAYOUT_ATTR, panels

Config = dict[str, Any]


#: A rows configuration over the payload prepared with its regrouping reshapes refined
#: (`kope-refine-reshapes`, `prepare_payload(refine_reshapes=True)`): a group norm's
#: statistics and its epilogue in one row loop, over vectors as long as the refined last dim.
REGROUP = "regroup"
#: A rows configuration over the payload prepared with each op's innermost loops that its
#: operands index alike collapsed into one (`kope-collapse-dims`, `prepare_payload(
#: collapse_dims=True)`): a SiLU over 8x64x7x7 vectorized over 25088 floats, not rows of 7.
COLLAPSE = "collapse_dims"


def config_key(config: Config | list[Any]) -> str:
    """A configuration (or one list-valued decision of it) as canonical JSON."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def describe(config: Config) -> str:
    """A one-line decision text (what the schedule does), e.g. for memory and reports."""
    family = config.get("family", "?")
    parts = [family]
    if config.get("threads", 1) > 1:
        parts.append(f"{config['threads']} threads")
    if family == "contraction":
        parts.append("cache " + "x".join(map(str, config["cache"])))
        parts.append("registers " + "x".join(map(str, config["register"])))
        if config.get("pack"):
            parts.append(f"B packed in panels of {config['register'][1]}")
    elif family == "rows":
        parts.append(f"{config['rows']} rows/step, vectors of {config['vector']}")
    elif family == "depthwise" and config.get("algorithm") == "rows":
        parts.append(
            f"blocks of {config['rows']} output rows x {config['columns']} columns in "
            f"registers, vectors of {config['vector']}, each input row read once per window "
            "column"
        )
    elif family == "depthwise":
        parts.append(
            f"tiles {config['channels']} channels x {config['columns']} columns, "
            "1-D decomposition, one multiply-add per window column"
            + (", vectors along the row" if config.get("columns_inner") else "")
        )
    elif family == "conv" and config.get("algorithm") == "im2col":
        mr, nr, kr = config["register"]
        parts.append(
            f"im2col: the windows' columns in panels of {nr}, each cache block written just "
            f"before one product reads it in {mr}x{nr} register tiles, cache "
            + "x".join(map(str, config["cache"]))
        )
    elif family == "conv":
        parts.append(
            f"tiles {config['channels']} out-channels x {config['columns']} columns "
            f"x {config['inputs']} in-channels, 1-D decomposition"
        )
    elif family == "attention":
        parts.append(
            f"blocks of {config['rows']} query rows, scores {config['keys']} vectors of keys "
            f"at a time, values {config['values']} vectors at a time, vectors of "
            f"{config['vector']}, scores in cache"
        )
    elif family == "transpose":
        reads, writes = config["tile"]
        parts.append(
            f"tiles of {reads} input rows x {writes} output columns, "
            f"{config['lowering']} register transposes"
        )
    if config.get("approximate_math"):
        parts.append("polynomial math")
    if config.get("narrow_f64"):
        parts.append("f64 intermediates in f32")
    if config.get(REGROUP):
        parts.append("reshapes regrouped")
    if config.get(COLLAPSE):
        parts.append("inner loops collapsed")
    return ", ".join(parts)


@dataclass
class Script:
    """Builds a transform script line by line with fresh handle names."""

    lines: list[str] = field(default_factory=list)
    counter: int = 0
    # False where the payload holds a strided insert_slice (`PayloadInfo.strided_insert`):
    # then only the tiles a schedule vectorizes explicitly are vectors, the rest stays loops.
    vectorize_all: bool = True
    peeled: bool = False  # a loop was peeled: its tiles are static once canonicalized

    @classmethod
    def of(cls, info: PayloadInfo) -> Script:
        return cls(vectorize_all=not info.strided_insert)

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"%{prefix}{self.counter}"

    def emit(self, line: str) -> None:
        self.lines.append(line)

    def match_op(self, index: int) -> str:
        handle = self.fresh("op")
        self.emit(
            f"{handle} = transform.structured.match attributes{{kope.op = {index} : i64}} "
            "in %root : (!transform.any_op) -> !transform.any_op"
        )
        return handle

    def match_marked(self, op_name: str, marker: str) -> str:
        """The payload's `op_name` ops that carry the unit attribute `marker`."""
        handle = self.fresh("op")
        self.emit(
            f'{handle} = transform.structured.match ops{{["{op_name}"]}} attributes{{{marker}}} '
            "in %root : (!transform.any_op) -> !transform.any_op"
        )
        return handle

    def tile_forall(self, handle: str, sizes: list[int]) -> tuple[str, str]:
        tiled, loop = self.fresh("t"), self.fresh("forall")
        self.emit(
            f"{tiled}, {loop} = transform.structured.tile_using_forall {handle} tile_sizes "
            f"{_list(sizes)} : (!transform.any_op) -> (!transform.any_op, !transform.any_op)"
        )
        return tiled, loop

    def tile_for(self, handle: str, sizes: list[int]) -> tuple[str, list[str]]:
        loops = sum(1 for s in sizes if s)
        tiled = self.fresh("t")
        names = [self.fresh("loop") for _ in range(loops)]
        results = ", ".join([tiled, *names])
        types = ", ".join(["!transform.any_op"] * (loops + 1))
        self.emit(
            f"{results} = transform.structured.tile_using_for {handle} tile_sizes "
            f"{_list(sizes)} : (!transform.any_op) -> ({types})"
        )
        return tiled, names

    def peel(self, loop: str) -> None:
        """Split a tiled loop whose tile does not divide its range into the full tiles and one
        static partial tile: a tile of dynamic size (`affine.min`) is not vectorized at all,
        so an op whose row the vector tile does not divide stayed scalar loops (a 37x1001
        softmax ran at 0.47x eager, a 128x100 log-softmax at 0.23x)."""
        cast = self.fresh("for")
        self.emit(f'{cast} = transform.cast {loop} : !transform.any_op to !transform.op<"scf.for">')
        self.emit(
            f"{self.fresh('main')}, {self.fresh('rest')} = transform.loop.peel {cast} "
            ': (!transform.op<"scf.for">) -> (!transform.any_op, !transform.any_op)'
        )
        self.peeled = True

    def split(self, handle: str, dim: int, at: int) -> tuple[str, str]:
        """Split the op `handle` along loop `dim` at `at`: handles of the part below and
        above (a product's rows or columns that its register tile leaves over)."""
        parts, low, high = self.fresh("parts"), self.fresh("low"), self.fresh("high")
        self.emit(
            f"{parts} = transform.structured.split {handle} after {at} "
            f"{{dimension = {dim}}} : !transform.any_op"
        )
        self.emit(
            f"{low}, {high} = transform.split_handle {parts} : "
            "(!transform.any_op) -> (!transform.any_op, !transform.any_op)"
        )
        return low, high

    def fuse_into(self, handle: str, loop: str) -> tuple[str, str]:
        fused, new_loop = self.fresh("fused"), self.fresh("in")
        self.emit(
            f"{fused}, {new_loop} = transform.structured.fuse_into_containing_op {handle} "
            f"into {loop} : (!transform.any_op, !transform.any_op) -> "
            "(!transform.any_op, !transform.any_op)"
        )
        return fused, new_loop

    def vectorize(self, handle: str, sizes: list[int]) -> None:
        self.emit(
            f"transform.structured.vectorize {handle} vector_sizes {_list(sizes)} "
            ": !transform.any_op"
        )

    def parent_function(self, handle: str) -> str:
        """The payload function around `handle` (the kernel module may hold other functions)."""
        func = self.fresh("func")
        self.emit(
            f'{func} = transform.get_parent_op {handle} {{op_name = "func.func"}} '
            ": (!transform.any_op) -> !transform.any_op"
        )
        return func

    def vectorize_function(
        self,
        contraction_lowering: str | None = None,
        *,
        drop_unit_dims: bool = False,
        form_contractions: bool = False,
        contract_reductions: bool = True,
    ) -> None:
        """Vectorize the function's remaining ops (unless `vectorize_all` is off: its tiles
        were vectorized one by one) and lower its vectors. `form_contractions`, with
        `vectorize_all` off: first what vectorizing the children would do besides, short of
        vectorizing the slices that put tiles back. Reductions of products become
        contractions (for the outer-product lowering), and slices fold into the transfers
        that read them. `contract_reductions` off keeps a reduction of a product (a sum of
        squares) a multi-reduction, which flattens into one vector reduction; as a
        contraction it was reduced a row of the vector at a time."""
        func, vec = self.fresh("func"), self.fresh("vec")
        self.emit(
            f'{func} = transform.structured.match ops{{["func.func"]}} in %root '
            ": (!transform.any_op) -> !transform.any_op"
        )
        if self.peeled:  # a peeled tile's sizes are constants, its types not yet static
            self.emit(
                f"transform.apply_patterns to {func} {{\n"
                "    transform.apply_patterns.canonicalization\n"
                "  } : !transform.any_op"
            )
        if self.vectorize_all:
            keep = "" if contract_reductions else " {disable_multi_reduction_to_contract_patterns}"
            self.emit(
                f"{vec} = transform.structured.vectorize_children_and_apply_patterns {func}"
                f"{keep} : (!transform.any_op) -> !transform.any_op"
            )
        else:
            vec = func
            if form_contractions:
                forming = [
                    "vector.reduction_to_contract",
                    "vector.transfer_permutation_patterns",
                    "tensor.fold_tensor_subset_ops_into_vector_transfers",
                    "canonicalization",
                ]
                self.emit(
                    f"transform.apply_patterns to {func} {{\n    "
                    + "\n    ".join(f"transform.apply_patterns.{p}" for p in forming)
                    + "\n  } : !transform.any_op"
                )
        patterns = [
            "transform.apply_patterns.vector.lower_masked_transfers",
            "transform.apply_patterns.vector.transfer_permutation_patterns",
            *(
                f'transform.apply_patterns.vector.{pattern} lowering_strategy = "innerreduction"'
                for pattern in (
                    "reorder_multi_reduction_dims",
                    "multi_reduction_flattening",
                    "multi_reduction_unrolling",
                )
            ),
            "transform.apply_patterns.canonicalization",
        ]
        if contraction_lowering:
            patterns.insert(
                0,
                "transform.apply_patterns.vector.lower_contraction "
                f'lowering_strategy = "{contraction_lowering}"',
            )
        if drop_unit_dims:  # a register tile with a unit loop (a panel) contracts as 2-D
            patterns[:0] = [
                "transform.apply_patterns.vector.cast_away_vector_leading_one_dim",
                "transform.apply_patterns.vector.drop_unit_dims_with_shape_cast",
            ]
        self.emit(
            f"transform.apply_patterns to {vec} {{\n    "
            + "\n    ".join(patterns)
            + "\n  } : !transform.any_op"
        )
        # Fusion clones a producer into the loop once per use: a softmax's max and x - max,
        # read by both the sum and the output, were computed twice a row (a 37x1001 softmax:
        # 0.74x eager before, 1.15x with the clones merged).
        self.emit(f"transform.apply_cse to {vec} : !transform.any_op")
        loops = self.fresh("loops")
        self.emit(
            f'{loops} = transform.structured.match ops{{["scf.for"]}} in %root '
            ": (!transform.any_op) -> !transform.any_op"
        )
        self.emit(
            f"transform.foreach {loops} : !transform.any_op {{\n"
            "  ^bb0(%l: !transform.any_op):\n"
            "    transform.apply_licm to %l : !transform.any_op\n"
            "    transform.loop.hoist_loop_invariant_subsets %l : !transform.any_op\n"
            "  }"
        )

    def text(self) -> str:
        body = "\n  ".join(self.lines)
        return (
            "transform.named_sequence @__transform_main(%root: !transform.any_op "
            "{transform.readonly}) {\n  " + body + "\n  transform.yield\n}\n"
        )


def _list(values: list[int]) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def attach(payload: str, script: str) -> str:
    """The kernel module: the prepared payload with the schedule beside it."""
    start = payload.index("module")
    brace = payload.index("{", start)
    header = payload[start:brace].strip()
    if header != "module":
        raise ValueError(f"unexpected module header {header!r}")
    closing = payload.rindex("}")
    return (
        payload[:start]
        + "module attributes {transform.with_named_sequence} {"
        + payload[brace + 1 : closing]
        + script
        + "}\n"
        + payload[closing + 1 :]
    )


# -- families -----------------------------------------------------------------------------------


def work(info: PayloadInfo) -> int:
    """The iterations of the payload's largest linalg op: what decides whether threads pay."""
    return max((math.prod(op.ranges) for op in info.ops if op.ranges), default=0)


def principal_op(info: PayloadInfo) -> OpInfo | None:
    """The op whose loops a schedule tiles: the contraction or convolution, else the root
    (None for a payload without linalg ops)."""
    for op in info.ops:
        if op.name in CONTRACTIONS or op.name in CONVOLUTIONS or op.name in DEPTHWISE:
            return op
    return next((op for op in info.ops if op.is_root), None)


def render(info: PayloadInfo, config: Config) -> str:
    family = config["family"]
    if family == "contraction":
        return _contraction(info, config)
    if family == "rows":
        return _rows(info, config)
    if family == "conv" and config.get("algorithm") == "im2col":
        raise ValueError("an im2col convolution rewrites its payload: use kernel_source")
    if family == "conv":
        return _conv(info, config)
    if family == "depthwise" and config.get("algorithm") == "rows":
        raise ValueError(
            "a depthwise convolution by row blocks rewrites its payload: use kernel_source"
        )
    if family == "depthwise":
        return _depthwise(info, config)
    if family == "transpose":
        return _transpose(info, config)
    raise ValueError(f"unknown schedule family {family!r}")


def _ceil_to(value: int, multiple: int) -> int:
    return max(multiple, math.ceil(value / multiple) * multiple)


def fit_tile(extent: int, target: int, multiple: int) -> int:
    """A tile size near `target` that divides `extent` and is a multiple of `multiple`.

    A tile that does not divide its loop leaves a partial tile whose sizes are dynamic, and
    every tile nested in it is then vectorized with masks, several times slower. So: the
    largest such divisor not above `target`; else the smallest above it; else (no multiple of
    `multiple` divides `extent`: partial tiles are unavoidable) `target` itself, or the whole
    extent if that is smaller.
    """
    divisors = [d for d in range(multiple, extent + 1, multiple) if extent % d == 0]
    below = [d for d in divisors if d <= target]
    if below:
        return max(below)
    if divisors:
        return min(divisors)
    return min(target, extent)


def k_tile(k: int, target: int, kr: int) -> int:
    """A contraction's k cache tile near `target` for an unroll of `kr` (`fit_tile`), or the
    whole of k where the tile that divides it is under half the target: a k of 257 (a prime)
    was taken one at a time, reading and writing the accumulator tile at every step (a
    255x257x193 matmul ran 0.56x torch.mm packed, 1.28x with k whole; 0.18x -> 0.46x
    unpacked). A long k whole streams its panel from L2 instead of L1, a lesser cost."""
    kc = fit_tile(k, target, kr)
    return k if 2 * kc <= target and k % kr == 0 else kc


def _chunk(extent: int, parts: int, multiple: int = 1) -> int:
    size = math.ceil(extent / max(parts, 1))
    return max(multiple, math.ceil(size / multiple) * multiple)


def _contraction(info: PayloadInfo, config: Config) -> str:
    s = Script.of(info)
    contraction = next(op for op in info.ops if op.name in CONTRACTIONS)
    root = info.root
    batch = len(contraction.iterators) == 4  # b, m, n, k
    mr, nr, kr = config["register"]
    m, n, k = contraction.ranges[-3:]
    threads = config.get("threads", 1)
    split_batch = batch and contraction.ranges[0] >= threads
    # Threads split the rows, unless there are fewer than a register tile each (a
    # matrix-vector product: one row), when they split the columns.
    split_columns = threads > 1 and not split_batch and m < threads * mr
    rows_multiple = mr * (1 if split_batch or split_columns else threads)
    columns_multiple = nr * (threads if split_columns else 1)
    handles = {op.index: s.match_op(op.index) for op in info.ops}
    lead = [1] if batch else []
    # Rows or columns that the register tile does not divide (k does): the last few are split
    # off as products of their own, tiled by exactly their count, so that every tile is
    # static without padding, which copies A, B and C into padded buffers and computes zeros
    # (a 129x64x96 product took 1.25x its 128-row version's time padded on one thread, 1.05x
    # split; on two threads 2.1-2.6x and 1.6x: the parts left over run on one).
    rows_left, columns_left = m % rows_multiple, n % columns_multiple
    split = (
        root.index == contraction.index
        and not split_columns
        and not k % kr
        and (rows_left or columns_left)
        and m > rows_multiple
        and n > columns_multiple
    )
    if split:
        rows_dim = 1 if batch else 0  # the columns' dim follows
        if columns_left:
            main, tail = s.split(handles[contraction.index], rows_dim + 1, n - columns_left)
            _tile_tail(s, tail, lead, m, rows_dim, (mr, columns_left, kr))
            handles[contraction.index] = main
        if rows_left:
            main, tail = s.split(handles[contraction.index], rows_dim, m - rows_left)
            _tile_tail(s, tail, lead, rows_left, rows_dim, (mr, nr, kr))
            handles[contraction.index] = main
        m, n = m - rows_left, n - columns_left
        root = contraction = replace(contraction, ranges=[*contraction.ranges[:-3], m, n, k])
    # Shapes the register tile does not divide are padded (with zeros, which add nothing to a
    # sum of products) so that every tile is static; a masked partial tile is several times
    # slower. Only when the contraction is the result: a consumer would read a padded slice.
    if root.index == contraction.index and (m % rows_multiple or n % columns_multiple or k % kr):
        padded = s.fresh("padded")
        zeros = ", ".join(["0.0 : f32"] * 3)
        dims = "[1, 2, 3]" if batch else "[0, 1, 2]"
        # One per padded dimension, the batch unpadded.
        multiples = [rows_multiple, columns_multiple, kr]
        s.emit(
            f"{padded}, {s.fresh('pad')}, {s.fresh('copy')} = transform.structured.pad "
            f"{handles[contraction.index]} pad_to_multiple_of {_list(multiples)} "
            f"{{padding_dimensions = {dims}, padding_values = [{zeros}]}} : "
            "(!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op)"
        )
        handles[contraction.index] = padded
        m, n, k = _ceil_to(m, rows_multiple), _ceil_to(n, columns_multiple), _ceil_to(k, kr)
        contraction = replace(contraction, init_producers=[])  # the fill now feeds a pad
        root = contraction
        info = replace(info, ops=[op for op in info.ops if op.index == contraction.index])
    # Each thread's rows or columns: the extent the cache tile must divide.
    if split_columns:
        n = _chunk(n, threads, nr)
    elif threads > 1 and not split_batch:
        m = _chunk(m, threads, mr)
    mc = fit_tile(m, config["cache"][0], mr)
    nc = fit_tile(n, config["cache"][1], nr)
    kc = k_tile(k, config["cache"][2], kr)
    c_handle = handles[contraction.index]
    root_handle = handles[root.index]
    inits = set(contraction.init_producers)
    # A consumer that reads the product through a reshape (its unit rows dropped: a
    # matrix-vector product's bias and activation) cannot be fused into the product's loop.
    reshaped = root.index != contraction.index and len(root.ranges) < len(contraction.ranges) - 1
    batch_chunk = _chunk(contraction.ranges[0], threads) if split_batch else 0
    if threads > 1 and reshaped:
        sizes = _thread_tiles(len(contraction.ranges), batch, batch_chunk, split_columns, m, n)
        c_handle, loop = s.tile_forall(c_handle, sizes)
        for index in inits:
            handles[index], loop = s.fuse_into(handles[index], loop)
        if split_batch or split_columns:  # the same dim of the consumer: its first or last
            sizes = [0] * len(root.ranges)  # [b,] n
            sizes[0 if split_batch else -1] = batch_chunk or n
            root_handle, loop = s.tile_forall(root_handle, sizes)
            for op in reversed(info.ops):
                if op.index not in (root.index, contraction.index, *inits):
                    handles[op.index], loop = s.fuse_into(handles[op.index], loop)
    elif threads > 1:
        sizes = _thread_tiles(len(root.ranges), batch, batch_chunk, split_columns, m, n)
        tiled_root, loop = s.tile_forall(root_handle, sizes)
        if root.index == contraction.index:
            c_handle = tiled_root
        else:
            root_handle = tiled_root
        for op in reversed(info.ops):
            if op.index == root.index or (split and op.index in contraction.init_producers):
                continue  # a split product's parts read one fill: it stays whole, outside
            fused, loop = s.fuse_into(handles[op.index], loop)
            handles[op.index] = fused
            if op.index == contraction.index:
                c_handle = fused
    for index in inits:
        fill_tiled, _ = s.tile_for(handles[index], lead + [mr, nr])
    cached, _ = s.tile_for(c_handle, lead + [mc, nc, kc])
    registers, _ = s.tile_for(cached, lead + [mr, nr, kr])
    s.vectorize(registers, lead + [mr, nr, kr])
    if root.index != contraction.index:
        consumer, _ = s.tile_for(root_handle, _vector_tile(root, mr, nr))
    s.vectorize_function("outerproduct")
    return s.text()


def _tile_tail(
    s: Script, tail: str, lead: list[int], rows: int, rows_dim: int, register: tuple[int, int, int]
) -> None:
    """Tile and vectorize a part of a product split off (`_contraction`), of `rows` rows and
    columns that `register`'s tile divides: whole register tiles of rows, then one tile of
    the rows left."""
    mr, nr, kr = register
    left = rows % mr
    if left and rows > mr:
        tail, last = s.split(tail, rows_dim, rows - left)
        tiled, _ = s.tile_for(last, lead + [left, nr, kr])
        s.vectorize(tiled, lead + [left, nr, kr])
    tile = lead + [min(mr, rows), nr, kr]
    tiled, _ = s.tile_for(tail, tile)
    s.vectorize(tiled, tile)


def _thread_tiles(
    rank: int, batch: bool, batch_chunk: int, split_columns: bool, m: int, n: int
) -> list[int]:
    """The `scf.forall` tile sizes of an op whose dims begin [b,] m, n (a product, k after
    them, or its elementwise consumer): each thread's batches, columns or rows."""
    sizes = [0] * rank
    if batch_chunk:
        sizes[0] = batch_chunk
    elif split_columns:
        sizes[2 if batch else 1] = n
    else:
        sizes[1 if batch else 0] = m
    return sizes


def _vector_tile(op: OpInfo, rows: int, vector: int) -> list[int]:
    sizes = [1] * len(op.ranges)
    if len(sizes) >= 2:
        sizes[-2] = rows
    if sizes:
        sizes[-1] = vector
    return sizes


#: The longest reduced row a rows schedule vectorizes whole; longer rows are reduced in chunks.
#: The vector tile is what LLVM compiles: a whole 256x512 reduction vectorized as one vector
#: took minutes to build (a full reduction had no row loop to bound it).
ROW_CHUNK = 1024


def _rows(info: PayloadInfo, config: Config) -> str:
    """Threads over row blocks; every op fused into a per-row loop; vectors along rows.

    The row loop is the root's; a root of lower rank than the ops feeding it (a variance or
    a norm over the last dim, whose root divides per row) still tiles its rows, and a full
    reduction (a loss: its root is a scalar) tiles the rows of its largest op instead. An op
    whose leading dims are not the root's (group norm's statistics, over groups of channels,
    feed the root through a reshape) cannot fuse into the root's loop: the last such op
    anchors a row loop of its own, and the ops like it fuse into that one. Inside a row every
    op is a vector along the row: reduced middle dims are walked one at a time (the
    accumulator stays a row of vectors) and a reduced row longer than `ROW_CHUNK` is reduced
    chunk by chunk, so no op is vectorized over more than a few rows."""
    s = Script.of(info)
    root = info.root
    handles = {op.index: s.match_op(op.index) for op in info.ops}
    threads = config.get("threads", 1)
    rows = config["rows"]
    vector = config["vector"]
    root_inits = set(root.init_producers)
    pending = [
        op for op in reversed(info.ops) if op.index != root.index and op.index not in root_inits
    ]
    largest = largest_op(info)
    row_tiled: set[int] = set()  # ops whose leading (reduced) dim the row loop tiles itself
    anchor: OpInfo | None = root
    leads: dict[int, int] = {}  # per op, how many leading dims its row loop walks
    while anchor is not None:
        rank = len(anchor.ranges)
        lead = _shared_row_dims(anchor, pending)
        members = _fusable(
            anchor,
            [
                op
                for op in pending
                if not op.is_fill
                and op.ranges[:lead] == anchor.ranges[:lead]
                # a reduction over a dim the loop walks would be recomputed in every step
                and all(kind == "parallel" for kind in op.iterators[:lead])
            ],
            info.ops,
        )
        inits = {index for op in [anchor, *members] for index in op.init_producers}
        members += [op for op in pending if op.is_fill and op.index in inits]
        members.sort(key=lambda op: -op.index)  # consumers first: each fuses into the loop
        pending = [op for op in pending if op not in members]
        handle = handles[anchor.index]
        chunk = _thread_chunk(anchor, threads)
        if chunk:
            handle, loop = s.tile_forall(handle, [chunk] + [0] * (rank - 1))
            for op in members:
                handles[op.index], loop = s.fuse_into(handles[op.index], loop)
        if rank > 1 or (rank == 1 and len(largest.ranges) > 1):
            row_sizes = [1] * (lead - 1) + [rows] + [0] * (rank - lead)
            handle, (row_loop, *_) = _tile_outer(s, handle, row_sizes)
            for op in members:
                if not op.is_fill:
                    handles[op.index], row_loop = s.fuse_into(handles[op.index], row_loop)
        elif rank == 0 and len(largest.ranges) > 1 and not largest.is_fill:
            sizes = [rows] + [0] * (len(largest.ranges) - 1)
            handles[largest.index], _ = s.tile_for(handles[largest.index], sizes)
            row_tiled.add(largest.index)
            pending = [op for op in pending if op is not largest]
        handles[anchor.index] = handle
        leads.update({op.index: lead for op in [anchor, *members]})
        anchor = next((op for op in pending if not op.is_fill), None)
        pending = [op for op in pending if op is not anchor]
    for op in [op for op in reversed(info.ops) if op.index not in root_inits]:
        if op.is_fill or not op.ranges:
            continue
        inner = [0] * len(op.ranges)
        last = len(op.ranges) - 1
        lead = leads.get(op.index, 0)
        whole = _reduced_tail(op, lead)
        # Dims between the row loop's and the row itself are walked one at a time: a
        # reduced one keeps the accumulator a row of vectors, and a parallel one (below a
        # row loop shared with a group's statistics) keeps every vector one row long.
        for dim in range(lead, last):
            if dim not in whole and not (dim == 0 and op.index in row_tiled):
                inner[dim] = 1
        for dim in op.reduction_dims:
            if dim != last and dim not in whole and not (dim == 0 and op.index in row_tiled):
                inner[dim] = 1
        if op.iterators[-1] == "parallel":
            if not op.ranges[-1] or op.ranges[-1] > vector:
                inner[-1] = vector
        elif op.ranges[-1] > ROW_CHUNK:
            inner[-1] = _row_chunk(op.ranges[-1], vector)
        if any(inner):
            handles[op.index], loops = s.tile_for(handles[op.index], inner)
            if inner[-1] and op.ranges[-1] % inner[-1]:
                s.peel(loops[-1])
    s.vectorize_function(contract_reductions=False)
    return s.text()


def _reduced_tail(op: OpInfo, lead: int) -> set[int]:
    """The reduced dims just before a reduced last dim that are reduced with it as one
    vector, up to `ROW_CHUNK` elements: walked one at a time, each step reduced a vector as
    short as the last dim across its lanes (a group norm's statistics over channels x 32 x
    32, refined by `kope-refine-reshapes`, reduced 32 floats a step and took 1.5x eager's
    time)."""
    if not op.ranges or op.iterators[-1] != "reduction" or not 0 < op.ranges[-1] <= ROW_CHUNK:
        return set()
    whole: set[int] = set()
    size = op.ranges[-1]
    for dim in range(len(op.ranges) - 2, lead - 1, -1):
        if op.iterators[dim] != "reduction" or not 0 < size * op.ranges[dim] <= ROW_CHUNK:
            break
        size *= op.ranges[dim]
        whole.add(dim)
    return whole


def largest_op(info: PayloadInfo) -> OpInfo:
    """The op of the most iterations: whose rows a full reduction's (a loss's) loop walks."""
    return max(info.ops, key=lambda op: math.prod(op.ranges) if op.ranges else 0)


def _thread_chunk(op: OpInfo, threads: int) -> int:
    """The rows of `op`'s dim 0 each thread takes in a rows schedule; 0 where the threads do
    not split that dim."""
    if threads > 1 and op.ranges and op.ranges[0] > 1 and 0 in op.parallel_dims:
        return _chunk(op.ranges[0], threads)
    return 0


def ragged_rows(info: PayloadInfo, threads: int, rows: int) -> bool:
    """Whether `_rows` at `rows` rows a step would take a partial step: the root's row loop
    (or a loss's largest op's) over rows that `rows` does not divide, or over each thread's
    share where the threads split the rows unevenly. Such a step has a dynamic size, and a
    tile of dynamic size is not vectorized: every op in that loop stayed scalar loops (a
    129x257 GELU at 4 rows a step took 7x the time of 1 row a step). Peeling the row loop
    leaves the fused ops' types dynamic, so these configurations are not offered."""
    if rows <= 1:
        return False
    root = info.root
    largest = largest_op(info)
    if len(root.ranges) > 1 or (len(root.ranges) == 1 and len(largest.ranges) > 1):
        pending = [op for op in info.ops if op.index != root.index]
        dim = _shared_row_dims(root, pending) - 1
        extent = root.ranges[dim]
        chunk = _thread_chunk(root, threads)
        if chunk and dim == 0:
            return extent % chunk != 0 or chunk % rows != 0
        return extent % rows != 0
    if not root.ranges and len(largest.ranges) > 1:
        return largest.ranges[0] % rows != 0
    return False


def _fusable(anchor: OpInfo, candidates: list[OpInfo], ops: list[OpInfo]) -> list[OpInfo]:
    """The candidates a loop around `anchor` can fuse: those it reads directly, and those
    they read, and so on (an op read only through a reshape has no slice in it to fuse), but
    none the function also returns or an op outside the loop also reads: MLIR's fusion
    crashes on a value used after the loop (LLVM aborts in the build), and a value read
    before it (by a returned statistic's reduction) was computed twice, fused inside and whole
    outside, where no tile reached it (instance norm's centred values, one
    vector<32x33x21xf32>: the build ran past its timeout)."""
    by_index = {op.index: op for op in candidates if not op.returned}
    found: list[OpInfo] = []
    frontier = [anchor]
    while frontier:
        op = frontier.pop()
        for index in op.producers:
            producer = by_index.pop(index, None)
            if producer is not None:
                found.append(producer)
                frontier.append(producer)
    readers: dict[int, set[int]] = {}
    for op in ops:
        for index in op.reads:
            readers.setdefault(index, set()).add(op.index)
    while True:  # dropping one op may leave what it alone read with a reader outside
        inside = {anchor.index} | {op.index for op in found}
        kept = [op for op in found if readers.get(op.index, set()) <= inside]
        if len(kept) == len(found):
            return found
        found = kept


def _shared_row_dims(anchor: OpInfo, pending: list[OpInfo]) -> int:
    """The leading dims a row loop around `anchor` walks: its own row dims (`_row_dims`), or
    fewer where a reduction it may fuse walks fewer (group norm's statistics reduce channels
    and positions that its last op keeps apart: the loop walks (N, groups) for both)."""
    lead = _row_dims(anchor)
    for op in pending:
        depth = _row_dims(op)
        if (
            op.reduction_dims
            and depth < lead
            and op.ranges[:depth] == anchor.ranges[:depth]
            and all(op.iterators[d] == anchor.iterators[d] == "parallel" for d in range(depth))
        ):
            lead = depth
    return lead


def _row_dims(op: OpInfo) -> int:
    """How many leading dims of `op` a row loop walks: all its parallel dims but the
    innermost (the row itself), or all of them when it reduces a row."""
    if len(op.ranges) <= 1:
        return 1
    return max(1, len(op.parallel_dims) - (0 if op.reduction_dims else 1))


def _row_chunk(length: int, vector: int) -> int:
    """The largest power of two up to `ROW_CHUNK` that divides a reduced row (a static tile
    vectorizes; a partial one would stay scalar); 0, the whole row, when none of at least
    `vector` divides it."""
    chunk = ROW_CHUNK
    while chunk >= vector and length % chunk:
        chunk //= 2
    return chunk if chunk >= vector else 0


_CONV_1D = "linalg.conv_1d_ncw_fcw"
CONVOLUTIONS = {"linalg.conv_2d_nchw_fchw", _CONV_1D}


def conv_dims(conv: OpInfo) -> tuple[int, int, int]:
    """The loops of a convolution's output channels, output columns and input channels:
    (n, f, oh, ow, c, kh, kw) for a 2-D one, (n, f, ow, c, kw) for a 1-D one."""
    return (1, 2, 3) if conv.name == _CONV_1D else (1, 3, 4)


def _conv(info: PayloadInfo, config: Config) -> str:
    """Output channels split over threads; (channel x column x input-channel) register tiles.
    A 2-D convolution's tile (one output row, one window row) is decomposed into the 1-D
    convolution a 1-D one's tile already is, and that is what is vectorized."""
    s = Script.of(info)
    conv = next(op for op in info.ops if op.name in CONVOLUTIONS)
    handles = {op.index: s.match_op(op.index) for op in info.ops}
    conv_handle = handles[conv.index]
    f, ow, c = conv_dims(conv)
    threads = config.get("threads", 1)
    if threads > 1:
        sizes = [0] * len(conv.ranges)
        sizes[f] = _chunk(conv.ranges[f], threads)
        conv_handle, loop = s.tile_forall(conv_handle, sizes)
        for index in conv.init_producers:
            handles[index], loop = s.fuse_into(handles[index], loop)
    for index in conv.init_producers:
        rank = len(info.ops[index].ranges)
        s.tile_for(handles[index], [1] * (rank - 1) + [config["columns"]])
    sizes = [1] * (len(conv.ranges) - 1) + [0]  # batch, window rows: 1; window columns whole
    sizes[f], sizes[ow], sizes[c] = config["channels"], config["columns"], config["inputs"]
    tiled, _ = s.tile_for(conv_handle, sizes)
    if conv.name != _CONV_1D:
        decomposed = s.fresh("conv1d")
        s.emit(
            f"{decomposed} = transform.structured.decompose {tiled} "
            ": (!transform.any_op) -> !transform.any_op"
        )
        tiled = decomposed
    if conv.ranges[ow] % config["columns"] == 0 and conv.ranges[c] % config["inputs"] == 0:
        _vectorize_tile(s, tiled)  # full tiles: the 1-D convolution is static
    s.vectorize_function("outerproduct")
    return s.text()


DEPTHWISE = {"linalg.depthwise_conv_2d_nchw_chw"}


def _depthwise(info: PayloadInfo, config: Config) -> str:
    """Channels split over threads; (channel x column) tiles; a multiply-add per window column.

    The loops of the NCHW depthwise op are (n, oh, ow, c, kh, kw). After tiling oh and kh to
    1 it decomposes into a 1-D depthwise conv, which the vectorizer only takes in NWC form;
    tiling its window column to 1 and folding that unit loop leaves an elementwise
    multiply-add over (channels x columns) whose window offset sits in the input slice. The
    unit loop is folded with reshapes: folded with rank-reducing slices, a full tile's write
    lost its permutation map as in `_vectorize_tile`, even vectorized on its own.
    """
    s = Script.of(info)
    conv = next(op for op in info.ops if op.name in DEPTHWISE)
    handles = {op.index: s.match_op(op.index) for op in info.ops}
    conv_handle = handles[conv.index]
    threads = config.get("threads", 1)
    if threads > 1:
        sizes = [0, 0, 0, _chunk(conv.ranges[3], threads), 0, 0]
        conv_handle, loop = s.tile_forall(conv_handle, sizes)
        for index in conv.init_producers:
            handles[index], loop = s.fuse_into(handles[index], loop)
    for index in conv.init_producers:
        s.tile_for(handles[index], [1, 1, 1, config["columns"]])
    tiled, _ = s.tile_for(conv_handle, [1, 1, config["columns"], config["channels"], 1, 0])
    decomposed = s.fresh("conv1d")
    s.emit(
        f"{decomposed} = transform.structured.decompose {tiled} "
        ": (!transform.any_op) -> !transform.any_op"
    )
    column, _ = s.tile_for(decomposed, [0, 0, 0, 1])
    generic = s.fresh("generic")
    s.emit(
        f"{generic} = transform.structured.generalize {column} "
        ": (!transform.any_op) -> !transform.any_op"
    )
    func = s.parent_function(generic)
    s.emit(
        f"transform.apply_patterns to {func} {{\n"
        "    transform.apply_patterns.linalg.fold_unit_extent_dims_via_reshapes\n"
        "    transform.apply_patterns.canonicalization\n"
        "  } : !transform.any_op"
    )
    full = conv.ranges[2] % config["columns"] == 0
    inner = bool(config.get("columns_inner"))
    if full or inner:  # the multiply-add is addressed on its own
        tile = s.fresh("madd")
        s.emit(
            f'{tile} = transform.structured.match ops{{["linalg.generic"]}} in {func} '
            ": (!transform.any_op) -> !transform.any_op"
        )
        if inner:
            # The multiply-add's loops are (columns, channels), as the 1-D form's NWC order
            # left them: vectorized so, every NCHW row is transposed into channels in
            # registers and back. Interchanged, the vector runs along the row, as NCHW
            # stores it.
            swapped = s.fresh("madd")
            s.emit(
                f"{swapped} = transform.structured.interchange {tile} "
                "iterator_interchange = [1, 0] : (!transform.any_op) -> !transform.any_op"
            )
            tile = swapped
        if full:
            # Full tiles are static: vectorize the multiply-add first and fold its slices
            # into the transfers, for the reason given in `_vectorize_tile`.
            _vectorize_tile(s, tile)
    s.vectorize_function()
    return s.text()


TRANSPOSES = {"linalg.transpose"}


def transposed_dims(op: OpInfo) -> tuple[int, int]:
    """A transpose's two contiguous dims, as loops (the output's dims): the one the input's
    innermost dim becomes, and the output's innermost."""
    rank = len(op.ranges)
    return op.permutation.index(rank - 1), rank - 1


def transposing(info: PayloadInfo) -> bool:
    """Whether the payload is a transpose (`linalg.transpose` the root) of elementwise ops'
    result, or of an input: what the transpose family schedules."""
    root = info.root
    return root.name in TRANSPOSES and all(
        op is root
        or (
            op.name == "linalg.generic"
            and not op.reduction_dims
            and len(op.ranges) == len(root.ranges)
        )
        for op in info.ops
    )


def _transpose(info: PayloadInfo, config: Config) -> str:
    """Register tiles that read `reads` contiguous input rows and write `writes` contiguous
    output rows, transposed in vector registers; the elementwise ops whose result is
    transposed are computed tile by tile inside (a tile of theirs is the transposed tile).

    Left to the rows schedule a transpose vectorizes along the output row and gathers it from
    input elements a row apart (1x32x28x28 to NHWC: 13 µs, the other way 26 µs, eager's
    strided copy 20-27, in the worker); a tile of reads x writes loads whole input vectors,
    transposes them in registers and stores whole output vectors (6-8 µs both ways, 2-core
    AVX2, the kernel alone; a memcpy of the same 100 KB takes 4.6). With a residual add and
    ReLU before it (NHWC in, NCHW out): 9.6 µs, against 35 for eager's add, ReLU and copy."""
    s = Script.of(info)
    op = info.root
    handles = {other.index: s.match_op(other.index) for other in info.ops}
    handle = handles[op.index]
    rank = len(op.ranges)
    reads, writes = transposed_dims(op)
    threads = config.get("threads", 1)
    producers = sorted((p for p in info.ops if p is not op), key=lambda p: -p.index)
    if threads > 1:
        # The outermost loop wide enough to share, other than the two tiled ones.
        outer = next(
            (d for d in range(rank) if d not in (reads, writes) and op.ranges[d] >= threads),
            reads,
        )
        sizes = [0] * rank
        sizes[outer] = _chunk(op.ranges[outer], threads)
        handle, forall = s.tile_forall(handle, sizes)
        for producer in producers:
            handles[producer.index], forall = s.fuse_into(handles[producer.index], forall)
    tile = [1] * rank
    tile[reads] = _static_tile(op.ranges[reads], config["tile"][0])
    tile[writes] = _static_tile(op.ranges[writes], config["tile"][1])
    handle, loops = s.tile_for(handle, tile)
    func = s.parent_function(handle)
    # Each producer's tile is the transposed tile: its dim permutation[i] is the root's dim i.
    source_tile = [1] * rank
    for dim, source in enumerate(op.permutation):
        source_tile[source] = tile[dim]
    for producer in producers:  # consumers first: each fuses into the innermost tile loop
        handles[producer.index], loops[-1] = s.fuse_into(handles[producer.index], loops[-1])
    s.vectorize(handle, tile)
    for producer in producers:
        s.vectorize(handles[producer.index], source_tile)
    patterns = [
        "transform.apply_patterns.vector.transfer_permutation_patterns",
        "transform.apply_patterns.vector.cast_away_vector_leading_one_dim",
        "transform.apply_patterns.vector.lower_transpose "
        f'lowering_strategy = "{config["lowering"]}"',
        "transform.apply_patterns.tensor.fold_tensor_subset_ops_into_vector_transfers",
        "transform.apply_patterns.canonicalization",
    ]
    s.emit(
        f"transform.apply_patterns to {func} {{\n    "
        + "\n    ".join(patterns)
        + "\n  } : !transform.any_op"
    )
    return s.text()


def _static_tile(extent: int, target: int) -> int:
    """A transpose tile that divides its loop (a partial tile would be masked, and a masked
    transposing read does not lower): the largest divisor up to `target`, or the whole loop
    when that divisor is under half the target and the loop at most twice it (11 columns:
    one tile of 11, not 11 of 1)."""
    tile = fit_tile(extent, target, 1)
    return extent if 2 * tile <= target and extent <= 2 * target else tile


def _vectorize_tile(s: Script, handle: str) -> None:
    """Vectorize one static tile op and fold its rank-reducing slices into its transfers.

    Left to vectorize_children_and_apply_patterns, the fold of a rank-reducing insert_slice
    into the tile's transfer_write drops the write's permutation map, and the write stores one
    channel of the tile (every 1x1 conv, and any conv whose column tile divides the row, came
    out wrong). Partial tiles are dynamic: they are left to the function-wide vectorizer.
    """
    func = s.parent_function(handle)
    s.emit(f"transform.structured.vectorize {handle} : !transform.any_op")
    s.emit(
        f"transform.apply_patterns to {func} {{\n"
        "    transform.apply_patterns.tensor.fold_tensor_subset_ops_into_vector_transfers\n"
        "    transform.apply_patterns.canonicalization\n"
        "  } : !transform.any_op"
    )


def _tile_outer(s: Script, handle: str, sizes: list[int]) -> tuple[str, list[str]]:
    tiled, loops = s.tile_for(handle, sizes)
    return tiled, loops


# -- packed contractions -------------------------------------------------------------------------


def packable(info: PayloadInfo, rows: int, width: int) -> bool:
    """Whether `packed_kernel` can take this payload's B in panels of `width` with register
    tiles of `rows` rows: a plain matmul (plus an elementwise epilogue) at least one register
    tile large (a ragged last panel is padded with zero columns, ragged last rows with zero
    rows)."""
    plain = info.plain_matmul
    return plain is not None and plain.m >= rows and plain.n >= width


@dataclass(frozen=True)
class _Panels:
    """How a packed kernel shares its work: `count` panels of `width` (the last ones maybe
    zero-padded) over `padded_rows` rows (A's rows padded with zero rows to whole register
    tiles, for each thread where threads split the rows), threads over `rows` rows and
    `per_thread` panels each."""

    width: int
    count: int
    padded_rows: int
    rows: int
    per_thread: int
    threads: int

    @property
    def columns(self) -> int:
        return self.count * self.width


def _panels(plain: PlainMatmul, config: Config) -> _Panels:
    mr, nr, _ = config["register"]
    count = math.ceil(plain.n / nr)
    # A partial tile anywhere makes every tile of its loop a dynamic size, vectorized with
    # masks several times slower; zero rows and zero panels keep every tile static.
    rows = math.ceil(plain.m / mr) * mr
    threads = config.get("threads", 1)
    if threads <= 1:
        return _Panels(nr, count, rows, rows, count, 1)
    # Threads split the rows (A padded to whole register tiles per thread) unless that adds
    # more than a quarter of zero rows (a few rows: 16 on 2 threads in tiles of 6 pad to 24),
    # when they split the panels (a whole number each, zero panels added). A panel split ran
    # 1.25-1.55x slower than a row split of the same product where both computed as many
    # zeros (256^3 and 252x256x256 on 2 threads, AVX2), so fewer zeros alone do not pick it.
    split_rows = math.ceil(plain.m / (threads * mr)) * threads * mr
    if 4 * split_rows <= 5 * rows:
        return _Panels(nr, count, split_rows, split_rows // threads, count, threads)
    split_panels = math.ceil(count / threads) * threads
    return _Panels(nr, split_panels, rows, rows, split_panels // threads, threads)


# The packed product's function, inlined into the payload where its matmul was.
_PRODUCT = "kope_packed_product"
# Marks the pad that gives A whole register tiles of rows, for the schedule to find it.
_ROWS_PAD = "kope.rows_pad"


def packed_kernel(payload: str, info: PayloadInfo, config: Config) -> str:
    """A plain matmul (`PlainMatmul`) that takes B as panels of `nr` columns (J x K x nr, see
    `kope.vocabulary.layouts`), with its schedule.

    The product is computed in the panels' index space, C[m, j, r] = sum_k A[m, k] B[j, k, r],
    so a register tile of mr x nr reads its B columns as one contiguous stream along k. Where
    the panels hold exactly N columns, C (M x N) is that product read as M x N, the same
    memory; where they hold more (zero columns: a ragged last panel, or panels padded for
    threads) or A is padded with zero rows to whole register tiles, C is the product's first
    M x N. The payload's own epilogue (bias, activation, gate, residual: everything after its
    matmul) then reads C unchanged: the packed product replaces the matmul in the payload
    itself, so whatever the epilogue computes, it computes the same. Threads split the rows
    if they divide into whole register tiles, else the panels; cache tiles are rows x panels
    x k; the epilogue is tiled by rows of register-tile width.
    """
    plain = info.plain_matmul
    assert plain is not None
    shape = _panels(plain, config)
    layout = panels(shape.width) if shape.columns == plain.n else panels(shape.width, shape.count)
    context, module, matmul = payload_op(payload, "linalg.matmul")
    product = ir.Module.parse(_packed_product(plain, shape), context)
    with context, ir.Location.unknown():
        main = main_function(module)
        b = main.regions[0].blocks[0].arguments[plain.b]
        b.set_type(ir.RankedTensorType.get([shape.count, plain.k, shape.width], ir.F32Type.get()))
        signature = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        inputs = list(signature.inputs)
        inputs[plain.b] = b.type
        main.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get(inputs, list(signature.results))
        )
        main.attributes["arg_attrs"] = ir.ArrayAttr.get(
            [
                ir.DictAttr.get(
                    {LAYOUT_ATTR: ir.StringAttr.get(layout)} if index == plain.b else {}
                )
                for index in range(len(inputs))
            ]
        )
        ops = replace_with_call(module, matmul, [matmul.operands[0], b], product, _PRODUCT)
    names = [op.name for op in ops]
    if names[:2] != ["linalg.fill", "linalg.generic"] or len(ops) != 2 + plain.epilogue:
        raise ValueError(f"the packed payload's ops are not fill, product, epilogue: {names}")
    text = module.operation.get_asm(enable_debug_info=False)
    ranks = [len(ir.RankedTensorType(op.results[0].type).shape) for op in ops[2:]]
    return attach(text, _packed_schedule(plain, config, shape, ranks))


def payload_op(payload: str, name: str) -> tuple[ir.Context, ir.Module, ir.Operation]:
    """The payload parsed in a context of its own, and its function's first `name` op: what a
    payload rewrite replaces (`replace_with_call`)."""
    context = ir.Context()
    context.enable_multithreading(False)
    module = ir.Module.parse(payload, context)
    main = main_function(module)
    op = next(o.operation for o in main.regions[0].blocks[0].operations if o.operation.name == name)
    return context, module, op


def replace_with_call(
    module: ir.Module,
    op: ir.Operation,
    operands: list[ir.Value],
    helper: ir.Module,
    callee: str,
) -> list[ir.Operation]:
    """Replace `op` in `module`'s function by a call of `callee` (the one function of
    `helper`) on `operands`, inline it, and number the function's linalg ops (`OP_ATTR`) for
    a schedule to match; the numbered ops, in order. Within the module's context."""
    module.body.append(next(iter(helper.body)).operation)
    with ir.InsertionPoint(op):
        call = ir.Operation.create(
            "func.call",
            results=[op.results[0].type],
            operands=operands,
            attributes={"callee": ir.FlatSymbolRefAttr.get(callee)},
        )
    op.results[0].replace_all_uses_with(call.results[0])
    op.erase()
    PassManager.parse("builtin.module(inline, symbol-dce, canonicalize, cse)").run(module.operation)
    main = main_function(module)
    ops = [
        o.operation
        for o in main.regions[0].blocks[0].operations
        if o.operation.name.startswith("linalg.")
    ]
    i64 = ir.IntegerType.get_signless(64)
    for index, o in enumerate(ops):
        o.attributes[OP_ATTR] = ir.IntegerAttr.get(i64, index)
    return ops


def _packed_product(plain: PlainMatmul, shape: _Panels) -> str:
    """`@kope_packed_product(A, B in panels) -> A @ B`, M x N, in the panels' index space."""
    m, k, n, j, nr = plain.m, plain.k, plain.n, shape.count, shape.width
    mp = shape.padded_rows
    c3 = f"tensor<{mp}x{j}x{nr}xf32>"
    c2 = f"tensor<{m}x{n}xf32>"
    a = "%a"
    body = ["%zero = arith.constant 0.0 : f32"]
    if mp != m:
        body += [
            f"%rows = tensor.pad {a} low[0, 0] high[{mp - m}, 0] {{",
            "^bb0(%i: index, %l: index):",
            "  tensor.yield %zero : f32",
            f"}} {{{_ROWS_PAD}}} : tensor<{m}x{k}xf32> to tensor<{mp}x{k}xf32>",
        ]
        a = "%rows"
    body += [
        f"%empty = tensor.empty() : {c3}",
        f"%fill = linalg.fill ins(%zero : f32) outs(%empty : {c3}) -> {c3}",
        "%product = linalg.generic {indexing_maps = ["
        "affine_map<(m, j, r, k) -> (m, k)>, affine_map<(m, j, r, k) -> (j, k, r)>, "
        'affine_map<(m, j, r, k) -> (m, j, r)>], iterator_types = ["parallel", "parallel", '
        f'"parallel", "reduction"]}} ins({a}, %b : tensor<{mp}x{k}xf32>, '
        f"tensor<{j}x{k}x{nr}xf32>) outs(%fill : {c3}) {{",
        "^bb0(%x: f32, %y: f32, %acc: f32):",
        "  %xy = arith.mulf %x, %y : f32",
        "  %sum = arith.addf %acc, %xy : f32",
        "  linalg.yield %sum : f32",
        f"}} -> {c3}",
        f"%flat = tensor.collapse_shape %product [[0], [1, 2]] : {c3} into "
        f"tensor<{mp}x{j * nr}xf32>",
    ]
    result = "%flat"
    if (mp, j * nr) != (m, n):
        body.append(
            f"%valid = tensor.extract_slice %flat[0, 0] [{m}, {n}] [1, 1] : "
            f"tensor<{mp}x{j * nr}xf32> to {c2}"
        )
        result = "%valid"
    body.append(f"return {result} : {c2}")
    params = [f"%a: tensor<{m}x{k}xf32>", f"%b: tensor<{j}x{k}x{nr}xf32>"]
    return helper_function(_PRODUCT, params, c2, body)


def helper_function(name: str, params: list[str], result: str, body: list[str]) -> str:
    """A module of one private function `name(params) -> result` with `body` (its last line
    the return), for `replace_with_call` to inline where an op was."""
    return (
        f"module {{\nfunc.func private @{name}({', '.join(params)}) -> {result} {{\n  "
        + "\n  ".join(body)
        + "\n}\n}\n"
    )


def k_unroll(plain: PlainMatmul, kr: int) -> int:
    """The k unroll a packed kernel renders for a requested `kr`: k is not padded, and an
    unroll that does not divide it would leave a masked partial tile (255x129x193 with k
    unrolled by 4 ran 6x slower), so there k is not unrolled."""
    return kr if plain.k % kr == 0 else 1


def _packed_schedule(
    plain: PlainMatmul, config: Config, shape: _Panels, epilogue_ranks: list[int]
) -> str:
    mr, nr, kr = config["register"]
    kr = k_unroll(plain, kr)
    # Every tile is vectorized here, not by vectorizing the function's children: that also
    # vectorizes each cache tile's `insert_slice` into one read and one write of the whole
    # tile (vector<64x16x16xf32>), a copy of C through registers after bufferization; without
    # it the same kernels ran 4-15% faster with 6-row tiles (256^3, 255x129x193, 100x300x77,
    # 32x256x1024 on 1 and 2 threads, AVX2).
    s = Script(vectorize_all=False)
    fill, product = s.match_op(0), s.match_op(1)
    if shape.threads > 1:
        split_rows = shape.rows < shape.padded_rows
        sizes = [shape.rows, 0, 0] if split_rows else [0, shape.per_thread, 0]
        product, loop = s.tile_forall(product, [*sizes, 0])
        fill, loop = s.fuse_into(fill, loop)
        if split_rows and shape.padded_rows != plain.m:
            # Each thread pads its own rows of A: done once before the loop, the copy is
            # serial, and cost a 255x129x193 product 4% of its time on 2 threads.
            s.fuse_into(s.match_marked("tensor.pad", _ROWS_PAD), loop)
    mc = fit_tile(shape.rows, config["cache"][0], mr)
    jc = fit_tile(shape.per_thread, max(1, config["cache"][1] // nr), 1)
    kc = k_tile(plain.k, config["cache"][2], kr)
    fill_tile, _ = s.tile_for(fill, [mr, 1, nr])
    s.vectorize(fill_tile, [mr, 1, nr])
    cached, _ = s.tile_for(product, [mc, jc, nr, kc])
    registers, _ = s.tile_for(cached, [mr, 1, nr, kr])
    s.vectorize(registers, [mr, 1, nr, kr])
    # The epilogue, M x N: threads over rows where they divide them, then rows of nr columns;
    # a ragged last column tile is masked.
    # An epilogue of one row is 1-D (its unit row dropped): N elements in vectors of nr.
    for index, rank in enumerate(epilogue_ranks, start=2):
        op = s.match_op(index)
        if rank == 2 and shape.threads > 1 and plain.m % shape.threads == 0:
            op, _ = s.tile_forall(op, [plain.m // shape.threads, 0])
        tile, _ = s.tile_for(op, [1, nr][-rank:])
        s.vectorize(tile, [1, nr][-rank:])
    s.vectorize_function("outerproduct", drop_unit_dims=True, form_contractions=True)
    return s.text()
