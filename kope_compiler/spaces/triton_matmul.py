"""The matmul family: a multiply-add contraction as `tl.dot` tiles, the epilogue fused.

`triton-matmul` takes a multiply-add reduction with M, N and K loops (mm, bmm, addmm, linear)
and writes it as a `tl.dot` tile loop in the manner of inductor's mm template; the pointwise
ops that consume the product are computed on the accumulator tile before it is stored.
"""

from __future__ import annotations

import math
from typing import Any

from torch_mlir import ir

from kope.spaces.triton_family import (
    HEADER,
    MATMUL,
    Config,
    Kernel,
    NoSpecials,
    indent,
    launch_source,
    pow2,
)
from kope.spaces.triton_index import ZERO, Index, address, delinearize, linearize
from kope.spaces.triton_ir import (
    Payload,
    Unsupported,
    dim_positions,
    iterators,
    maps,
    owner,
    plain,
    ranges,
    shape,
    strip_reshapes,
)
from kope.spaces.triton_lowering import Lowering
from kope.spaces.triton_ops import CASTS
from kope.spaces.triton_scope import Scalar
from kope.targets.triton_rules import TritonRules
from kope.vocabulary.specs import TensorSpec


def contraction_roles(op: ir.Operation) -> dict[str, list[int]] | None:
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


class _MatmulFrame(NoSpecials):
    """The contraction's result is the accumulator, read at the tile's own coordinates."""

    def __init__(self, op: ir.Operation, idx: tuple[Index, ...]) -> None:
        self.op = op
        self.idx = idx

    def reduction(self, extents: list[int]) -> tuple[list[Index], str]:
        raise Unsupported("a reduction besides the contraction")

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
class Matmul(Kernel):
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
        roles = contraction_roles(op)
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
            max(16, min(bm, pow2(self.m))),
            max(16, min(bn, pow2(self.n))),
            max(16, min(bk, pow2(self.k))),
        )

    def waste(self, bm: int, bn: int) -> float:
        padded = math.ceil(self.m / bm) * bm * math.ceil(self.n / bn) * bn
        return math.log2(padded / (self.m * self.n))

    def footprint(self, bm: int, bn: int, bk: int) -> int:
        ea, eb = self.itemsize
        return bm * bk * ea + bk * bn * eb + bm * bn * 4

    def smallest_footprint(self, rules: TritonRules) -> int:
        return min(self.footprint(*self.clamp(t.m, t.n, t.k)) for t in rules.matmul_tiles)

    def space(self, rules: TritonRules) -> list[tuple[Config, float]]:
        found: dict[str, tuple[Config, float]] = {}
        for tile in rules.matmul_tiles:
            bm, bn, bk = self.clamp(tile.m, tile.n, tile.k)
            config: Config = {"family": MATMUL, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
            if rules.group_m is not None:
                config["GROUP_M"] = rules.group_m
            if rules.num_warps:
                config["num_warps"] = rules.nearest_warps(tile.warps)
            if rules.num_stages:
                config["num_stages"] = rules.nearest_stages(tile.stages)
            nbytes = self.footprint(bm, bn, bk)
            for buffered in rules.multibuffer or (None,):
                if not rules.fits(nbytes, buffered):
                    continue
                point = config if buffered is None else {**config, "multibuffer": buffered}
                key = repr(sorted(point.items()))
                score = tile.prior - 1.5 * self.waste(bm, bn) + (0.5 if buffered else 0.0)
                if key not in found or found[key][1] < score:
                    found[key] = (point, score)
        return list(found.values())

    def source(self, config: Config, rules: TritonRules) -> str:
        bm, bn, bk = (int(config[k]) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
        grid_m, grid_n = math.ceil(self.m / bm), math.ceil(self.n / bn)
        (a, ta), (b, tb) = self.operands
        if ta != tb or ta == "float32":
            a, b = (f"{x}.to(tl.float32)" if t != "float32" else x for x, t in self.operands)
        precision = "tf32" if rules.allow_tf32 else "ieee"
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
        grouped = rules.dot_programs is None and rules.group_m is not None
        constexprs = ["BLOCK_M", "BLOCK_N", "BLOCK_K"] + (["GROUP_M"] if grouped else [])
        params = [*self.names, *self.outs, *(f"{c}: tl.constexpr" for c in constexprs)]
        text = HEADER + f"\n\n@triton.jit\ndef _kope_matmul({', '.join(params)}):\n"
        kwargs: dict[str, Any] = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
        tiles = grid_m * grid_n
        if rules.dot_programs is not None:
            # A few programs, each looping over its share of the tiles of every batch.
            total = tiles * self.batch
            programs = min(total, rules.dot_programs)
            text += f"    for tile in range(tl.program_id(0), {total}, {programs}):\n"
            order = [
                f"batch = (tile // {tiles}){self.wide}",
                f"pid_m = (tile // {grid_n}) % {grid_m}",
                f"pid_n = tile % {grid_n}",
            ]
            text += indent([*order, *tile], 2)
            grid = str(programs)
        else:
            order = ["pid = tl.program_id(0)", f"batch = tl.program_id(1){self.wide}"]
            if grouped:
                # Grouped order (inductor's and the Triton tutorial's): GROUP_M row tiles
                # share their column tiles of B while those are still in L2.
                order += [
                    f"width = GROUP_M * {grid_n}",
                    "first_m = (pid // width) * GROUP_M",
                    f"group_m = tl.minimum({grid_m} - first_m, GROUP_M)",
                    "pid_m = first_m + (pid % width) % group_m",
                    "pid_n = (pid % width) // group_m",
                ]
                kwargs["GROUP_M"] = int(config.get("GROUP_M") or rules.group_m or 1)
            else:
                order += [f"pid_m = pid // {grid_n}", f"pid_n = pid % {grid_n}"]
            text += indent([*order, *tile], 1)
            grid = f"{tiles}, {self.batch}"
        if rules.num_warps:
            kwargs["num_warps"] = int(config.get("num_warps", 4))
        if rules.num_stages:
            kwargs["num_stages"] = int(config.get("num_stages", 3))
        return text + launch_source("_kope_matmul", grid, [*self.names, *self.outs], kwargs)
