"""A 2-D convolution computed as a matrix product: its windows laid out as columns (im2col),
then one product of the filters (F x C·KH·KW) by those columns (C·KH·KW x OH·OW).

The direct schedules (`schedules._conv`) vectorize along one output row: a 32-column row
holds two vectors, a 28-column one a vector and a masked rest, and every window position
re-reads the row. The product's columns are the whole output plane (OH·OW), so its register
tiles are whole vectors wherever the plane is, and its inner loop is the same outer product
as a matmul's. The price is the columns: C·KH·KW x OH·OW floats (KH·KW times the input),
which is why this is a decision and not the rule.

The rewrite happens in the payload, as `packed_kernel` rewrites a matmul's B: one op writes
the columns in panels, each element read from the input at its window's offset, and one
product reads them, so the columns are exactly the convolution's reads and the product
exactly its sum, in the same order over (c, kh, kw). The schedule writes the panels block
by block inside the product's cache loops, as GEMM libraries pack, so that a block is in
cache when the product reads it: written whole first, a 64-channel 56x56 convolution's
columns (7 MB a call) made it 1.5x slower. An output row that the panel width does not
divide is computed to whole panels (the input read with zero columns beyond its edge) and
the extra columns dropped: a partial register tile would be masked.
"""

from __future__ import annotations

import math

from torch_mlir import ir

from kope.passes.analysis import OpInfo, PayloadInfo
from kope.spaces.schedules import (
    Config,
    Script,
    attach,
    fit_tile,
    helper_function,
    k_tile,
    payload_op,
    replace_with_call,
)

