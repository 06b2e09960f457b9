"""Attention as one kernel: scores, softmax and the weighted sum of values a block of query
rows at a time, the scores never leaving the cache.

`scaled_dot_product_attention` reaches a Task as torch-mlir's lowering of its decomposition
(two batched products around a softmax, a causal mask built from index tensors: the
reference), with what the decomposition loses recorded on its function (`kope.attention`:
causal or not, the scale; `kope.passes.analysis.mark_attention`). That lowering writes every
score of every head to memory three times. Here, per head (heads split over threads):

1. K is packed transposed (D x keys, padded to whole chunks; blocks of a vector's lanes
   square transposed by shuffles in registers), so that a chunk of scores is vector loads
   along the keys;
2. per block of R query rows: the scores of every key chunk (R x C vectors of sums in
   registers, one broadcast of a query element and C loads of K per step along D), scaled,
   masked (the user's mask added, or -inf where a boolean one is False; keys past the end;
   under `causal` keys after the row) and kept in an R x keys scratch that stays in L1/L2,
   with each row's running maximum;
3. `exp(score - max)` over the scratch in place, with each row's sum;
4. the weighted sum of V's rows (R x G vectors of sums per group of G vectors along V's
   depth, one broadcast of a weight and G loads of V per key), divided by the row's sum.

q, k and v that reach the Task as views of a larger tensor (permuted out of one projection, as
attention layers write them) are read where they lie (`kope.vocabulary.layouts`, "strided"):
the kernel takes each as the 1-D span of its memory and finds a head's rows by the view's
strides, where copying the three contiguous cost several times the gain.

Grouped heads (`enable_gqa`: k and v with fewer heads than q) read the head of k and v their
group shares.

Under `causal` a block reads only the keys its last row may see. Any sequence lengths (a
ragged last block of rows; a ragged last chunk of keys scored only up to the next whole
vector, so a ViT's 197 keys cost 208 scores a row, not 256), head depths that are whole vectors,
f32. The softmax is two passes over the block's scores in cache, not flash attention's
online rescaling: a block's scores take R x keys x 4 bytes (8 rows of 4096 keys: 128 KB).
"""

from __future__ import annotations

import math
from typing import Any

from torch_mlir import ir

from kope.passes.analysis import Attention, PayloadInfo, heads_inner_strides, main_function
from kope.passes.approximate_math import NONPOSITIVE
from kope.spaces.writer import VectorWriter, blocks
from kope.vocabulary.layouts import LAYOUT_ATTR, span
from kope.vocabulary.layouts import strided as strided_layout

_FUNCTION = "kope_attention"
# A loop over keys: begin, stop, vectors of keys a step, whether it masks keys past a row's limit.
Span = tuple[int | str, int | str, int, bool]


