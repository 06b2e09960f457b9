"""A stored task made a Task again, so that it can be re-measured without its model (`kope
memory remeasure`): the store holds its eager call as JSON in `TaskRecord.eager` (the codec is
`kope.vocabulary.specs.eager_json`)."""

from __future__ import annotations

from kope.core.task import Task
from kope.memory.schema import TaskRecord
from kope.vocabulary.specs import TaskSpec, TensorSpec, eager_from_json


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
        tuple(tuple(s) for s in record.strides or ()),
    )
    return Task([], [], spec, payload, record.key, record.workload)
