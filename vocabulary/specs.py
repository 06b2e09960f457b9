"""What an operator is to every room: tensor specs, the eager call, the task spec, a kernel.

Plain data, so that it crosses into worker processes and into the store.
"""

from __future__ import annotations

import itertools
import keyword
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

# The dtypes KOPE's tasks may carry, with the short names labels and MLIR element types use.
# A target accepts a subset (`Target.dtypes`); uint8 is "u8" here, "i8" to MLIR.
DTYPES = {
    "float64": "f64",
    "float32": "f32",
    "float16": "f16",
    "bfloat16": "bf16",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "uint8": "u8",
    "bool": "i1",
}
# MLIR's element types of those dtypes: the short names, but MLIR integers are signless.
MLIR_ELEMENTS = {**DTYPES, "uint8": "i8"}


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one kernel argument; kernels are specialised on static shapes."""

    shape: tuple[int, ...]
    dtype: str  # a torch dtype name: "float32", "int64", "bool", ...

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorSpec:
        return cls(tuple(int(s) for s in t.shape), dtype_name(t.dtype))

    def __str__(self) -> str:
        dims = "x".join(str(s) for s in self.shape)
        short = DTYPES.get(self.dtype, self.dtype)
        return f"{dims}x{short}" if dims else short


def dtype_name(dtype: torch.dtype) -> str:
    """The name `TensorSpec.dtype` and `DTYPES` use for a torch dtype ("float32", ...)."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class InputRef:
    """Stands for the kernel's i-th input inside an `OpCall`'s arguments."""

    index: int


