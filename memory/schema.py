"""The experience graph's records: tasks, attempts, insights and the edges between them.

Records are plain data with stable string ids (never rustworkx indices, which are reused
after removal). They are stored as JSON; `SCHEMA_VERSION` changes when a field's meaning
does, and `MIGRATIONS` brings older records forward. A field added with a default needs no
new version: an older record loads with the default (a timing recorded before KOPE judged
timings loads as `TIMING_UNKNOWN`), and an older KOPE ignores the fields it does not know.

Edges, by kind (direction src -> dst):
- `attempt`: task -> attempt (implied by `AttemptRecord.task`, never written on its own)
- `refines`: attempt -> the attempt it was derived from (implied by `AttemptRecord.parent`);
  the decision order, whose siblings are the alternative branches
- `transferred_from`: attempt -> an attempt of another task whose kernel it reused
- `confirms`: attempt -> the attempt whose winning figure it re-measured head to head
  against eager (implied by `AttemptRecord.confirms`)
- `similar`: task -> task
- `supports` / `contradicts`: insight -> attempt that is evidence for / against it
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kope.vocabulary.events import new_id
from kope.vocabulary.evidence import TIMING_UNKNOWN
from kope.vocabulary.kernels import FORM_MLIR

SCHEMA_VERSION = 2

# Edge kinds.
HAS_ATTEMPT = "attempt"  # task -> attempt
REFINES = "refines"  # attempt -> attempt it was derived from (decision order)
TRANSFERRED_FROM = "transferred_from"  # attempt -> attempt of another task it reused
SIMILAR = "similar"  # task -> task
SUPPORTS = "supports"  # insight -> attempt
CONTRADICTS = "contradicts"  # insight -> attempt
CONFIRMS = "confirms"  # attempt -> the attempt whose figure it re-measured
# New kinds go at the end: snapshots store a kind as its index in this tuple.
EDGE_KINDS = (HAS_ATTEMPT, REFINES, TRANSFERRED_FROM, SIMILAR, SUPPORTS, CONTRADICTS, CONFIRMS)


def hardware_of(target_key: str) -> str:
    """The hardware part of a target key (`cpu|<model, ISA, cores>|torch-...|kope-...`): its
    fields before the first toolkit version."""
    kept: list[str] = []
    for part in target_key.split("|"):
        if part.startswith(_VERSION_PREFIXES):
            break
        kept.append(part)
    return "|".join(kept)


_VERSION_PREFIXES = ("torch-", "kope-", "triton-", "cann-")


@dataclass
class TaskRecord:
    """One operator on one target: identified by its key (canonical IR + target key)."""

    key: str
    op: str  # e.g. "aten.mm.default"
    label: str  # e.g. "aten.mm(64x64xf32, 64x64xf32)"
    workload: str  # sha256 of the canonical IR alone (target-independent)
    inputs: list[list[Any]]  # [[shape, dtype], ...]
    outputs: list[list[Any]]
    target: str
    target_key: str
    created: float = field(default_factory=time.time)
    hardware: str = ""  # hardware fingerprint; derived from target_key when not given
    # How to run the operator eagerly, as plain JSON (the compiler's encoding of its eager
    # call), so that a stored task can be re-measured without its model; None if unknown.
    eager: dict[str, Any] | None = None
    # The artifact digest of its reference lowering (the canonical linalg `@main`), so that a
    # stored task can be lowered again without its model (a kernel pack's reference outputs).
    payload: str | None = None
    # The strides (elements) the model passes each input in, so that a stored task is timed
    # on inputs laid out as it was (`TaskSpec.strides`); None where not recorded.
    strides: list[list[int]] | None = None

    def __post_init__(self) -> None:
        if not self.hardware:
            self.hardware = hardware_of(self.target_key)

    @property
    def id(self) -> str:
        return self.key


@dataclass
class AttemptRecord:
    """One candidate kernel for a task and what happened to it."""

    task: str  # the task key
    source: str  # eager | reference | agent
    verdict: str
    id: str = field(default_factory=lambda: new_id("attempt"))
    artifact: str | None = None  # sha256 of the kernel text in the artifact store
    form: str = FORM_MLIR  # the form of that text (`kope.vocabulary.kernels`)
    decision: str = ""  # what changed and why
    agent: str = ""
    model: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    wall_s: float = 0.0
    error: str | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    latency_us: float | None = None
    spread_us: float | None = None
    repeats: int = 0
    threads: int = 0  # threads eager and the kernel ran with: part of what a figure means
    eager_us: float | None = None
    reference_us: float | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_reference: float | None = None
    parent: str | None = None  # the attempt this one refines
    created: float = field(default_factory=time.time)
    transferred_from: str | None = None  # an attempt of another task whose kernel it reused
    config: dict[str, Any] | None = None  # the decision in machine-readable form (an agent's)
    # The quality of the figures above (latency and the eager / reference timed beside it):
    # clean | contaminated | unknown (older records), with the rounds it rests on.
    timing_quality: str = TIMING_UNKNOWN
    clean_rounds: int = 0
    rounds: int = 0
    wait_share: float | None = None  # run-queue wait / wall time of the measuring threads
    load: float | None = None  # 1-minute load average when the timing started
    confirms: str | None = None  # the attempt whose winning figure this one re-measured
    # A GPU kernel compiled without the device for each architecture of its target: per
    # architecture ("sm_90") {"ok", "registers", "spills", "shared_bytes", "error", ...} and
    # "estimate_us", a roofline estimate (never a timing). None: not compiled.
    device_compile: dict[str, dict[str, Any]] | None = None


@dataclass
class InsightRecord:
    """A distilled lesson: a decision and what it did on an op family, with its evidence.

    `support` and `contradict` count the attempts linked by `supports` / `contradicts`
    edges; `weight` is the posterior mean (support + 1) / (support + contradict + 2), so
    contradicting evidence lowers it. Re-recorded (same id) whenever the counts change.
    """

    id: str
    family: str  # op family, e.g. "matmul"
    dtype: str
    decision: str  # normalised decision text
    text: str  # the lesson, for people and prompts
    support: int = 0
    contradict: int = 0
    weight: float = 0.5
    best_speedup: float | None = None  # best verified speedup vs eager among its support
    best_attempt: str | None = None
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)


@dataclass
class EdgeRecord:
    """A typed edge between two records named by their stable ids."""

    src: str
    dst: str
    kind: str


RECORD_TYPES: dict[str, type] = {
    "task": TaskRecord,
    "attempt": AttemptRecord,
    "insight": InsightRecord,
    "edge": EdgeRecord,
}
_TYPE_NAMES = {cls: name for name, cls in RECORD_TYPES.items()}


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v2 gave tasks a hardware fingerprint; v1 tasks get it from their target key."""
    if data.get("t") == "task" and not data.get("hardware"):
        data = {**data, "hardware": hardware_of(str(data.get("target_key", "")))}
    return {**data, "v": 2}


# Migrations from version v to v+1, applied in order to older records.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2}


def type_name(record: Any) -> str:
    """The stored type tag of a record ("task", "attempt", "insight", "edge")."""
    return _TYPE_NAMES[type(record)]


def to_json(record: Any) -> dict[str, Any]:
    """The record as a JSON-ready dict tagged with its type and the schema version."""
    data = dataclasses.asdict(record)
    data["v"] = SCHEMA_VERSION
    data["t"] = _TYPE_NAMES[type(record)]
    return data


def from_json(data: dict[str, Any]) -> Any:
    """The record for a stored dict, migrated to the current schema; ValueError if unusable."""
    version = data.get("v")
    if not isinstance(version, int):
        raise ValueError("record has no schema version")
    if version > SCHEMA_VERSION:
        raise ValueError(f"record has schema v{version}, newer than this KOPE's v{SCHEMA_VERSION}")
    while version < SCHEMA_VERSION:
        data = MIGRATIONS[version](data)
        version += 1
    cls = RECORD_TYPES.get(data.get("t", ""))
    if cls is None:
        raise ValueError(f"unknown record type {data.get('t')!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})
