"""A Task's eager call as plain JSON, so that a stored task can be re-measured without its model
(`kope memory remeasure`); the store holds it in `TaskRecord.eager`."""

from __future__ import annotations

from typing import Any

import torch

from kope.memory.schema import TaskRecord
from kope.task import Task
from kope.vocabulary.specs import InputRef, OpCall, Program, StepRef, TaskSpec, TensorSpec


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


def task_from_record(record: TaskRecord, payload: str) -> Task | None:
    """The Task a stored record describes (no fx nodes: for re-measuring), or None when the
    record holds no eager call (tasks recorded before KOPE stored it)."""
    if record.eager is None:
        return None
    spec = TaskSpec(
        record.label,
        tuple(TensorSpec(tuple(shape), dtype) for shape, dtype in record.inputs),
        tuple(TensorSpec(tuple(shape), dtype) for shape, dtype in record.outputs),
        eager_from_json(record.eager),
    )
    return Task([], [], spec, payload, record.key, record.workload)


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
        return {type(value).__name__: [_encode(v) for v in value]}
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
    return torch.device(value["device"])
