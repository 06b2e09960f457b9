"""A 2-D convolution computed as a matrix product: its windows copied into columns (im2col),
then one product of the filters (F x C·KH·KW) by those columns (C·KH·KW x OH·OW).

The direct schedules (`schedules._conv`) vectorize along one output row: a 32-column row
holds two vectors, a 28-column one a vector and a masked rest, and every window position
re-reads the row. The product's columns are the whole output plane (OH·OW), so its register
tiles are whole vectors wherever the plane is, and its inner loop is the same outer product
as a matmul's. The price is the copy: C·KH·KW x OH·OW floats written once per call (KH·KW
times the input), which is why this is a decision and not the rule.

The rewrite happens in the payload, as `packed_kernel` rewrites a matmul's B: each window
position (kh, kw) is one strided slice of the padded input copied into its rows of the
columns (a copy vectorized along the output row), so the copies are exactly the
convolution's reads and the product exactly its sum, in the same order over (c, kh, kw).
An output row that the panel width does not divide is computed to whole panels (the input
read with zero columns beyond its edge) and the extra columns dropped: a partial register
tile would be masked.
"""

from __future__ import annotations

import math

from torch_mlir import ir
from torch_mlir.passmanager import PassManager

from kope.passes.analysis import OP_ATTR, OpInfo, PayloadInfo
from kope.spaces.schedules import (
    Config,
    Script,
    attach,
    fit_tile,
    k_tile,
)

CONV_2D = "linalg.conv_2d_nchw_fchw"
_FUNCTION = "kope_im2col_conv"


def conv_of(info: PayloadInfo) -> OpInfo | None:
    return next((op for op in info.ops if op.name == CONV_2D), None)


def panel_row(conv: OpInfo, nr: int) -> int:
    """The output row rounded up to whole panels of `nr` columns."""
    return math.ceil(conv.ranges[3] / nr) * nr


def depth(conv: OpInfo) -> int:
    """C·KH·KW: the product's reduction."""
    return conv.ranges[4] * conv.ranges[5] * conv.ranges[6]