@dataclass(frozen=True)
class OpCall:
    """How to run an operator eagerly: an ATen overload by name, tensor arguments as `InputRef`s.

    This is the baseline every kernel is timed against and the oracle of the reference lowering.
    It is plain data so that it can cross into a worker process.
    """

    op: str  # e.g. "aten.mm.default"
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()

    def resolve(self) -> Callable[..., Any]:
        namespace, name, overload = self.op.split(".")
        return getattr(getattr(getattr(torch.ops, namespace), name), overload)

    def bind(self, inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
        """A zero-argument callable running the op on `inputs` (for timing loops)."""
        fn = self.resolve()
        fn = getattr(fn, "_op", fn)  # the overload's C++ entry: no Python frame of its own
        args = _substitute(self.args, inputs)
        kwargs = {k: _substitute(v, inputs) for k, v in self.kwargs}
        return lambda: fn(*args, **kwargs)

    def __call__(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        out = self.bind(inputs)()
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


@dataclass(frozen=True)
class StepRef:
    """Stands for the result of an earlier step of a `Program` (its `index`-th, if several)."""

    step: int
    index: int | None = None


@dataclass(frozen=True)
class Program:
    """A few ATen calls in order: the eager baseline of a fused group of operators."""

    steps: tuple[OpCall, ...]
    outputs: tuple[StepRef, ...]

    @property
    def op(self) -> str:
        return "+".join(step.op for step in self.steps)

    def bind(self, inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
        """A zero-argument callable running the steps on `inputs`, written out as straight
        code: each step one call of its overload's C++ entry on names bound once, as the
        model's own graph makes its calls. Interpreting the steps (each argument looked up
        and each overload entered through its Python `__call__` on every call) cost a
        GPT-2 MLP's fused linear + GELU (ten ATen calls) 33 µs a call more than the same
        calls written out: a baseline that slow made the kernels beside it look faster
        than they run in the model."""
        namespace: dict[str, Any] = {}
        constants = itertools.count()

        def expression(value: Any) -> str:
            if isinstance(value, InputRef):
                namespace[f"i{value.index}"] = inputs[value.index]
                return f"i{value.index}"
            if isinstance(value, StepRef):
                return f"v{value.step}" + ("" if value.index is None else f"[{value.index}]")
            if isinstance(value, list):
                return f"[{', '.join(expression(v) for v in value)}]"
            if isinstance(value, tuple):
                return f"({''.join(expression(v) + ', ' for v in value)})"
            name = f"c{next(constants)}"
            namespace[name] = value
            return name

        lines = ["def run():"]
        for k, step in enumerate(self.steps):
            fn = step.resolve()
            namespace[f"f{k}"] = getattr(fn, "_op", fn)
            args = [expression(a) for a in step.args]
            named = [(key, expression(v)) for key, v in step.kwargs]
            args += [f"{key}={e}" for key, e in named if _plain_name(key)]
            if odd := [f"{key!r}: {e}" for key, e in named if not _plain_name(key)]:
                args.append(f"**{{{', '.join(odd)}}}")  # a schema's `from`: no keyword argument
            lines.append(f"    v{k} = f{k}({', '.join(args)})")
        outputs = [expression(ref) for ref in self.outputs]
        lines.append(f"    return ({', '.join(outputs)},)")
        exec(compile("\n".join(lines) + "\n", "<kope eager program>", "exec"), namespace)
        return cast(Callable[[], Any], namespace["run"])

    def step_values(self, inputs: Sequence[torch.Tensor]) -> list[Any]:
        """What each step returns on `inputs`, in order (the group's intermediates too)."""
        return _run([(step.resolve(), step) for step in self.steps], inputs)

    def __call__(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """One run (an oracle's): the steps interpreted, as `bind`'s code would cost a compile
        per call; a timing loop calls `bind` once."""
        values = self.step_values(inputs)
        return tuple(_substitute(ref, inputs, values) for ref in self.outputs)


def _plain_name(key: str) -> bool:
    return key.isidentifier() and not keyword.iskeyword(key)


def _run(calls: Sequence[tuple[Callable[..., Any], OpCall]], inputs: Sequence[Any]) -> list[Any]:
    values: list[Any] = []
    for fn, step in calls:
        args = _substitute(step.args, inputs, values)
        kwargs = {k: _substitute(v, inputs, values) for k, v in step.kwargs}
        values.append(fn(*args, **kwargs))
    return values


def _substitute(value: Any, inputs: Sequence[torch.Tensor], values: Sequence[Any] = ()) -> Any:
    if isinstance(value, InputRef):
        return inputs[value.index]
    if isinstance(value, StepRef):
        result = values[value.step]
        return result if value.index is None else result[value.index]
    if isinstance(value, (list, tuple)):
        return type(value)(_substitute(v, inputs, values) for v in value)
    return value


@dataclass(frozen=True)
class TaskSpec:
    """One operator as a target sees it: its signature and its eager baseline.

    `eager` is None for an operator known only as IR (a function in a `kope-optimize`
    pipeline): its reference lowering is then its oracle and its baseline. `strides`: the
    strides (elements) the model passes each input in, where known (empty: contiguous), so
    that a kernel is timed on inputs laid out as its calls will get them (`timing_inputs`)."""

    label: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    eager: OpCall | Program | None
    strides: tuple[tuple[int, ...], ...] = ()


# -- the eager call as JSON (the store keeps it; a kernel pack carries it) -----------------------
def eager_json(call: OpCall | Program | None) -> dict[str, Any] | None:
    """The eager call as JSON the store can hold, or None if there is none or an argument has
    no encoding."""
    if call is None:
        return None
    try:
        if isinstance(call, Program):
            return {
                "steps": [_encode_call(s) for s in call.steps],
                "outputs": [_encode(r) for r in call.outputs],
            }
        return _encode_call(call)
    except TypeError:
        return None


def eager_from_json(data: dict[str, Any]) -> OpCall | Program:
    """The eager call `eager_json` encoded."""
    if "steps" in data:
        return Program(
            tuple(_decode_call(s) for s in data["steps"]),
            tuple(_decode(r) for r in data["outputs"]),
        )
    return _decode_call(data)


def _encode_call(call: OpCall) -> dict[str, Any]:
    return {
        "op": call.op,
        "args": [_encode(a) for a in call.args],
        "kwargs": [[k, _encode(v)] for k, v in call.kwargs],
    }


def _decode_call(data: dict[str, Any]) -> OpCall:
    return OpCall(
        data["op"],
        tuple(_decode(a) for a in data["args"]),
        tuple((k, _decode(v)) for k, v in data["kwargs"]),
    )


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, InputRef):
        return {"input": value.index}
    if isinstance(value, StepRef):
        return {"step": value.step, "index": value.index}
    if isinstance(value, (list, tuple)):
        # fx hands some arguments over as its `immutable_list`: a list all the same.
        kind = "tuple" if isinstance(value, tuple) else "list"
        return {kind: [_encode(v) for v in value]}
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return {"torch": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    raise TypeError(f"no JSON form for {type(value).__name__}")


def _decode(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    if "input" in value:
        return InputRef(value["input"])
    if "step" in value:
        return StepRef(value["step"], value["index"])
    if "list" in value:
        return [_decode(v) for v in value["list"]]
    if "tuple" in value:
        return tuple(_decode(v) for v in value["tuple"])
    if "torch" in value:
        return getattr(torch, value["torch"])
    if "device" in value:
        return torch.device(value["device"])
    if "immutable_list" in value:  # written by KOPE before it encoded fx's lists as lists
        return [_decode(v) for v in value["immutable_list"]]
    raise ValueError(f"no eager-call value is encoded as {sorted(value)}")