CONV_2D = "linalg.conv_2d_nchw_fchw"
_FUNCTION = "kope_im2col_conv"
# Marks the op that writes the panels, for the schedule to find it after rewrites.
_PANELS = "kope.panels"


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
    the unroll divides it, and threads that split what `_schedule` splits evenly: the
    images, else the output rows, else the output channels in whole register tiles."""
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
        and (batch % threads == 0 or rows % threads == 0 or channels % (threads * mr) == 0)
    )


def im2col_kernel(payload: str, info: PayloadInfo, config: Config) -> str:
    """The payload with its convolution rewritten to panels and a product, and its schedule."""
    conv = conv_of(info)
    assert conv is not None and fits(info, config)
    context, module, op = payload_op(payload, CONV_2D)
    with context, ir.Location.unknown():
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
        ops = replace_with_call(module, op, list(op.operands), helper, _FUNCTION)
    products = [
        i
        for i, o in enumerate(ops)
        if o.name == "linalg.generic" and "reduction" in str(o.attributes["iterator_types"])
    ]
    panels = [i for i, o in enumerate(ops) if _PANELS in o.attributes]
    if len(products) != 1 or len(panels) != 1:
        names = [o.name for o in ops]
        raise ValueError(f"the im2col payload's ops are not panels and one product: {names}")
    product, packing = products[0], panels[0]
    shapes = [list(ir.RankedTensorType(o.results[0].type).shape) for o in ops]
    text = module.operation.get_asm(enable_debug_info=False)
    return attach(text, _schedule(conv, config, packing, product, shapes))


def _function(
    x: list[int],
    w: list[int],
    out: list[int],
    strides: list[int],
    dilations: list[int],
    nr: int,
) -> str:
    """`@kope_im2col_conv(padded input, filters, init) -> the convolution`.

    The columns are panels of `nr` plane columns (N x OH x OW'/nr x C·KH·KW x nr, as
    `packed_kernel` takes a matmul's B), so that a register tile reads its columns as one
    stream along the reduction. They are written by one op that reads each element straight
    from the input (`tensor.extract` at the window's offset), so the schedule can write each
    block of them just before the product uses it, while it is in cache: written whole, the
    columns of a 64-channel 56x56 convolution are 7 MB a call. OW' is the output row rounded
    up to whole panels: the input is read with zero columns beyond its edge, and the
    product's extra columns are dropped."""
    n, c, _, width = x
    f, _, kh, kw = w
    _, _, oh, ow = out
    wide = math.ceil(ow / nr) * nr
    k, jw = c * kh * kw, wide // nr
    # Columns the widest window position reads beyond the input row.
    extra = max(0, (kw - 1) * dilations[1] + (wide - 1) * strides[1] + 1 - width)
    x_t, w_t = _tensor(x), _tensor(w)
    body = ["%zero = arith.constant 0.0 : f32"]
    source, source_t = "%x", x_t
    if extra:
        source, source_t = "%xw", _tensor([n, c, x[2], width + extra])
        body += _pad("%xw", "%x", x_t, source_t, [0, 0, 0, extra])
    panels = _tensor([n, oh, jw, k, nr])
    loops = ", ".join(['"parallel"'] * 5)
    body += [
        f"%empty = tensor.empty() : {panels}",
        f"%panels = linalg.generic {{{_PANELS}, indexing_maps = [affine_map<(n, oh, jw, k, r) "
        f"-> (n, oh, jw, k, r)>], iterator_types = [{loops}]}} outs(%empty : {panels}) {{",
        "^bb0(%unused: f32):",
        "  %n = linalg.index 0 : index",
        "  %oh = linalg.index 1 : index",
        "  %jw = linalg.index 2 : index",
        "  %k = linalg.index 3 : index",
        "  %r = linalg.index 4 : index",
        # k runs over (c, kh, kw), as the filters collapse.
        f"  %c = affine.apply affine_map<(k) -> (k floordiv {kh * kw})>(%k)",
        f"  %kh = affine.apply affine_map<(k) -> ((k mod {kh * kw}) floordiv {kw})>(%k)",
        f"  %kw = affine.apply affine_map<(k) -> (k mod {kw})>(%k)",
        f"  %row = affine.apply affine_map<(oh, kh) -> (oh * {strides[0]} + kh * "
        f"{dilations[0]})>(%oh, %kh)",
        f"  %col = affine.apply affine_map<(jw, r, kw) -> ((jw * {nr} + r) * {strides[1]} + "
        f"kw * {dilations[1]})>(%jw, %r, %kw)",
        f"  %v = tensor.extract {source}[%n, %c, %row, %col] : {source_t}",
        "  linalg.yield %v : f32",
        f"}} -> {panels}",
    ]
    out_t = _tensor(out)
    init, init_t = "%init", out_t
    if wide != ow:
        init, init_t = "%initw", _tensor([n, f, oh, wide])
        body += _pad("%initw", "%init", out_t, init_t, [0, 0, 0, wide - ow])
    c5 = _tensor([n, f, oh, jw, nr])
    body += [
        f"%a = tensor.collapse_shape %w [[0], [1, 2, 3]] : {w_t} into {_tensor([f, k])}",
        f"%c = tensor.expand_shape {init} [[0], [1], [2], [3, 4]] output_shape [{n}, {f}, "
        f"{oh}, {jw}, {nr}] : {init_t} into {c5}",
        "%product = linalg.generic {indexing_maps = ["
        "affine_map<(n, m, oh, jw, r, k) -> (m, k)>, "
        "affine_map<(n, m, oh, jw, r, k) -> (n, oh, jw, k, r)>, "
        "affine_map<(n, m, oh, jw, r, k) -> (n, m, oh, jw, r)>], iterator_types = "
        '["parallel", "parallel", "parallel", "parallel", "parallel", "reduction"]} '
        f"ins(%a, %panels : {_tensor([f, k])}, {panels}) outs(%c : {c5}) {{",
        "^bb0(%u: f32, %v: f32, %acc: f32):",
        "  %uv = arith.mulf %u, %v : f32",
        "  %sum = arith.addf %acc, %uv : f32",
        "  linalg.yield %sum : f32",
        f"}} -> {c5}",
        f"%wide = tensor.collapse_shape %product [[0], [1], [2], [3, 4]] : {c5} into {init_t}",
    ]
    result = "%wide"
    if wide != ow:
        body.append(
            f"%result = tensor.extract_slice %wide[0, 0, 0, 0] [{n}, {f}, {oh}, {ow}] "
            f"[1, 1, 1, 1] : {init_t} to {out_t}"
        )
        result = "%result"
    body.append(f"return {result} : {out_t}")
    return helper_function(_FUNCTION, [f"%x: {x_t}", f"%w: {w_t}", f"%init: {out_t}"], out_t, body)


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
    conv: OpInfo, config: Config, packing: int, product: int, shapes: list[list[int]]
) -> str:
    """Threads over images, bands of output rows or output channels; cache blocks of
    (output rows x panels x reduction), each block of panels written just before the
    product reads it; register tiles of mr channels x one panel."""
    mr, nr, kr = config["register"]
    threads = config.get("threads", 1)
    batch, channels, rows = conv.ranges[:3]
    wide = panel_row(conv, nr)
    jw = wide // nr
    k = depth(conv)
    s = Script(vectorize_all=False)
    handle = s.match_op(product)
    panels = s.match_op(packing)
    band, per_thread = rows, channels
    if threads > 1:
        sizes = [0] * 6
        if batch % threads == 0:
            sizes[0] = batch // threads
        elif rows % threads == 0:
            band = sizes[2] = rows // threads
        else:
            per_thread = sizes[1] = channels // threads
        handle, loop = s.tile_forall(handle, sizes)
        panels, _ = s.fuse_into(panels, loop)
    # A block of about cache[1] plane columns: panels of one output row, or whole rows.
    columns = config["cache"][1]
    if wide >= columns:
        block_rows, block_panels = 1, fit_tile(jw, max(1, columns // nr), 1)
    else:
        block_rows, block_panels = fit_tile(band, max(1, columns // wide), 1), jw
    kc = k_tile(k, config["cache"][2], kr)
    # Every output channel in one block: the block of panels is written once.
    cached, loops = s.tile_for(handle, [1, per_thread, block_rows, block_panels, 0, kc])
    panels, _ = s.fuse_into(panels, loops[-1])
    # The block's panels a row of one panel at a time, the row's unit loops folded, so that
    # the input row is read as one contiguous vector where the window's stride is 1.
    _, row_loops = s.tile_for(panels, [1, 1, 1, 1, 0])
    s.emit(
        f"transform.apply_patterns to {row_loops[-1]} {{\n"
        "    transform.apply_patterns.linalg.fold_unit_extent_dims_via_reshapes\n"
        "  } : !transform.any_op"
    )
    folded = s.fresh("row")
    s.emit(
        f'{folded} = transform.structured.match ops{{["linalg.generic"]}} in {row_loops[-1]} '
        ": (!transform.any_op) -> !transform.any_op"
    )
    s.emit(
        f"transform.structured.vectorize {folded} vector_sizes [{nr}] "
        "{vectorize_nd_extract} : !transform.any_op"
    )
    registers, _ = s.tile_for(cached, [1, mr, 1, 1, nr, kr])
    s.vectorize(registers, [1, mr, 1, 1, nr, kr])
    # The init (a bias broadcast, or zeros): rows of the output plane.
    for index, shape in enumerate(shapes):
        if index in (packing, product) or not shape:
            continue
        tiled, _ = s.tile_for(s.match_op(index), [1] * (len(shape) - 1) + [0])
        s.vectorize(tiled, [1] * (len(shape) - 1) + shape[-1:])
    s.vectorize_function("outerproduct", drop_unit_dims=True, form_contractions=True)
    return s.text()
