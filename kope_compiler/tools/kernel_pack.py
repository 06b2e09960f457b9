"""Kernel packs: Triton kernels taken to the device's machine, and its figures brought back.

A machine with the device (a lent GPU host, a typical NPU host) has another Python and torch
than KOPE's and no torch-mlir, so KOPE does not run there; its kernels do. `export_pack`
writes, for each task of a Triton target in the store, the verified Triton kernels (the
candidates and the chosen one), the task's eager call, one trial's inputs and the outputs the
reference lowering computes from them here, the tolerance to compare with, and the runner
(`kope.targets.pack_runner`, with the two modules it loads). `import_results` records what
the runner measured there as attempts of the tasks under the device's own target key: the
same operator (canonical IR) keyed for that device, each kernel linked to the attempt that
verified it here. A kernel measured by a second run of a pack confirms its first figure, and
only a confirmed figure can pin a kernel (`kope.memory.standing.winner`).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import kope.targets.pack_runner as pack_runner
import kope.targets.triton_sandbox as triton_sandbox
import kope.vocabulary.specs as specs
from kope.core.errors import KopeError
from kope.memory.schema import AttemptRecord, TaskRecord
from kope.memory.store import ExperienceStore
from kope.passes.keys import task_key
from kope.targets import verify
from kope.targets.device_compile import estimate_of, failed
from kope.targets.host import package_version
from kope.targets.measure import estimate_work
from kope.targets.triton import triton_target_key
from kope.tools.eager_json import task_from_record
from kope.tuner.measuring import announce, recording
from kope.vocabulary.events import AttemptEvaluated, TaskSeen
from kope.vocabulary.evidence import (
    TIMING_CLEAN,
    TIMING_CONTAMINATED,
    VERDICTS,
    VERIFIED,
    Evaluation,
    Timing,
)
from kope.vocabulary.kernels import FORM_MLIR, FORM_TRITON, Kernel

log = logging.getLogger("kope.pack")

# What a pack may weigh: the device tool carries 64 MiB in all, the repository included.
PACK_LIMIT_BYTES = 40 << 20
# A figure whose rounds spread more than this (max-min over min) is contaminated.
CLEAN_SPREAD = 0.10
# The files of the runner, copied into every pack.
RUNNER_FILES = {
    "runner.py": pack_runner.__file__,
    "triton_sandbox.py": triton_sandbox.__file__,
    "specs.py": specs.__file__,
}


@dataclass
class PackSummary:
    path: Path
    tasks: int = 0
    kernels: int = 0
    bytes: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (label, why)


def export_pack(
    store: ExperienceStore,
    target: str,
    out: Path,
    limit_bytes: int = PACK_LIMIT_BYTES,
    per_task: int | None = None,
) -> PackSummary:
    """Write the store's verified Triton kernels of `target` and what the runner needs to
    verify and time them into the folder `out`.

    On a target that compiles for GPU architectures (`TritonTarget.architectures`), a kernel
    goes in only if Triton's compiler took it for every one of them and it fits each (an
    attempt verified before KOPE compiled kernels is compiled now, in an isolated worker);
    each task's kernels go in the order of their roofline estimates, the `per_task` best
    where given, so a short device run times the likeliest first."""
    found: list[tuple[TaskRecord, list[AttemptRecord]]] = []
    for record in store.tasks():
        if record.target != target:
            continue
        verified = [
            a
            for a in store.attempts(record.key)
            if a.form == FORM_TRITON and a.verdict == VERIFIED and a.artifact
        ]
        if verified:
            found.append((record, verified))
    if not found:
        # An empty pack would only send someone to the device for nothing.
        raise KopeError(
            f"the store at {store.root} holds no verified Triton kernel for target {target!r}, "
            f"so there is nothing to export: run `kope precompile MODEL --target {target}` "
            f"into it first (without the device, Triton's interpreter verifies the kernels)"
        )
    from kope.targets import get_target

    made = get_target(target, workers=1)
    architectures: tuple[str, ...] = getattr(made, "architectures", ())
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels").mkdir(exist_ok=True)
    (out / "data").mkdir(exist_ok=True)
    for name, source in RUNNER_FILES.items():
        shutil.copyfile(source, out / name)
    summary = PackSummary(out, bytes=sum((out / n).stat().st_size for n in RUNNER_FILES))
    tasks: dict[str, Any] = {}
    kernels: list[dict[str, Any]] = []
    try:
        for record, verified in found:
            entry, why = _task_entry(store, record, out, limit_bytes - summary.bytes)
            if entry is None:
                summary.skipped.append((record.label, why))
                continue
            ready = _device_ready(store, record, verified, made, architectures, summary)
            if not ready:
                summary.skipped.append(
                    (record.label, "no verified kernel compiles for " + ", ".join(architectures))
                )
                (out / entry["data"]).unlink()
                continue
            summary.bytes += entry.pop("bytes")
            tasks[record.key] = entry
            for attempt, text, compiled in ready[:per_task]:
                digest = Kernel(text, FORM_TRITON).digest
                path = f"kernels/{digest[:24]}.py"
                (out / path).write_text(text)
                summary.bytes += len(text.encode())
                kernels.append(
                    {
                        "task": record.key,
                        "digest": digest,
                        "path": path,
                        "attempt": attempt.id,
                        "decision": attempt.decision,
                        "device_compile": compiled,
                    }
                )
    finally:
        made.close()
    manifest = {
        "id": uuid.uuid4().hex,
        "created": time.time(),
        "target": target,
        "kope": package_version("kope"),
        "architectures": list(architectures),
        "tasks": tasks,
        "kernels": kernels,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    summary.tasks, summary.kernels = len(tasks), len(kernels)
    return summary


def _device_ready(
    store: ExperienceStore,
    record: TaskRecord,
    verified: list[AttemptRecord],
    target: Any,
    architectures: tuple[str, ...],
    summary: PackSummary,
) -> list[tuple[AttemptRecord, str, dict[str, Any] | None]]:
    """The task's distinct verified kernels that compile for every architecture, each with
    its compile records, best roofline estimate first (all of them, in the store's order,
    where nothing is compiled); a refused kernel is noted in `summary.skipped`."""
    ready: list[tuple[float, int, AttemptRecord, str, dict[str, Any] | None]] = []
    seen: set[str] = set()
    for order, attempt in enumerate(verified):
        text = store.get_artifact(attempt.artifact or "")
        if text is None:
            continue
        digest = Kernel(text, FORM_TRITON).digest
        if digest in seen:
            continue
        seen.add(digest)
        compiled = attempt.device_compile
        if architectures and not all(a in (compiled or {}) for a in architectures):
            compiled = _compile_now(store, record, text, target)
        if not architectures:
            ready.append((0.0, order, attempt, text, None))
            continue
        assert compiled is not None
        refused = [
            f"{a}: {compiled[a].get('error')}" for a in architectures if not compiled[a].get("ok")
        ]
        if refused:
            summary.skipped.append((record.label, f"kernel {attempt.id} left out: {refused[0]}"))
            continue
        mine = {a: compiled[a] for a in architectures}
        ready.append((estimate_of(mine) or math.inf, order, attempt, text, mine))
    ready.sort(key=lambda found: found[:2])
    return [(attempt, text, compiled) for _, _, attempt, text, compiled in ready]


def _compile_now(
    store: ExperienceStore, record: TaskRecord, text: str, target: Any
) -> dict[str, dict[str, Any]]:
    """Compile a kernel verified before KOPE compiled kernels for the device (isolated)."""
    payload = store.get_artifact(record.payload or "")
    task = task_from_record(record, payload) if payload else None
    if task is None:
        return {a: failed("its task cannot be rebuilt here") for a in target.architectures}
    result = Evaluation(VERIFIED)
    target.compile_for_devices(
        task.spec, Kernel(text, FORM_TRITON), result, estimate_work(task.spec, payload)
    )
    return result.device_compile or {}


def _task_entry(
    store: ExperienceStore, record: TaskRecord, out: Path, room: int
) -> tuple[dict[str, Any] | None, str]:
    """The manifest entry of one task with its data file written, or None and why not."""
    payload = store.get_artifact(record.payload) if record.payload else None
    if payload is None:
        return None, "its record holds no reference lowering (recorded by an older KOPE)"
    task = task_from_record(record, payload)
    if task is None:
        return None, "its record holds no eager call"
    spec = task.spec
    size = sum(math.prod(s.shape) * s.torch_dtype.itemsize for s in (*spec.inputs, *spec.outputs))
    if size > room:
        return None, f"its inputs and outputs ({size / 2**20:.1f} MiB) do not fit the pack"
    from kope.targets.cpu import CpuTarget

    inputs = verify.task_inputs(spec, verify.trials_for(0)[0])
    try:
        expected = CpuTarget.build(spec, Kernel(payload, FORM_MLIR))(*inputs)
    except Exception as err:  # the reference does not build here: nothing to compare with
        return None, f"its reference lowering does not run here: {err}"
    data = f"data/{record.key[:24]}.pt"
    torch.save({"inputs": inputs, "expected": list(expected)}, out / data)
    reduction = estimate_work(spec, payload).reduction
    tolerances = [list(verify.tolerance(s.torch_dtype, reduction)) for s in spec.outputs]
    return {
        "label": record.label,
        "op": record.op,
        "workload": record.workload,
        "inputs": record.inputs,
        "outputs": record.outputs,
        "eager": record.eager,
        "data": data,
        "tolerances": tolerances,
        "payload": record.payload,
        "bytes": (out / data).stat().st_size,
    }, ""


class PackError(KopeError):
    """A results file that does not belong to a pack, or a pack that is not there."""


def import_results(
    store: ExperienceStore, results_path: Path, pack: Path | None = None
) -> list[AttemptRecord]:
    """Record a runner's results file (and its pack's kernels) in `store`; returns the new
    attempts. A kernel already measured on that device confirms its earlier figure."""
    pack = pack or results_path.parent
    try:
        results = json.loads(results_path.read_text())
        manifest = json.loads((pack / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise PackError(
            f"cannot read {err}; pass the pack's folder with --pack when the results file "
            "is not inside it"
        ) from None
    if results.get("pack") != manifest["id"]:
        raise PackError(f"{results_path} holds results of another pack than {pack}")
    target = manifest["target"]
    device_key = triton_target_key(
        target, results["device"], results["triton"], results["torch"], manifest["kope"]
    )
    events = recording(store)
    kernels = {k["digest"]: k for k in manifest["kernels"]}
    recorded: list[AttemptRecord] = []
    store.refresh()
    for result in results["results"]:
        kernel_entry = kernels.get(result.get("kernel", ""))
        if kernel_entry is None:
            log.warning("result for a kernel the pack does not hold: skipped")
            continue
        task_entry = manifest["tasks"][kernel_entry["task"]]
        payload = store.get_artifact(task_entry["payload"] or "")
        if payload is None:
            raise PackError(f"the store has lost the reference lowering of {task_entry['label']}")
        key = task_key(payload, device_key)
        events.emit(_task_seen(key, task_entry, target, device_key, payload))
        text = (pack / kernel_entry["path"]).read_text()
        earlier = next(
            (
                a
                for a in store.attempts(key)
                if a.transferred_from == kernel_entry["attempt"] and a.latency_us is not None
            ),
            None,
        )
        # The interpreted attempt's configuration, so that the device's figure trains the
        # learning search's cost model for this device like any timed attempt.
        origin = store.record(kernel_entry["attempt"])
        event = AttemptEvaluated(
            key,
            "agent",
            _evaluation(result),
            Kernel(text, FORM_TRITON),
            decision=f"on {results['device']}, from a kernel pack: {kernel_entry['decision']}",
            agent="pack",
            transferred_from=kernel_entry["attempt"],
            confirms=earlier.id if earlier is not None else None,
            config=getattr(origin, "config", None),
        )
        recorded.append(announce(events, event, store))
    return recorded


def _task_seen(
    key: str, entry: dict[str, Any], target: str, device_key: str, payload: str
) -> TaskSeen:
    return TaskSeen(
        key=key,
        op=entry["op"],
        label=entry["label"],
        workload=entry["workload"],
        inputs=tuple((tuple(shape), dtype) for shape, dtype in entry["inputs"]),
        outputs=tuple((tuple(shape), dtype) for shape, dtype in entry["outputs"]),
        target=target,
        target_key=device_key,
        eager=entry["eager"],
        payload=payload,
    )


def _evaluation(result: dict[str, Any]) -> Evaluation:
    """A runner's result as an Evaluation: its verdict, and its figures when it timed them."""
    verdict = result.get("verdict", "runtime_error")
    if verdict not in VERDICTS:
        verdict = "runtime_error"
    notes = [f"measured by the pack runner: {result.get('method', 'untimed')}"]
    if "kernel_us" not in result:
        return Evaluation(
            verdict, error=result.get("error"), oracle=result.get("oracle", ""), notes=notes
        )
    rounds = int(result.get("rounds", 1))
    clean = float(result.get("spread", math.inf)) <= CLEAN_SPREAD
    quality = TIMING_CLEAN if clean else TIMING_CONTAMINATED

    def timing(median_us: float) -> Timing:
        return Timing(
            median_us=median_us,
            spread_us=float(result.get("spread", 0.0)) * median_us,
            repeats=rounds,
            threads=1,
            rounds=rounds,
            clean_rounds=rounds if clean else 0,
            quality=quality,
        )

    return Evaluation(
        VERIFIED,
        kernel=timing(float(result["kernel_us"])),
        eager=timing(float(result["eager_us"])),
        oracle=result.get("oracle", ""),
        trials=1,
        notes=notes,
        threads=1,
    )