def fits(attention: Attention, config: dict[str, Any]) -> bool:
    """Depths of whole vectors, V's vectors in whole groups, and threads that split the heads
    evenly (heads inner, into boxes of the output). (Whether a block's sums fit the machine's
    registers is the space's to say: `sums`.)"""
    lanes, rows, chunk, group = (
        int(config.get(k, 0)) for k in ("vector", "rows", "keys", "values")
    )
    threads = int(config.get("threads", 1))
    if min(lanes, rows, chunk, group, threads) <= 0 or attention.pairs % threads:
        return False
    per_thread, heads = attention.pairs // threads, attention.heads
    return (
        attention.depth % lanes == 0
        and attention.value_depth % lanes == 0
        and (attention.value_depth // lanes) % group == 0
        # Heads inner, a thread's output is a box: heads of one image, or whole images.
        and (not attention.heads_inner or heads % per_thread == 0 or per_thread % heads == 0)
    )


def sums(config: dict[str, Any]) -> int:
    """The vector registers a block's sums take: R x C scores, or R x G of the output."""
    rows = int(config["rows"])
    return rows * max(int(config["keys"]), int(config["values"]))


def value_group(rows: int, value_vectors: int, registers: int) -> int:
    """The most of V's vectors one pass of the weighted sum can keep `rows` rows of sums for
    in `registers`, in groups that divide V's vectors evenly."""
    fit = max(1, registers // max(rows, 1))
    return max(g for g in range(1, value_vectors + 1) if value_vectors % g == 0 and g <= fit)


def attention_kernel(payload: str, info: PayloadInfo, config: dict[str, Any]) -> str:
    """The kernel for a payload marked as attention: its function, under its own name, now
    calls `@kope_attention`, with `exp` as a polynomial that vectorizes
    (`kope.passes.approximate_math`)."""
    from kope.passes.approximate_math import ApproximateMath
    from kope.passes.pipeline import build_pass_manager

    assert info.attention is not None and fits(info.attention, config)
    context = ir.Context()
    context.enable_multithreading(False)
    function = main_function(ir.Module.parse(payload, context))
    name = ir.StringAttr(function.attributes["sym_name"]).value
    module = ir.Module.parse(attention_module(info.attention, config, name), context)
    build_pass_manager([ApproximateMath(), "canonicalize"], context).run(module.operation)
    return module.operation.get_asm(enable_debug_info=False)


def attention_module(attention: Attention, config: dict[str, Any], name: str = "main") -> str:
    """A kernel module: `@name(q, k, v[, mask]) -> out` on 4-D tensors (a mask of its own
    rank; a view among q, k and v as its span, in a strided layout), calling the attention."""
    a = attention
    q4 = f"tensor<{a.batch}x{a.heads}x{a.queries}x{a.depth}xf32>"
    kv_heads = a.heads // a.group
    k4 = f"tensor<{a.batch}x{kv_heads}x{a.keys}x{a.depth}xf32>"
    v4 = f"tensor<{a.batch}x{kv_heads}x{a.keys}x{a.value_depth}xf32>"
    o4 = f"tensor<{a.batch}x{a.heads}x{a.queries}x{a.value_depth}xf32>"
    writer = _Writer(a, config)
    o3 = writer.out_type
    helper = writer.function()
    params, operands, types, body = [], [], [], []
    for index, (operand, whole) in enumerate((("q", q4), ("k", k4), ("v", v4))):
        kind, strides = writer.types[operand], writer.views[operand]
        if strides is None:  # N x L x D: batch and heads as one dim
            params.append(f"%arg{index}: {whole}")
            body.append(
                f"%{operand} = tensor.collapse_shape %arg{index} [[0, 1], [2], [3]] : "
                f"{whole} into {kind}"
            )
            operands.append(f"%{operand}")
        else:  # the span of a view, read where it lies
            params.append(f'%arg{index}: {kind} {{{LAYOUT_ATTR} = "{strided_layout(strides)}"}}')
            operands.append(f"%arg{index}")
        types.append(kind)
    if a.mask:
        given = f"tensor<{'x'.join(map(str, a.mask))}x{writer.mask_element}>"
        params.append(f"%arg3: {given}")
        mask = "%arg3"
        if len(a.mask) < 4:  # unit dims before it
            lead = 4 - len(a.mask)
            groups = [list(range(lead + 1))] + [[d] for d in range(lead + 1, 4)]
            body.append(
                f"%mask = tensor.expand_shape %arg3 {groups} output_shape "
                f"[{', '.join(map(str, a.mask4))}] : {given} into {writer.mask_type}"
            )
            mask = "%mask"
        operands.append(mask)
        types.append(writer.mask_type)
    body += [
        f"%init = tensor.empty() : {o3}",
        f"%o = func.call @{_FUNCTION}({', '.join(operands)}, %init) : "
        f"({', '.join(types)}, {o3}) -> {o3}",
    ]
    if a.heads_inner:  # B x Lq x H x E, returned as its memory in the output's strides
        size = a.batch * a.queries * a.heads * a.value_depth
        flat = f"tensor<{size}xf32>"
        layout = strided_layout(heads_inner_strides((a.batch, a.heads, a.queries, a.value_depth)))
        body += [
            f"%out = tensor.collapse_shape %o [[0, 1, 2, 3]] : {o3} into {flat}",
            f"return %out : {flat}",
        ]
        result = f'({flat} {{{LAYOUT_ATTR} = "{layout}"}})'
    else:
        body += [
            f"%out = tensor.expand_shape %o [[0, 1], [2], [3]] output_shape "
            f"[{a.batch}, {a.heads}, {a.queries}, {a.value_depth}] : {o3} into {o4}",
            f"return %out : {o4}",
        ]
        result = o4
    inner = helper[helper.index("{") + 1 : helper.rindex("}")]
    return (
        "module {\n"
        f"func.func @{name}({', '.join(params)}) -> {result} {{\n  "
        + "\n  ".join(body)
        + "\n}\n"
        + inner
        + "}\n"
    )


class _Writer(VectorWriter):
    """`@kope_attention(q, k, v, init)` on N x L x D tensors (N = batch x heads) as text."""

    def __init__(self, attention: Attention, config: dict[str, Any]):
        super().__init__(int(config["vector"]))
        a = self.a = attention
        self.rows = int(config["rows"])
        self.chunk = int(config["keys"]) * self.lanes  # keys per chunk of scores
        self.chunk_vectors = int(config["keys"])
        self.threads = int(config.get("threads", 1))
        self.group = int(config["values"])  # V's vectors per pass of the weighted sum
        self.per_thread = a.pairs // self.threads
        # Keys padded to whole vectors, not whole chunks: a ragged last chunk is scored a
        # vector at a time (`key_spans`), so 65 keys cost 80 scores a row, not 128.
        self.padded_keys = math.ceil(a.keys / self.lanes) * self.lanes
        n, lq, lk = a.pairs, a.queries, a.keys
        kv_heads = a.heads // a.group
        shapes = {
            "q": (a.batch, a.heads, lq, a.depth),
            "k": (a.batch, kv_heads, lk, a.depth),
            "v": (a.batch, kv_heads, lk, a.value_depth),
        }
        # Where an operand is a view (its strides), the kernel takes its span, 1-D.
        self.views = dict(zip(shapes, a.views, strict=True))
        self.types = {}
        for name, shape in shapes.items():
            strides = self.views[name]
            pairs = shape[0] * shape[1]
            extent = f"{pairs}x{shape[2]}x{shape[3]}" if strides is None else span(shape, strides)
            self.types[name] = f"tensor<{extent}xf32>"
        self.q_type, self.k_type, self.v_type = self.types["q"], self.types["k"], self.types["v"]
        self.head_start: dict[str, str] = {}  # a view's first element of head %h
        self.kv_pair = "%h"  # the pair of k and v that head %h reads (`head_starts`)
        e = a.value_depth
        if a.heads_inner:  # B x Lq x H x E; a thread's box: heads of one image, or images
            self.box_heads = min(self.per_thread, a.heads)
            images = self.per_thread // self.box_heads
            self.out_type = f"tensor<{a.batch}x{lq}x{a.heads}x{e}xf32>"
            self.into_type = f"tensor<{images}x{lq}x{self.box_heads}x{e}xf32>"
        else:
            self.out_type = f"tensor<{n}x{lq}x{e}xf32>"
            self.into_type = f"tensor<{self.per_thread}x{lq}x{e}xf32>"
        self.kt_type = f"tensor<{a.depth}x{self.padded_keys}xf32>"
        self.scores_type = f"tensor<{self.rows}x{self.padded_keys}xf32>"
        self.ivec = f"vector<{self.lanes}xi32>"
        self.mask_element = "i1" if a.mask_bool else "f32"
        self.mask_type = f"tensor<{'x'.join(map(str, a.mask4))}x{self.mask_element}>"
        self.mask_at: list[str] = []  # the mask's image and head indices of the pair
        # Keys past the end, or (causal) after a row, are masked: not where every chunk is
        # whole and nothing is causal.
        self.masked = a.causal or a.keys % self.lanes != 0

    def function(self) -> str:
        a, lanes = self.a, self.lanes
        self.emit("%zero = arith.constant 0.0 : f32")
        self.emit("%one = arith.constant 1.0 : f32")
        self.emit("%ninf = arith.constant 0xFF800000 : f32")
        self.emit(f"%zeros = arith.constant dense<0.0> : {self.vec}")
        self.emit(f"%ninfs = arith.constant dense<0xFF800000> : {self.vec}")
        self.emit(f"%scale = arith.constant dense<{a.scale!r}> : {self.vec}")
        iota = ", ".join(str(i) for i in range(lanes))
        self.emit(f"%iota = arith.constant dense<[{iota}]> : {self.ivec}")
        self.emit("%false = arith.constant false")
        start = self.split_threads(
            self.threads,
            self.per_thread,
            "%hbase",
            self._placed_slab,
            self.out_type,
            self.into_type,
        )
        self.emit(f"%scratch = tensor.empty() : {self.scores_type}")
        self.loop(
            "%heads",
            "%hl",
            (0, self.per_thread, 1),
            [("%o0", start, self.into_type), ("%s0", "%scratch", self.scores_type)],
        )
        self.emit("%h = arith.addi %hbase, %hl : index")
        self.head_starts()
        if a.heads_inner:  # pair %hl's place in the thread's box
            box = self.index(self.box_heads)
            self.emit(f"%oimage = arith.divui %hl, {box} : index")
            self.emit(f"%ohead = arith.remui %hl, {box} : index")
        if a.mask:  # the mask's image and head of pair %h, where it has more than one
            mb, mh, _, _ = a.mask4
            self.mask_at = [self.index(0), self.index(0)]
            if mb > 1:
                self.emit(f"%mimage = arith.divui %h, {self.index(a.heads)} : index")
                self.mask_at[0] = "%mimage"
            if mh > 1:
                self.emit(f"%mhead = arith.remui %h, {self.index(a.heads)} : index")
                self.mask_at[1] = "%mhead"
        kt = self.pack_keys()
        out, scores = "%o0", "%s0"
        begin = 0
        for rows, count in blocks(a.queries, self.rows):
            result = self.fresh("qb")
            i0, o, s = self.fresh("i"), self.fresh("o"), self.fresh("s")
            self.loop(
                result,
                i0,
                (begin, begin + rows * count, rows),
                [(o, out, self.into_type), (s, scores, self.scores_type)],
            )
            o_next, s_next = self.query_block(rows, i0, o, s, kt)
            self.end_loop([o_next, s_next], [self.into_type, self.scores_type])
            out, scores = f"{result}#0", f"{result}#1"
            begin += rows * count
        self.end_loop([out, scores], [self.into_type, self.scores_type])
        result = self.join_threads(
            self.threads, "%heads#0", self._slab(), self.out_type, self.into_type
        )
        self.emit(f"return {result} : {self.out_type}")
        params = [f"%q: {self.q_type}", f"%k: {self.k_type}", f"%v: {self.v_type}"]
        if a.mask:
            params.append(f"%mask: {self.mask_type}")
        params.append(f"%init: {self.out_type}")
        return self.function_text(_FUNCTION, params, self.out_type)

    def _slab(self) -> str:
        """A thread's part of the output (offsets, sizes, strides), from its first pair %hbase
        (heads inner, through the offsets `_placed_slab` writes)."""
        a = self.a
        if not a.heads_inner:
            return f"[%hbase, 0, 0] [{self.per_thread}, {a.queries}, {a.value_depth}] [1, 1, 1]"
        images = self.per_thread // self.box_heads
        sizes = f"{images}, {a.queries}, {self.box_heads}, {a.value_depth}"
        return f"[%bimage, 0, %bhead, 0] [{sizes}] [1, 1, 1, 1]"

    def _placed_slab(self) -> str:
        """`_slab`, its offsets written first where it needs them."""
        if self.a.heads_inner:
            heads = self.index(self.a.heads)
            self.emit(f"%bimage = arith.divui %hbase, {heads} : index")
            self.emit(f"%bhead = arith.remui %hbase, {heads} : index")
        return self._slab()

    def head_starts(self) -> None:
        """Pair %h's head of k and v (`kv_pair`: grouped heads share one), and for each operand
        read where it lies, where head %h (image h / H, head h % H) begins."""
        a = self.a
        heads, group = self.index(a.heads), a.group
        if any(self.views.values()) or group > 1:
            self.emit(f"%himage = arith.divui %h, {heads} : index")
            self.emit(f"%hhead = arith.remui %h, {heads} : index")
        self.kv_pair, kv_head = "%h", "%hhead"
        if group > 1:  # image * H_kv + head / group
            self.emit(f"%kvhead = arith.divui %hhead, {self.index(group)} : index")
            self.emit(f"%kvbase = arith.muli %himage, {self.index(a.heads // group)} : index")
            self.emit("%kvpair = arith.addi %kvbase, %kvhead : index")
            self.kv_pair, kv_head = "%kvpair", "%kvhead"
        for name, strides in self.views.items():
            if strides is None:
                continue
            image, head, start = self.fresh("hi"), self.fresh("hh"), f"%{name}head"
            along = "%hhead" if name == "q" else kv_head
            self.emit(f"{image} = arith.muli %himage, {self.index(strides[0])} : index")
            self.emit(f"{head} = arith.muli {along}, {self.index(strides[1])} : index")
            self.emit(f"{start} = arith.addi {image}, {head} : index")
            self.head_start[name] = start

    def row_start(self, name: str, row: str) -> str | None:
        """Where row `row` of head %h of a view begins; None for an operand taken N x L x D."""
        strides = self.views[name]
        if strides is None:
            return None
        offset, start = self.fresh("ro"), self.fresh("rs")
        self.emit(f"{offset} = arith.muli {row}, {self.index(strides[2])} : index")
        self.emit(f"{start} = arith.addi {self.head_start[name]}, {offset} : index")
        return start

    def at(self, name: str, row: str, column: int, start: str | None = None) -> list[str]:
        """The indices of element (`row`, `column`) of head %h of operand `name` (its row's
        start, `row_start`, where the caller has it)."""
        if self.views[name] is None:
            return ["%h" if name == "q" else self.kv_pair, row, self.index(column)]
        start = start or self.row_start(name, row)
        assert start is not None
        return [self.add(start, column)]

    def pack_keys(self) -> str:
        """K of head %h transposed into D x padded keys: blocks of `lanes` keys x `lanes` of
        the depth read as rows and transposed in registers (`transpose`); the last keys, a
        block short, one key at a time, its lanes written down a column, over zeros."""
        a, lanes = self.a, self.lanes
        whole = a.keys - a.keys % lanes
        self.emit(f"%kt0 = tensor.empty() : {self.kt_type}")
        current = "%kt0"
        if whole < self.padded_keys:
            # The columns past the last whole block zeroed first: the scores of padding keys
            # are masked, but computed, and garbage there can be subnormal (each multiply by
            # one costs a microcode assist: 2x197 keys ran 7x slower).
            self.loop("%ktz", "%dz", (0, a.depth, 1), [("%kz", current, self.kt_type)])
            zeroed = "%kz"
            for column in range(whole, self.padded_keys, lanes):
                at = ["%dz", self.index(column)]
                zeroed = self.write("%zeros", zeroed, at, self.kt_type, True)
            self.end_loop([zeroed], [self.kt_type])
            current = "%ktz"
        if whole:
            self.loop("%ktb", "%jb", (0, whole, lanes), [("%kb", current, self.kt_type)])
            current = "%kb"
            keys = [self.add("%jb", r) for r in range(lanes)]
            for dv in range(a.depth // lanes):
                rows = [
                    self.read("%k", self.at("k", j, dv * lanes), self.k_type, True) for j in keys
                ]
                for d, transposed in enumerate(self.transpose(rows)):
                    at = [self.index(dv * lanes + d), "%jb"]
                    current = self.write(transposed, current, at, self.kt_type, True)
            self.end_loop([current], [self.kt_type])
            current = "%ktb"
        if whole == a.keys:
            return current
        self.loop("%kt", "%j", (whole, a.keys, 1), [("%ka", current, self.kt_type)])
        current = "%ka"
        start = self.row_start("k", "%j")
        for dv in range(a.depth // lanes):
            x = self.read("%k", self.at("k", "%j", dv * lanes, start), self.k_type, True)
            for lane in range(lanes):
                scalar, inserted = self.fresh("x"), self.fresh("kt")
                self.emit(f"{scalar} = vector.extract {x}[{lane}] : f32 from {self.vec}")
                self.emit(
                    f"{inserted} = tensor.insert {scalar} into {current}"
                    f"[{self.index(dv * lanes + lane)}, %j] : {self.kt_type}"
                )
                current = inserted
        self.end_loop([current], [self.kt_type])
        return "%kt"

    def transpose(self, rows: list[str]) -> list[str]:
        """A `lanes` x `lanes` block transposed in registers: for each bit of a lane index,
        rows i and i | b (b that bit) swap the lanes where their bits differ, one shuffle per
        row (log2(lanes) rounds of `lanes` shuffles, where lane by lane is lanes^2 moves)."""
        lanes, rows = self.lanes, list(rows)
        b = lanes // 2
        while b:
            low = [c if not c & b else lanes + c - b for c in range(lanes)]
            high = [c + b if not c & b else lanes + c for c in range(lanes)]
            for i in range(lanes):
                if i & b:
                    continue
                first, second = self.fresh("tr"), self.fresh("tr")
                pair = f"{rows[i]}, {rows[i | b]}"
                for name, mask in ((first, low), (second, high)):
                    self.emit(
                        f"{name} = vector.shuffle {pair} [{', '.join(map(str, mask))}] : "
                        f"{self.vec}, {self.vec}"
                    )
                rows[i], rows[i | b] = first, second
            b //= 2
        return rows

    def query_block(self, rows: int, i0: str, out: str, scores: str, kt: str) -> tuple[str, str]:
        """Rows i0 .. i0 + rows of head %h: scores, softmax, weighted sum; the output and the
        scratch after them."""
        a = self.a
        # The keys this block reads: all (padded to whole chunks), or under `causal` those up
        # to its last row's (the loops' bound then depends on the block).
        limits: list[str] = []  # per row: the first key it may not see, as a vector
        if a.causal:
            last = self.add(i0, rows)
            seen = self.fresh("kend")
            self.emit(f"{seen} = arith.minui {last}, {self.index(a.keys)} : index")
            spans, value_end = self.key_spans(seen), seen
        else:
            spans, value_end = self.key_spans(None), self.index(a.keys)
        if self.masked:
            for r in range(rows):
                bound = self.index(a.keys)
                if a.causal:
                    bound = self.fresh("lim")
                    self.emit(
                        f"{bound} = arith.minui {self.add(i0, r + 1)}, {self.index(a.keys)} : index"
                    )
                as_int, vector = self.fresh("lim"), self.fresh("limv")
                self.emit(f"{as_int} = arith.index_cast {bound} : index to i32")
                self.emit(f"{vector} = vector.broadcast {as_int} : i32 to {self.ivec}")
                limits.append(vector)
        maxima = ["%ninfs"] * rows
        for begin, stop, vectors, masked in spans:
            scores, maxima = self.scores(
                rows, i0, scores, maxima, kt, (begin, stop, vectors), limits if masked else []
            )
        weights, inverse = self.softmax(rows, scores, maxima, spans)
        return self.weighted_sum(rows, i0, out, weights, inverse, value_end), weights

    def key_spans(self, seen: str | None) -> list[Span]:
        """The keys a block scores, as loops (begin, stop, vectors a step, whether keys past a
        row's limit are in it): whole chunks, then the ragged rest up to the next whole vector
        (in one step; a vector a step under `causal`, where the rest differs by block). All
        keys where `seen` is None; under `causal`, the first `seen` (an SSA index: the
        block's last row's), every loop masked."""
        chunk, lanes = self.chunk, self.lanes
        if seen is None:
            whole = self.a.keys - self.a.keys % chunk
            spans: list[Span] = []
            if whole:
                spans.append((0, whole, self.chunk_vectors, False))
            if whole < self.padded_keys:  # one step of fewer vectors than a chunk
                rest = (self.padded_keys - whole) // lanes
                spans.append((whole, self.padded_keys, rest, self.masked))
            return spans
        chunks, chunked = self.fresh("kc"), self.fresh("kw")
        self.emit(f"{chunks} = arith.divui {seen}, {self.index(chunk)} : index")
        self.emit(f"{chunked} = arith.muli {chunks}, {self.index(chunk)} : index")
        up, vectors, end = self.fresh("ku"), self.fresh("kn"), self.fresh("ke")
        self.emit(f"{up} = arith.addi {seen}, {self.index(lanes - 1)} : index")
        self.emit(f"{vectors} = arith.divui {up}, {self.index(lanes)} : index")
        self.emit(f"{end} = arith.muli {vectors}, {self.index(lanes)} : index")
        return [(0, chunked, self.chunk_vectors, True), (chunked, end, 1, True)]

    def key_loop(
        self,
        names: tuple[str, str],
        keys_from: tuple[int | str, int | str, int],
        scratch: str,
        rows_from: list[str],
    ) -> tuple[str, str, str, list[str]]:
        """Open a loop over keys `begin` to `stop`, `vectors` of them a step (`keys_from`),
        carrying the block's scratch and a vector per row (from `rows_from`): its results,
        its key index, and the scratch's and the rows' names inside it."""
        begin, stop, vectors = keys_from
        result, j0, s = self.fresh(names[0]), self.fresh("j"), self.fresh("s")
        running = [self.fresh(names[1]) for _ in rows_from]
        self.loop(
            result,
            j0,
            (begin, stop, vectors * self.lanes),
            [(s, scratch, self.scores_type)]
            + [(name, init, self.vec) for name, init in zip(running, rows_from, strict=True)],
        )
        return result, j0, s, running

    def scores(
        self,
        rows: int,
        i0: str,
        scores: str,
        maxima: list[str],
        kt: str,
        keys_from: tuple[int | str, int | str, int],
        limits: list[str],
    ) -> tuple[str, list[str]]:
        """The scratch `scores` with the block's scaled scores of keys `begin` to `stop`
        (`keys_from`, `cv` vectors a step) written, each masked past its row's `limits` where
        given, and each row's running maximum (a vector, from `maxima`) over them."""
        lanes, cv = self.lanes, keys_from[2]
        result, j0, s, running = self.key_loop(("sc", "m"), keys_from, scores, maxima)
        q_rows = [self.add(i0, r) for r in range(rows)]
        q_starts = [self.row_start("q", row) for row in q_rows]
        keys = [self.add(j0, c * lanes) for c in range(cv)]
        sums = self.fresh("acc")
        d = self.fresh("d")
        carried = [(self.fresh("a"), "%zeros", self.vec) for _ in range(rows * cv)]
        self.loop(sums, d, (0, self.a.depth, 1), carried)
        loaded = [self.read(kt, [d, keys[c]], self.kt_type, True) for c in range(cv)]
        updated = []
        for r in range(rows):
            scalar, broadcast = self.fresh("q"), self.fresh("qb")
            start = q_starts[r]
            at = ["%h", q_rows[r], d] if start is None else [self.add_index(start, d)]
            self.emit(f"{scalar} = tensor.extract %q[{', '.join(at)}] : {self.q_type}")
            self.emit(f"{broadcast} = vector.broadcast {scalar} : f32 to {self.vec}")
            for c in range(cv):
                name = self.fresh("f")
                acc = carried[r * cv + c][0]
                self.emit(f"{name} = vector.fma {broadcast}, {loaded[c]}, {acc} : {self.vec}")
                updated.append(name)
        self.end_loop(updated, [self.vec] * len(updated))
        current = s
        maxima = list(running)
        for c in range(cv):
            keys_vector = None
            if limits:
                as_int, base = self.fresh("kix"), self.fresh("kb")
                keys_vector = self.fresh("kv")
                self.emit(f"{as_int} = arith.index_cast {keys[c]} : index to i32")
                self.emit(f"{base} = vector.broadcast {as_int} : i32 to {self.ivec}")
                self.emit(f"{keys_vector} = arith.addi {base}, %iota : {self.ivec}")
            for r in range(rows):
                value = self.fresh("sv")
                total = f"{sums}#{r * cv + c}" if rows * cv > 1 else sums
                self.emit(f"{value} = arith.mulf {total}, %scale : {self.vec}")
                if self.a.mask:
                    value = self.apply_mask(value, q_rows[r], keys[c])
                if keys_vector is not None:
                    inside, masked = self.fresh("in"), self.fresh("sm")
                    self.emit(
                        f"{inside} = arith.cmpi slt, {keys_vector}, {limits[r]} : {self.ivec}"
                    )
                    self.emit(
                        f"{masked} = arith.select {inside}, {value}, %ninfs : "
                        f"vector<{lanes}xi1>, {self.vec}"
                    )
                    value = masked
                current = self.write(
                    value, current, [self.index(r), keys[c]], self.scores_type, True
                )
                maximum = self.fresh("mx")
                self.emit(f"{maximum} = arith.maximumf {maxima[r]}, {value} : {self.vec}")
                maxima[r] = maximum
        self.end_loop([current, *maxima], [self.scores_type] + [self.vec] * rows)
        return f"{result}#0", [f"{result}#{r + 1}" for r in range(rows)]

    def apply_mask(self, value: str, row: str, key: str) -> str:
        """The scores `value` (of `row`, keys from `key`) with the mask added, or -inf where a
        bool mask is False. The mask's unit dims are read at 0; past its last key as 0."""
        _, _, mq, mk = self.a.mask4
        at = [*self.mask_at, row if mq > 1 else self.index(0)]
        element = self.mask_element
        vec = f"vector<{self.lanes}x{element}>"
        mask = self.fresh("mk")
        if mk > 1:
            pad = "%false" if self.a.mask_bool else "%zero"
            self.emit(
                f"{mask} = vector.transfer_read %mask[{', '.join(at)}, {key}], {pad} "
                f"{{in_bounds = [false]}} : {self.mask_type}, {vec}"
            )
        else:
            scalar = self.fresh("mks")
            self.emit(
                f"{scalar} = tensor.extract %mask[{', '.join(at)}, {self.index(0)}] : "
                f"{self.mask_type}"
            )
            self.emit(f"{mask} = vector.broadcast {scalar} : {element} to {vec}")
        result = self.fresh("sk")
        if self.a.mask_bool:
            self.emit(f"{result} = arith.select {mask}, {value}, %ninfs : {vec}, {self.vec}")
        else:
            self.emit(f"{result} = arith.addf {value}, {mask} : {self.vec}")
        return result

    def softmax(
        self,
        rows: int,
        scores: str,
        maxima: list[str],
        spans: list[Span],
    ) -> tuple[str, list[str]]:
        """The scratch `scores` with the scores of `spans` replaced by exp(score - the row's
        maximum, a vector of `maxima`); the reciprocal of each row's sum of them."""
        lanes = self.lanes
        shifts = []
        for r in range(rows):
            scalar, vector = self.fresh("rmax"), self.fresh("rmaxv")
            masked, shift = self.fresh("rnone"), self.fresh("rshift")
            self.emit(f"{scalar} = vector.reduction <maximumf>, {maxima[r]} : {self.vec} into f32")
            # A row whose every score is -inf (all masked) shifts by 0: its weights are then
            # all 0, and so is its output, as ATen's attention gives (not exp(nan)).
            self.emit(f"{masked} = arith.cmpf oeq, {scalar}, %ninf : f32")
            self.emit(f"{shift} = arith.select {masked}, %zero, {scalar} : f32")
            self.emit(f"{vector} = vector.broadcast {shift} : f32 to {self.vec}")
            shifts.append(vector)
        weights, sums = scores, ["%zeros"] * rows
        for begin, stop, vectors, _ in spans:
            result, j0, s, running = self.key_loop(
                ("ex", "l"), (begin, stop, vectors), weights, sums
            )
            current, totals = s, list(running)
            for c in range(vectors):
                key = self.add(j0, c * lanes)
                for r in range(rows):
                    x = self.read(current, [self.index(r), key], self.scores_type, True)
                    shifted, weight, total = self.fresh("d"), self.fresh("e"), self.fresh("ls")
                    self.emit(f"{shifted} = arith.subf {x}, {shifts[r]} : {self.vec}")
                    # score - the row's maximum: never positive (`NONPOSITIVE`)
                    self.emit(f"{weight} = math.exp {shifted} {{{NONPOSITIVE}}} : {self.vec}")
                    self.emit(f"{total} = arith.addf {totals[r]}, {weight} : {self.vec}")
                    totals[r] = total
                    at = [self.index(r), key]
                    current = self.write(weight, current, at, self.scores_type, True)
            self.end_loop([current, *totals], [self.scores_type] + [self.vec] * rows)
            weights, sums = f"{result}#0", [f"{result}#{r + 1}" for r in range(rows)]
        inverse = []
        for r in range(rows):
            scalar, reciprocal, vector = self.fresh("lsum"), self.fresh("rcp"), self.fresh("rv")
            empty, inverse_ = self.fresh("rnone"), self.fresh("rinv")
            self.emit(f"{scalar} = vector.reduction <add>, {sums[r]} : {self.vec} into f32")
            self.emit(f"{reciprocal} = arith.divf %one, {scalar} : f32")
            # A sum of 0 is a row with every score -inf (else its maximum adds exp(0) = 1).
            self.emit(f"{empty} = arith.cmpf oeq, {scalar}, %zero : f32")
            self.emit(f"{inverse_} = arith.select {empty}, %zero, {reciprocal} : f32")
            self.emit(f"{vector} = vector.broadcast {inverse_} : f32 to {self.vec}")
            inverse.append(vector)
        return weights, inverse

    def weighted_sum(
        self, rows: int, i0: str, out: str, weights: str, inverse: list[str], end: str
    ) -> str:
        """out[rows] = weights @ V / each row's sum, `values` of V's vectors at a time."""
        a, lanes = self.a, self.lanes
        vectors, group = a.value_depth // lanes, self.group
        current = out
        out_rows = [self.add(i0, r) for r in range(rows)]
        for g0 in range(0, vectors, group):
            sums, j = self.fresh("ws"), self.fresh("j")
            carried = [(self.fresh("w"), "%zeros", self.vec) for _ in range(rows * group)]
            self.loop(sums, j, (0, end, 1), carried)
            start = self.row_start("v", j)
            values = [
                self.read("%v", self.at("v", j, (g0 + g) * lanes, start), self.v_type, True)
                for g in range(group)
            ]
            updated = []
            for r in range(rows):
                scalar, broadcast = self.fresh("p"), self.fresh("pb")
                self.emit(
                    f"{scalar} = tensor.extract {weights}[{self.index(r)}, {j}] : "
                    f"{self.scores_type}"
                )
                self.emit(f"{broadcast} = vector.broadcast {scalar} : f32 to {self.vec}")
                for g in range(group):
                    name = self.fresh("f")
                    acc = carried[r * group + g][0]
                    self.emit(f"{name} = vector.fma {broadcast}, {values[g]}, {acc} : {self.vec}")
                    updated.append(name)
            self.end_loop(updated, [self.vec] * len(updated))
            for r in range(rows):
                for g in range(group):
                    total = f"{sums}#{r * group + g}" if rows * group > 1 else sums
                    scaled = self.fresh("o")
                    self.emit(f"{scaled} = arith.mulf {total}, {inverse[r]} : {self.vec}")
                    column = self.index((g0 + g) * lanes)
                    at = (
                        ["%oimage", out_rows[r], "%ohead", column]
                        if a.heads_inner
                        else ["%hl", out_rows[r], column]
                    )
                    current = self.write(scaled, current, at, self.into_type, True)
        return current