def fits(info: PayloadInfo, config: Config) -> bool:
    """f32, every extent static, an input read as it is (not spread into zeros by a strided
    insert), and tiles whole: register tiles dividing the output channels (a partial tile
    would be masked), panels at most a third zero columns, the reduction unrolled only where
    the unroll divides it, and threads that split the batch, the panels or the output
    channels evenly."""
    conv = conv_of(info)
    if conv is None or info.element_type != "f32" or not all(conv.ranges):
        return False
    if info.strided_insert:  # a transposed convolution's input spread into zeros
        return False
    mr, nr, kr = config["register"]
    threads = config.get("threads", 1)
    batch, channels, rows, row = conv.ranges[:4]
    padded = panel_row(conv, nr)
    return (
        channels % mr == 0
        and 3 * (padded - row) <= padded
        and depth(conv) % kr == 0
        and (
            batch % threads == 0
            or (rows * padded // nr) % threads == 0
            or channels % (threads * mr) == 0
        )
    )


def im2col_kernel(payload: str, info: PayloadInfo, config: Config) -> str:
    """The payload with its convolution rewritten to copies and a product, and its schedule."""
    conv = conv_of(info)
    assert conv is not None and fits(info, config)
    context = ir.Context()
    context.enable_multithreading(False)
    module = ir.Module.parse(payload, context)
    with context, ir.Location.unknown():
        main = next(op.operation for op in module.body if op.operation.name == "func.func")
        op = next(
            o.operation for o in main.regions[0].blocks[0].operations if o.operation.name == CONV_2D
        )
        strides = [int(v) for v in ir.DenseIntElementsAttr(op.attributes["strides"])]
        dilations = [int(v) for v in ir.DenseIntElementsAttr(op.attributes["dilations"])]
        x_type = ir.RankedTensorType(op.operands[0].type)
        w_type = ir.RankedTensorType(op.operands[1].type)
        out_type = ir.RankedTensorType(op.results[0].type)
        helper = ir.Module.parse(
            _function(
                list(x_type.shape),
                list(w_type.shape),
                list(out_type.shape),
                strides,
                dilations,
                config["register"][1],
            ),
            context,
        )
        module.body.append(next(iter(helper.body)).operation)
        with ir.InsertionPoint(op):
            call = ir.Operation.create(
                "func.call",
                results=[op.results[0].type],
                operands=list(op.operands),
                attributes={"callee": ir.FlatSymbolRefAttr.get(_FUNCTION)},
            )
        op.results[0].replace_all_uses_with(call.results[0])
        op.erase()
        PassManager.parse("builtin.module(inline, symbol-dce, canonicalize, cse)").run(
            module.operation
        )
        main = next(op.operation for op in module.body if op.operation.name == "func.func")
        ops = [
            o.operation
            for o in main.regions[0].blocks[0].operations
            if o.operation.name.startswith("linalg.")
        ]
        i64 = ir.IntegerType.get_signless(64)
        for index, o in enumerate(ops):
            o.attributes[OP_ATTR] = ir.IntegerAttr.get(i64, index)
    copies = [i for i, o in enumerate(ops) if o.name == "linalg.transpose"]
    products = [
        i
        for i, o in enumerate(ops)
        if o.name == "linalg.generic" and "reduction" in str(o.attributes["iterator_types"])
    ]
    if len(copies) != conv.ranges[5] * conv.ranges[6] or len(products) != 1:
        names = [o.name for o in ops]
        raise ValueError(f"the im2col payload's ops are not copies and one product: {names}")
    product = products[0]
    shapes = [list(ir.RankedTensorType(o.results[0].type).shape) for o in ops]
    text = module.operation.get_asm(enable_debug_info=False)
    return attach(text, _schedule(conv, config, copies, product, shapes))


def _function(
    x: list[int],
    w: list[int],
    out: list[int],
    strides: list[int],
    dilations: list[int],
    nr: int,
) -> str:
    """`@kope_im2col_conv(padded input, filters, init) -> the convolution`.

    The columns are written straight into panels of `nr` plane columns (N x J x C·KH·KW x nr,
    J = OH·OW' / nr, as `packed_kernel` takes a matmul's B), so that a register tile reads
    its columns as one stream along the reduction: rows of the plain OH·OW-long columns lie
    4 KB and more apart, and a 16x32x32 convolution's product ran 2.5x slower on them. OW' is
    the output row rounded up to whole panels: the input is read with zero columns beyond
    its edge, and the product's extra columns are dropped."""
    n, c, _, width = x
    f, _, kh, kw = w
    _, _, oh, ow = out
    wide = math.ceil(ow / nr) * nr
    k, p, jw = c * kh * kw, oh * wide, wide // nr
    j = oh * jw
    # Columns the widest window position reads beyond the input row.
    extra = max(0, (kw - 1) * dilations[1] + (wide - 1) * strides[1] + 1 - width)
    x_t, w_t = _tensor(x), _tensor(w)
    body = ["%zero = arith.constant 0.0 : f32"]
    source, source_t = "%x", x_t
    if extra:
        source, source_t = "%xw", _tensor([n, c, x[2], width + extra])
        body += _pad("%xw", "%x", x_t, source_t, [0, 0, 0, extra])
    panels = _tensor([n, oh, jw, c, kh, kw, nr])
    window = _tensor([n, c, oh, wide])
    split = _tensor([n, c, oh, jw, nr])
    placed = _tensor([n, oh, jw, c, nr])
    body.append(f"%panels0 = tensor.empty() : {panels}")
    last = "%panels0"
    count = 0
    for i in range(kh):
        for jj in range(kw):
            count += 1
            di, dj = i * dilations[0], jj * dilations[1]
            at = (
                f"[0, 0, 0, 0, {i}, {jj}, 0] [{n}, {oh}, {jw}, {c}, 1, 1, {nr}] "
                "[1, 1, 1, 1, 1, 1, 1]"
            )
            body += [
                f"%src{count} = tensor.extract_slice {source}[0, 0, {di}, {dj}] "
                f"[{n}, {c}, {oh}, {wide}] [1, 1, {strides[0]}, {strides[1]}] : {source_t} "
                f"to {window}",
                f"%split{count} = tensor.expand_shape %src{count} [[0], [1], [2], [3, 4]] "
                f"output_shape [{n}, {c}, {oh}, {jw}, {nr}] : {window} into {split}",
                f"%dst{count} = tensor.extract_slice {last}{at} : {panels} to {placed}",
                f"%copy{count} = linalg.transpose ins(%split{count} : {split}) "
                f"outs(%dst{count} : {placed}) permutation = [0, 2, 3, 1, 4]",
                f"%panels{count} = tensor.insert_slice %copy{count} into {last}{at} : {placed} "
                f"into {panels}",
            ]
            last = f"%panels{count}"
    out_t = _tensor(out)
    init, init_t = "%init", out_t
    if wide != ow:
        init, init_t = "%initw", _tensor([n, f, oh, wide])
        body += _pad("%initw", "%init", out_t, init_t, [0, 0, 0, wide - ow])
    c4 = _tensor([n, f, j, nr])
    flat = _tensor([n, f, p])
    b_t = _tensor([n, j, k, nr])
    body += [
        f"%a = tensor.collapse_shape %w [[0], [1, 2, 3]] : {w_t} into {_tensor([f, k])}",
        f"%b = tensor.collapse_shape {last} [[0], [1, 2], [3, 4, 5], [6]] : {panels} into {b_t}",
        f"%flat = tensor.collapse_shape {init} [[0], [1], [2, 3]] : {init_t} into {flat}",
        f"%c = tensor.expand_shape %flat [[0], [1], [2, 3]] output_shape [{n}, {f}, {j}, "
        f"{nr}] : {flat} into {c4}",
        "%product = linalg.generic {indexing_maps = ["
        "affine_map<(n, m, j, r, k) -> (m, k)>, affine_map<(n, m, j, r, k) -> (n, j, k, r)>, "
        "affine_map<(n, m, j, r, k) -> (n, m, j, r)>], iterator_types = "
        '["parallel", "parallel", "parallel", "parallel", "reduction"]} '
        f"ins(%a, %b : {_tensor([f, k])}, {b_t}) outs(%c : {c4}) {{",
        "^bb0(%u: f32, %v: f32, %acc: f32):",
        "  %uv = arith.mulf %u, %v : f32",
        "  %sum = arith.addf %acc, %uv : f32",
        "  linalg.yield %sum : f32",
        f"}} -> {c4}",
        f"%rows = tensor.collapse_shape %product [[0], [1], [2, 3]] : {c4} into {flat}",
        f"%wide = tensor.expand_shape %rows [[0], [1], [2, 3]] output_shape [{n}, {f}, {oh}, "
        f"{wide}] : {flat} into {init_t}",
    ]
    result = "%wide"
    if wide != ow:
        body.append(
            f"%result = tensor.extract_slice %wide[0, 0, 0, 0] [{n}, {f}, {oh}, {ow}] "
            f"[1, 1, 1, 1] : {init_t} to {out_t}"
        )
        result = "%result"
    body.append(f"return {result} : {out_t}")
    return (
        f"module {{\nfunc.func private @{_FUNCTION}(%x: {x_t}, %w: {w_t}, %init: {out_t}) "
        f"-> {out_t} {{\n  " + "\n  ".join(body) + "\n}\n}\n"
    )


def _pad(name: str, value: str, from_t: str, to_t: str, high: list[int]) -> list[str]:
    """`name = value` with zeros after it along each dim by `high`."""
    return [
        f"{name} = tensor.pad {value} low[0, 0, 0, 0] high{high} {{",
        "^bb0(%i0: index, %i1: index, %i2: index, %i3: index):",
        "  tensor.yield %zero : f32",
        f"}} : {from_t} to {to_t}",
    ]


def _tensor(shape: list[int]) -> str:
    return f"tensor<{'x'.join(map(str, shape))}xf32>"


def _schedule(
    conv: OpInfo, config: Config, copies: list[int], product: int, shapes: list[list[int]]
) -> str:
    mr, nr, kr = config["register"]
    threads = config.get("threads", 1)
    batch, channels = conv.ranges[:2]
    k = depth(conv)
    panels = conv.ranges[2] * panel_row(conv, nr) // nr
    s = Script(vectorize_all=False)
    # Each copy is (n, oh, jw, c, r): one channel's output row at a time, in panels of nr;
    # threads take whole images, else bands of output rows.
    for index in copies:
        _, rows, jw, _, _ = shapes[index]
        copy = s.match_op(index)
        if threads > 1 and batch % threads == 0:
            copy, _ = s.tile_forall(copy, [batch // threads, 0, 0, 0, 0])
        elif threads > 1:
            copy, _ = s.tile_forall(copy, [0, math.ceil(rows / threads), 0, 0, 0])
        tiled, _ = s.tile_for(copy, [1, 1, 0, 1, 0])
        func = s.parent_function(tiled)
        s.vectorize(tiled, [1, 1, jw, 1, nr])
        # The slices fold into the transfers before anything else sees them: a read of a
        # whole slice written whole to another canonicalizes to a slice copy, which
        # bufferizes to a strided memref.copy, copied a scalar at a time.
        s.emit(
            f"transform.apply_patterns to {func} {{\n"
            "    transform.apply_patterns.tensor.fold_tensor_subset_ops_into_vector_transfers\n"
            "  } : !transform.any_op"
        )
    handle = s.match_op(product)
    # Threads split the batch, else the panels (the channels are often fewer than two
    # register tiles each), else the output channels.
    per_thread, rows = panels, channels
    if threads > 1 and batch % threads == 0:
        handle, _ = s.tile_forall(handle, [batch // threads, 0, 0, 0, 0])
    elif threads > 1 and panels % threads == 0:
        per_thread = panels // threads
        handle, _ = s.tile_forall(handle, [0, 0, per_thread, 0, 0])
    elif threads > 1:
        rows = channels // threads
        handle, _ = s.tile_forall(handle, [0, rows, 0, 0, 0])
    mc = fit_tile(rows, config["cache"][0], mr)
    jc = fit_tile(per_thread, max(1, config["cache"][1] // nr), 1)
    kc = k_tile(k, config["cache"][2], kr)
    cached, _ = s.tile_for(handle, [1, mc, jc, nr, kc])
    registers, _ = s.tile_for(cached, [1, mr, 1, nr, kr])
    s.vectorize(registers, [1, mr, 1, nr, kr])
    # The init (a bias broadcast, or zeros) and anything after the product: rows of the
    # output plane.
    for index, shape in enumerate(shapes):
        if index in copies or index == product or not shape:
            continue
        tiled, _ = s.tile_for(s.match_op(index), [1] * (len(shape) - 1) + [0])
        s.vectorize(tiled, [1] * (len(shape) - 1) + shape[-1:])
    s.vectorize_function("outerproduct", drop_unit_dims=True, form_contractions=True)
    return s.text()
