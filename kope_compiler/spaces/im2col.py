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
columns (a plain 3-D copy, vectorized along the output row), so the copies are exactly the
convolution's reads and the product exactly its sum, in the same order over (c, kh, kw).
"""

from __future__ import annotations

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


def plane(conv: OpInfo) -> int:
    """The output plane OH·OW: the product's columns."""
    return conv.ranges[2] * conv.ranges[3]


def depth(conv: OpInfo) -> int:
    """C·KH·KW: the product's reduction."""
    return conv.ranges[4] * conv.ranges[5] * conv.ranges[6]


def fits(info: PayloadInfo, config: Config) -> bool:
    """f32, batch 1 (the columns of a batch would be a batch of products), every extent
    static, an input read as it is (not spread into zeros by a strided insert), and tiles
    whole: register tiles dividing the channels and the plane (a partial tile would
    be masked), the reduction unrolled only where the unroll divides it."""
    conv = conv_of(info)
    if conv is None or info.element_type != "f32" or not all(conv.ranges):
        return False
    if info.strided_insert:  # a transposed convolution's input spread into zeros
        return False
    mr, nr, kr = config["register"]
    threads = config.get("threads", 1)
    channels, columns = conv.ranges[1], plane(conv)
    return (
        conv.ranges[0] == 1
        and channels % mr == 0
        and conv.ranges[3] % nr == 0
        and (columns // nr) % threads == 0
        and depth(conv) % kr == 0
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
    """`@kope_im2col_conv(padded input, filters, init) -> the convolution`, batch 1.

    The columns are written straight into panels of `nr` plane columns (J x C·KH·KW x nr,
    J = OH·OW / nr, as `packed_kernel` takes a matmul's B), so that a register tile reads
    its columns as one stream along the reduction: rows of the plain OH·OW-long columns lie
    4 KB and more apart, and a 16x32x32 convolution's product ran 2.5x slower on them."""
    _, c, _, _ = x
    f, _, kh, kw = w
    _, _, oh, ow = out
    k, p, jw = c * kh * kw, oh * ow, ow // nr
    j = oh * jw
    x_t, w_t = _tensor(x), _tensor(w)
    panels = _tensor([oh, jw, c, kh, kw, nr])
    window = _tensor([c, oh, ow])
    split = _tensor([c, oh, jw, nr])
    placed = _tensor([oh, jw, c, nr])
    body = [f"%panels0 = tensor.empty() : {panels}"]
    last = "%panels0"
    n = 0
    for i in range(kh):
        for jj in range(kw):
            n += 1
            di, dj = i * dilations[0], jj * dilations[1]
            at = f"[0, 0, 0, {i}, {jj}, 0] [{oh}, {jw}, {c}, 1, 1, {nr}] [1, 1, 1, 1, 1, 1]"
            body += [
                f"%src{n} = tensor.extract_slice %x[0, 0, {di}, {dj}] [1, {c}, {oh}, {ow}] "
                f"[1, 1, {strides[0]}, {strides[1]}] : {x_t} to {window}",
                f"%split{n} = tensor.expand_shape %src{n} [[0], [1], [2, 3]] output_shape "
                f"[{c}, {oh}, {jw}, {nr}] : {window} into {split}",
                f"%dst{n} = tensor.extract_slice {last}{at} : {panels} to {placed}",
                f"%copy{n} = linalg.transpose ins(%split{n} : {split}) outs(%dst{n} : "
                f"{placed}) permutation = [1, 2, 0, 3]",
                f"%panels{n} = tensor.insert_slice %copy{n} into {last}{at} : {placed} into "
                f"{panels}",
            ]
            last = f"%panels{n}"
    out_t = _tensor([1, f, oh, ow])
    c3 = _tensor([f, j, nr])
    body += [
        f"%a = tensor.collapse_shape %w [[0], [1, 2, 3]] : {w_t} into {_tensor([f, k])}",
        f"%b = tensor.collapse_shape {last} [[0, 1], [2, 3, 4], [5]] : {panels} into "
        f"{_tensor([j, k, nr])}",
        f"%flat = tensor.collapse_shape %init [[0, 1], [2, 3]] : {out_t} into {_tensor([f, p])}",
        f"%c = tensor.expand_shape %flat [[0], [1, 2]] output_shape [{f}, {j}, {nr}] : "
        f"{_tensor([f, p])} into {c3}",
        "%product = linalg.generic {indexing_maps = ["
        "affine_map<(m, j, r, k) -> (m, k)>, affine_map<(m, j, r, k) -> (j, k, r)>, "
        'affine_map<(m, j, r, k) -> (m, j, r)>], iterator_types = ["parallel", "parallel", '
        f'"parallel", "reduction"]}} ins(%a, %b : {_tensor([f, k])}, {_tensor([j, k, nr])}) '
        f"outs(%c : {c3}) {{",
        "^bb0(%u: f32, %v: f32, %acc: f32):",
        "  %uv = arith.mulf %u, %v : f32",
        "  %sum = arith.addf %acc, %uv : f32",
        "  linalg.yield %sum : f32",
        f"}} -> {c3}",
        f"%rows = tensor.collapse_shape %product [[0], [1, 2]] : {c3} into {_tensor([f, p])}",
        f"%result = tensor.expand_shape %rows [[0, 1], [2, 3]] output_shape [1, {f}, {oh}, "
        f"{ow}] : {_tensor([f, p])} into {out_t}",
        f"return %result : {out_t}",
    ]
    return (
        f"module {{\nfunc.func private @{_FUNCTION}(%x: {x_t}, %w: {w_t}, %init: {out_t}) "
        f"-> {out_t} {{\n  " + "\n  ".join(body) + "\n}\n}\n"
    )


def _tensor(shape: list[int]) -> str:
    return f"tensor<{'x'.join(map(str, shape))}xf32>"


def _schedule(
    conv: OpInfo, config: Config, copies: list[int], product: int, shapes: list[list[int]]
) -> str:
    mr, nr, kr = config["register"]
    threads = config.get("threads", 1)
    channels, k = conv.ranges[1], depth(conv)
    panels = plane(conv) // nr
    s = Script(vectorize_all=False)
    # Each copy is (oh, jw, c, r): one channel's output row at a time, in panels of nr.
    for index in copies:
        oh, jw, c, _ = shapes[index]
        tiled, _ = s.tile_for(s.match_op(index), [1, 0, 1, 0])
        func = s.parent_function(tiled)
        s.vectorize(tiled, [1, jw, 1, nr])
        # The slices fold into the transfers before anything else sees them: a read of a
        # whole slice written whole to another canonicalizes to a slice copy, which
        # bufferizes to a strided memref.copy, copied a scalar at a time.
        s.emit(
            f"transform.apply_patterns to {func} {{\n"
            "    transform.apply_patterns.tensor.fold_tensor_subset_ops_into_vector_transfers\n"
            "  } : !transform.any_op"
        )
    handle = s.match_op(product)
    # Threads split the panels (the channels are often fewer than two register tiles each).
    if threads > 1:
        handle, _ = s.tile_forall(handle, [0, panels // threads, 0, 0])
    mc = fit_tile(channels, config["cache"][0], mr)
    jc = fit_tile(panels // threads, max(1, config["cache"][1] // nr), 1)
    kc = k_tile(k, config["cache"][2], kr)
    cached, _ = s.tile_for(handle, [mc, jc, nr, kc])
    registers, _ = s.tile_for(cached, [mr, 1, nr, kr])
    s.vectorize(registers, [mr, 1, nr, kr])
    # The init (a bias broadcast, or zeros) and anything after the product: rows of the
    # output plane.
    for index, shape in enumerate(shapes):
        if index in copies or index == product or not shape:
            continue
        tiled, _ = s.tile_for(s.match_op(index), [1] * (len(shape) - 1) + [0])
        s.vectorize(tiled, [1] * (len(shape) - 1) + shape[-1:])
    s.vectorize_function("outerproduct", drop_unit_dims=True, form_contractions=True)
    return s.text()
