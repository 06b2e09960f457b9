"""Fill an experience store for lit tests of the passes that read one.

    make_store.py STORE FUNCS.mlir "FUNC key=value ..." ...

Each record argument adds one attempt for the function FUNC of FUNCS.mlir (typically the output
of `kope-opt --kope-outline-operators`). The task key is computed as kope-outline-operators
computes it (`kope.passes.keys`, for the record's target), so the store answers for that
function. Keys:

    source=agent|eager|reference   (default agent)
    verdict=verified|mismatch|...  (default verified)
    kernel=PATH      the attempt's kernel text is this file
    kernel=payload   ... is FUNC itself, renamed @main (an unscheduled kernel)
    kernel=missing   ... is recorded by digest only: its text is not in the store
    form=mlir|triton               the form of the kernel text (default mlir)
    target=cpu|cuda|ascend         the target the function was outlined for (default cpu)
    latency_us=F eager_us=F        timings; speedup_vs_eager is their ratio
"""

from __future__ import annotations

import sys
from pathlib import Path

from torch_mlir import ir

from kope.memory import AttemptRecord, ExperienceStore, TaskRecord
from kope.passes.keys import canonical_function, task_key, workload_digest
from kope.targets import get_target


def find(module: ir.Module, name: str) -> ir.Operation:
    for view in module.body.operations:
        op = view.operation
        if op.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == name:
            return op
    sys.exit(f"make_store.py: no func.func @{name} in the functions file")


def main(argv: list[str]) -> None:
    store_dir, funcs_file, *records = argv
    context = ir.Context()
    module = ir.Module.parse(Path(funcs_file).read_text(), context)
    store = ExperienceStore(store_dir)
    for record in records:
        name, *pairs = record.split()
        fields = dict(pair.split("=", 1) for pair in pairs)
        func = find(module, name)
        target = fields.get("target", "cpu")
        target_key = get_target(target).key()
        canonical = canonical_function(func)
        key = task_key(canonical, target_key)
        attrs = func.attributes
        label = ir.StringAttr(attrs["kope.label"]).value if "kope.label" in attrs else name
        op = label.split("(")[0]
        workload = workload_digest(canonical)
        store.add_task(TaskRecord(key, op, label, workload, [], [], target, target_key))
        latency = float(fields["latency_us"]) if "latency_us" in fields else None
        eager = float(fields["eager_us"]) if "eager_us" in fields else None
        attempt = AttemptRecord(
            task=key,
            source=fields.get("source", "agent"),
            verdict=fields.get("verdict", "verified"),
            latency_us=latency,
            eager_us=eager,
            speedup_vs_eager=eager / latency if latency and eager else None,
            form=fields.get("form", "mlir"),
        )
        kernel = fields.get("kernel")
        if kernel == "missing":
            attempt.artifact = "0" * 64
            store.add_attempt(attempt)
        elif kernel == "payload":
            store.add_attempt(attempt, artifact=canonical)
        elif kernel is not None:
            store.add_attempt(attempt, artifact=Path(kernel).read_text())
        else:
            store.add_attempt(attempt)
    store.close()


if __name__ == "__main__":
    main(sys.argv[1:])
