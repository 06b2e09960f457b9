"""A depthwise 2-D convolution computed a block of output rows at a time, in registers.

The schedules of `schedules._depthwise` take one output row at a time and one window column
at a time: every multiply-add reads its input vector and its accumulator, and writes the
accumulator back. Here each channel's input plane is first copied into a small zero-bordered
buffer (the padding, in L1), and then each block of `rows` output rows x `columns` output
columns is one straight run of code: the block's accumulators stay in vector registers while
every input row the block's windows cover is read once per window column, and each vector
read feeds the multiply-adds of every output row whose window holds that input row (up to
KH of them). A 7x7 window over four output rows reads 10 input rows, 70 vectors per column
vector, for 196 multiply-adds; the schedules read 49 and write 49 for 49.

A window stride of 2 along the row (MobileNet's downsampling blocks) would read every other
column: the copy deals each row's columns into two phases (even, odd) with a shuffle, so
that a block reads each phase's columns contiguously, the window column choosing the phase.
A stride of 2 down the columns only changes which input rows feed which output row.

The rewrite happens in the payload, as `im2col` rewrites a full convolution: the op, with
the `tensor.pad` before it, becomes one function of `scf` loops over vector transfers
(`scf.forall` over channels where threads share the work). Strides 1 or 2, dilation 1, f32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch_mlir import ir

from kope.passes.analysis import OpInfo, PayloadInfo
from kope.passes.base import defining_op
from kope.spaces.schedules import (
    Config,
    Script,
    attach,
    payload_op,
    replace_with_call,
)
from kope.spaces.writer import VectorWriter, blocks

DEPTHWISE_2D = "linalg.depthwise_conv_2d_nchw_chw"
_FUNCTION = "kope_depthwise_rows"


def conv_of(info: PayloadInfo) -> OpInfo | None:
    return next((op for op in info.ops if op.name == DEPTHWISE_2D), None)


def fits(info: PayloadInfo, config: Config) -> bool:
    """f32, static, strides of 1 or 2, dilation 1, blocks of whole vectors, and threads that
    split the channels evenly. (Whether a block's accumulators fit the machine's registers is the
    space's to say: `accumulators`.)"""
    conv = conv_of(info)
    if conv is None or info.element_type != "f32" or not all(conv.ranges):
        return False
    if any(s not in (1, 2) for s in conv.strides) or any(d != 1 for d in conv.dilations):
        return False
    rows, columns, vector = (int(config.get(k, 0)) for k in ("rows", "columns", "vector"))
    threads = int(config.get("threads", 1))
    return (
        rows > 0
        and vector > 0
        and columns > 0
        and columns % vector == 0
        and conv.ranges[3] % threads == 0
    )


def accumulators(config: Config) -> int:
    """The vector registers a block's sums take."""
    return int(config["rows"]) * int(config["columns"]) // int(config["vector"])


@dataclass(frozen=True)
class _Shape:
    images: int
    channels: int
    rows: int  # of the input, unpadded
    row: int
    out_rows: int
    out_row: int
    kh: int
    kw: int
    top: int  # padding
    left: int
    source_rank: int  # 3: the pad's source (images·channels x H x W); 4: the input itself
    stride_rows: int
    stride_row: int


def depthwise_kernel(payload: str, info: PayloadInfo, config: Config) -> str:
    """The payload with its depthwise convolution (and the padding before it) rewritten to
    row blocks in registers, and the schedule of what is left (the init's broadcast)."""
    conv = conv_of(info)
    assert conv is not None and fits(info, config)
    context, module, op = payload_op(payload, DEPTHWISE_2D)
    with context, ir.Location.unknown():
        source, shape = _unpadded(op)
        text = _Writer(shape, config, str(source.type), str(op.operands[1].type)).function()
        helper = ir.Module.parse(text, context)
        ops = replace_with_call(
            module, op, [source, op.operands[1], op.operands[2]], helper, _FUNCTION
        )
    s = Script(vectorize_all=False)
    for index, o in enumerate(ops):  # the init (a bias broadcast, or zeros): by output rows
        *outer, out_row = ir.RankedTensorType(o.results[0].type).shape
        tiled, _ = s.tile_for(s.match_op(index), [1] * len(outer) + [0])
        s.vectorize(tiled, [1] * len(outer) + [out_row])
    s.vectorize_function()
    return attach(module.operation.get_asm(enable_debug_info=False), s.text())


def _unpadded(op: ir.Operation) -> tuple[ir.Value, _Shape]:
    """The convolution's input before torch-mlir padded it (the `tensor.pad` of its
    images·channels x H x W collapse, expanded back), or the input itself; and the shape."""
    strides = [int(v) for v in ir.DenseIntElementsAttr(op.attributes["strides"])]
    x = ir.RankedTensorType(op.operands[0].type).shape
    w = ir.RankedTensorType(op.operands[1].type).shape
    out = ir.RankedTensorType(op.results[0].type).shape
    source: ir.Value = op.operands[0]
    top = left = 0
    rows, row, rank = x[2], x[3], 4
    producer = _defined_by(source, "tensor.expand_shape")
    pad = _defined_by(producer.operands[0], "tensor.pad") if producer is not None else None
    if pad is not None:
        low = [int(v) for v in ir.DenseI64ArrayAttr(pad.attributes["static_low"])]
        high = [int(v) for v in ir.DenseI64ArrayAttr(pad.attributes["static_high"])]
        padded = ir.RankedTensorType(pad.results[0].type).shape
        zero = _pads_with_zero(pad)
        if zero and len(low) == 3 and low[0] == high[0] == 0 and padded[0] == x[0] * x[1]:
            source, rank = pad.operands[0], 3
            top, left = low[1], low[2]
            rows, row = x[2] - low[1] - high[1], x[3] - low[2] - high[2]
    shape = _Shape(
        images=x[0],
        channels=x[1],
        rows=rows,
        row=row,
        out_rows=out[2],
        out_row=out[3],
        kh=w[1],
        kw=w[2],
        top=top,
        left=left,
        source_rank=rank,
        stride_rows=strides[0],
        stride_row=strides[1],
    )
    return source, shape


def _defined_by(value: ir.Value, name: str) -> ir.Operation | None:
    """The `name` op whose result `value` is; None where another op or none defines it."""
    op = defining_op(value)
    return op if op is not None and op.name == name else None


def _pads_with_zero(pad: ir.Operation) -> bool:
    body = pad.regions[0].blocks[0]
    yielded = list(body.operations)[-1].operands[0]
    constant = _defined_by(yielded, "arith.constant")
    if constant is None:
        return False
    attr = constant.attributes["value"]
    return isinstance(attr, ir.FloatAttr) and ir.FloatAttr(attr).value == 0.0


class _Writer(VectorWriter):
    """`@kope_depthwise_rows` as text, and the shapes every part of the body refers to."""

    def __init__(self, shape: _Shape, config: Config, source_type: str, filter_type: str):
        super().__init__(int(config["vector"]))
        self.sh = shape
        self.rows, self.columns = int(config["rows"]), int(config["columns"])
        self.threads = int(config.get("threads", 1))
        self.source_type, self.filter_type = source_type, filter_type
        self.images = shape.images
        self.per_thread = shape.channels // self.threads
        planes = f"{shape.out_rows}x{shape.out_row}xf32>"
        self.out_type = f"tensor<{self.images}x{shape.channels}x{planes}"
        # What one thread writes: its channels of every image (all of them on one thread).
        self.into_type = f"tensor<{self.images}x{self.per_thread}x{planes}"
        # A plane with its zero border, its columns dealt into `stride_row` phases, each
        # wide enough that every vector a block reads (whole vectors along the output row,
        # shifted by each window column) lies inside it.
        self.phases = shape.stride_row
        self.buffer = (
            shape.stride_rows * (shape.out_rows - 1) + shape.kh,
            math.ceil(shape.out_row / self.lanes) * self.lanes + (shape.kw - 1) // self.phases,
        )
        self.buf_type = f"tensor<{self.phases}x{self.buffer[0]}x{self.buffer[1]}xf32>"

    # -- the function --------------------------------------------------------------------------

    def function(self) -> str:
        """Channels split over threads (`scf.forall`) or one loop of them; per image and
        channel: the padded plane (`plane`), the filter's taps, then the blocks."""
        self.emit("%zero = arith.constant 0.0 : f32")
        self.emit(f"%zeros = arith.constant dense<0.0> : {self.vec}")
        start = self.split_threads(
            self.threads, self.per_thread, "%cbase", self._slab(), self.out_type, self.into_type
        )
        self.loop("%images", "%n", (0, self.images, 1), [("%s0", start, self.into_type)])
        self.loop("%planes", "%cl", (0, self.per_thread, 1), [("%s1", "%s0", self.into_type)])
        self.emit("%c = arith.addi %cbase, %cl : index")
        self.plane()
        taps = self.taps()
        current = "%s1"
        row_start = 0
        for block_rows, row_count in blocks(self.sh.out_rows, self.rows):
            column_start = 0
            for block_columns, column_count in blocks(self.sh.out_row, self.columns):
                current = self.blocks(
                    current,
                    taps,
                    (row_start, block_rows, row_count),
                    (column_start, block_columns, column_count),
                )
                column_start += block_columns * column_count
            row_start += block_rows * row_count
        self.end_loop([current], [self.into_type])
        self.end_loop(["%planes"], [self.into_type])
        result = self.join_threads(
            self.threads, "%images", self._slab(), self.out_type, self.into_type
        )
        self.emit(f"return {result} : {self.out_type}")
        return self.function_text(
            _FUNCTION,
            [f"%x: {self.source_type}", f"%w: {self.filter_type}", f"%init: {self.out_type}"],
            self.out_type,
        )

    def _slab(self) -> str:
        sh = self.sh
        sizes = f"{self.images}, {self.per_thread}, {sh.out_rows}, {sh.out_row}"
        return f"[0, %cbase, 0, 0] [{sizes}] [1, 1, 1, 1]"

    def plane(self) -> None:
        """`%filled`: this image's channel `%c`, its rows copied into a zeroed buffer below
        the top padding and after the left padding, a vector at a time; under a stride of 2
        along the row, each read of two vectors dealt into the even and the odd phase."""
        sh, lanes, phases = self.sh, self.lanes, self.phases
        rows, row = self.buffer
        self.emit(f"%empty = tensor.empty() : {self.buf_type}")
        self.loop("%zeroed", "%zr", (0, rows, 1), [("%bz", "%empty", self.buf_type)])
        current = "%bz"
        for phase in range(phases):
            for v in range(math.ceil(row / lanes)):
                at = [self.index(phase), "%zr", self.index(v * lanes)]
                current = self.write("%zeros", current, at, self.buf_type, (v + 1) * lanes <= row)
        self.end_loop([current], [self.buf_type])
        if sh.source_rank == 3:  # the pad's source: images·channels x H x W
            self.emit(f"%nc = arith.muli %n, {self.index(sh.channels)} : index")
            self.emit("%plane = arith.addi %nc, %c : index")
            source = ["%plane", "%ir"]
        else:
            source = ["%n", "%c", "%ir"]
        # Input rows below the last window are read by none (a stride that does not divide).
        copied = min(sh.rows, rows - sh.top)
        self.loop("%filled", "%ir", (0, copied, 1), [("%bc", "%zeroed", self.buf_type)])
        self.emit(f"%br = arith.addi %ir, {self.index(sh.top)} : index")
        current = "%bc"
        span = phases * lanes  # input columns per read
        for u in range(math.ceil(sh.row / span)):
            # Read past the row's end as zeros; written past the buffer's end, not at all.
            whole = (u + 1) * span <= sh.row
            wide = f"vector<{span}xf32>"
            at = [*source, self.index(u * span)]
            x = self.read("%x", at, self.source_type, whole, vec=wide)
            for first in range(phases):  # the read's columns first, first + phases, ...
                dealt = x
                if phases > 1:
                    dealt = self.fresh("deal")
                    lanes_of = ", ".join(str(first + phases * m) for m in range(lanes))
                    self.emit(f"{dealt} = vector.shuffle {x}, {x} [{lanes_of}] : {wide}, {wide}")
                padded = sh.left + u * span + first  # the first one's column, padded
                column = padded // phases
                at = [self.index(padded % phases), "%br", self.index(column)]
                current = self.write(dealt, current, at, self.buf_type, column + lanes <= row)
        self.end_loop([current], [self.buf_type])

    def taps(self) -> dict[tuple[int, int], str]:
        """The channel's filter taps, each broadcast to a vector once for all its blocks."""
        taps = {}
        for i in range(self.sh.kh):
            for j in range(self.sh.kw):
                scalar = self.fresh("tap")
                self.emit(
                    f"{scalar} = tensor.extract %w[%c, {self.index(i)}, {self.index(j)}] "
                    f": {self.filter_type}"
                )
                taps[i, j] = self.fresh("tapv")
                self.emit(f"{taps[i, j]} = vector.broadcast {scalar} : f32 to {self.vec}")
        return taps

    def blocks(
        self,
        current: str,
        taps: dict[tuple[int, int], str],
        rows: tuple[int, int, int],
        columns: tuple[int, int, int],
    ) -> str:
        """(start, size, count) of blocks along the rows and along the columns, in two loops;
        the output after them."""
        (row_start, block_rows, row_count), (col_start, block_columns, col_count) = rows, columns
        result, inner = self.fresh("blocks"), self.fresh("cols")
        out_row, out_col = self.fresh("r"), self.fresh("q")
        carried, carried_inner = self.fresh("acc"), self.fresh("acc")
        row_end = row_start + block_rows * row_count
        col_end = col_start + block_columns * col_count
        self.loop(
            result, out_row, (row_start, row_end, block_rows), [(carried, current, self.into_type)]
        )
        self.loop(
            inner,
            out_col,
            (col_start, col_end, block_columns),
            [(carried_inner, carried, self.into_type)],
        )
        # Only a block ending the row, where the row is not whole vectors, writes a part of a
        # vector (masked); every read of the buffer lies inside it.
        partial = col_end == self.sh.out_row and self.sh.out_row % self.lanes != 0
        written = self.block(
            carried_inner, taps, out_row, out_col, block_rows, block_columns, partial
        )
        self.end_loop([written], [self.into_type])
        self.end_loop([inner], [self.into_type])
        return result

    def block(
        self,
        out: str,
        taps: dict[tuple[int, int], str],
        row: str,
        col: str,
        rows: int,
        columns: int,
        partial: bool,
    ) -> str:
        """One block: its sums read from the init, every input row its windows cover read
        once per window column and multiplied into each output row whose window holds it,
        the sums written."""
        kh, kw, lanes = self.sh.kh, self.sh.kw, self.lanes
        sr, phases = self.sh.stride_rows, self.phases
        vectors = math.ceil(columns / lanes)
        out_rows = [self.add(row, r) for r in range(rows)]
        out_cols = [self.add(col, v * lanes) for v in range(vectors)]
        # Output row r's window starts at input row sr * (row + r); column c's tap j reads
        # padded column phases * c + j: phase j % phases, column c + j // phases of it.
        first = row
        if sr > 1:
            first = self.fresh("ix")
            self.emit(f"{first} = arith.muli {row}, {self.index(sr)} : index")
        in_rows = [self.add(first, i) for i in range(sr * (rows - 1) + kh)]
        in_cols = {
            (v, j): self.add(col, v * lanes + j // phases)
            for v in range(vectors)
            for j in range(kw)
        }
        sums: dict[tuple[int, int], str] = {}
        for r in range(rows):
            for v in range(vectors):
                whole = not (partial and v == vectors - 1)
                at = ["%n", "%cl", out_rows[r], out_cols[v]]
                sums[r, v] = self.read(out, at, self.into_type, whole)
        for i in range(len(in_rows)):
            # The output rows whose window holds input row i, and at which of its rows.
            reached = [(r, i - sr * r) for r in range(rows) if 0 <= i - sr * r < kh]
            for j in range(kw):
                for v in range(vectors):
                    at = [self.index(j % phases), in_rows[i], in_cols[v, j]]
                    x = self.read("%filled", at, self.buf_type, True)
                    for r, tap_row in reached:
                        name = self.fresh("a")
                        self.emit(
                            f"{name} = vector.fma {x}, {taps[tap_row, j]}, {sums[r, v]} : "
                            f"{self.vec}"
                        )
                        sums[r, v] = name
        current = out
        for r in range(rows):
            for v in range(vectors):
                whole = not (partial and v == vectors - 1)
                at = ["%n", "%cl", out_rows[r], out_cols[v]]
                current = self.write(sums[r, v], current, at, self.into_type, whole)
        return current
