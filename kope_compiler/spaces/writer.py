"""A text writer for the functions that payload rewrites put where an op was (the depthwise
row blocks, attention): fresh SSA names, index constants made once at the function's entry,
`scf.for` loops that carry values, and vector transfers.

The functions are written on tensors, as a payload is; bufferization makes the transfers
in place. `function_text` returns the helper as a module for `schedules.replace_with_call`."""

from __future__ import annotations

from collections.abc import Callable

from kope.spaces.schedules import helper_function


class VectorWriter:
    """One helper function's body as lines of MLIR; `vec` is the vector type transfers use
    unless told another, `%zero` the f32 padding value they read past an edge."""

    def __init__(self, lanes: int):
        self.lanes = lanes
        self.vec = f"vector<{lanes}xf32>"
        self.lines: list[str] = []
        self.counter = 0
        self.constants: dict[int, str] = {}

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"%{prefix}{self.counter}"

    def emit(self, line: str) -> None:
        self.lines.append(line)

    def index(self, value: int) -> str:
        """An index constant, defined once at the function's entry."""
        if value not in self.constants:
            self.constants[value] = f"%i{value}" if value >= 0 else f"%im{-value}"
        return self.constants[value]

    def add(self, base: str, offset: int) -> str:
        if offset == 0:
            return base
        name = self.fresh("ix")
        self.emit(f"{name} = arith.addi {base}, {self.index(offset)} : index")
        return name

    def add_index(self, a: str, b: str) -> str:
        """a + b, two SSA index values."""
        name = self.fresh("ix")
        self.emit(f"{name} = arith.addi {a}, {b} : index")
        return name

    def loop(
        self,
        results: str,
        iv: str,
        bounds: tuple[int | str, int | str, int | str],
        carried: list[tuple[str, str, str]],
    ) -> None:
        """`results = scf.for iv = low to high step step iter_args(name = init, ...)`; a bound
        is an int (made a constant) or an SSA index; `carried` holds (name, init, type). With
        several carried values, `results` names them as `results#i`."""
        low, high, step = (self.index(b) if isinstance(b, int) else b for b in bounds)
        names = ", ".join(f"{name} = {init}" for name, init, _ in carried)
        types = ", ".join(type_ for _, _, type_ in carried)
        head = f"{results}:{len(carried)}" if len(carried) > 1 else results
        self.emit(
            f"{head} = scf.for {iv} = {low} to {high} step {step} "
            f"iter_args({names}) -> ({types}) {{"
        )

    def end_loop(self, values: list[str], types: list[str]) -> None:
        self.emit(f"scf.yield {', '.join(values)} : {', '.join(types)}")
        self.emit("}")

    def read(self, source: str, indices: list[str], type_: str, whole: bool, vec: str = "") -> str:
        name = self.fresh("v")
        self.emit(
            f"{name} = vector.transfer_read {source}[{', '.join(indices)}], %zero "
            f"{{in_bounds = [{_bool(whole)}]}} : {type_}, {vec or self.vec}"
        )
        return name

    def write(
        self, value: str, into: str, indices: list[str], type_: str, whole: bool, vec: str = ""
    ) -> str:
        name = self.fresh("t")
        self.emit(
            f"{name} = vector.transfer_write {value}, {into}[{', '.join(indices)}] "
            f"{{in_bounds = [{_bool(whole)}]}} : {vec or self.vec}, {type_}"
        )
        return name

    def split_threads(
        self,
        threads: int,
        per_thread: int,
        base: str,
        slab: str | Callable[[], str],
        out_type: str,
        into_type: str,
    ) -> str:
        """Where `threads` > 1, open an `scf.forall` over them that shares `%init` (of
        `out_type`): `base` is each thread's first index along the dim they split,
        `per_thread` apart, and `slab` (offsets, sizes and strides, in terms of `base`; or
        what writes the offsets it needs from `base` and returns them) its part (of
        `into_type`). What the body writes into: that part, or `%init`."""
        if threads == 1:
            self.emit(f"{base} = arith.constant 0 : index")
            return "%init"
        self.emit(
            f"%result = scf.forall (%t) in ({threads}) shared_outs(%o = %init) -> ({out_type}) {{"
        )
        self.emit(f"{base} = arith.muli %t, {self.index(per_thread)} : index")
        where = slab if isinstance(slab, str) else slab()
        self.emit(f"%slab = tensor.extract_slice %o{where} : {out_type} to {into_type}")
        return "%slab"

    def join_threads(
        self, threads: int, written: str, slab: str, out_type: str, into_type: str
    ) -> str:
        """Close `split_threads`'s loop, each thread's `written` part put in its place; the
        result."""
        if threads == 1:
            return written
        self.emit("scf.forall.in_parallel {")
        self.emit(
            f"tensor.parallel_insert_slice {written} into %o{slab} : {into_type} into {out_type}"
        )
        self.emit("}")
        self.emit("}")
        return "%result"

    def function_text(self, name: str, params: list[str], result: str) -> str:
        """The helper as a module: its index constants first, then the lines written."""
        constants = [f"{n} = arith.constant {v} : index" for v, n in self.constants.items()]
        return helper_function(name, params, result, constants + self.lines)


def blocks(extent: int, size: int) -> list[tuple[int, int]]:
    """(block size, how many) covering `extent`: the whole blocks, then one of what is left."""
    whole = [(size, extent // size)] if extent >= size else []
    return whole + ([(extent % size, 1)] if extent % size else [])


def _bool(value: bool) -> str:
    return "true" if value else "false"
