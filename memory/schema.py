"""The experience graph's records: tasks, attempts, insights and the edges between them.

Records are plain data with stable string ids (never rustworkx indices, which are reused
after removal). They are stored as JSON; `SCHEMA_VERSION` changes when a field's meaning
does, and `MIGRATIONS` brings older records forward.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

SCHEMA_VERSION = 1

# Edge kinds.
HAS_ATTEMPT = "attempt"  # task -> attempt
REFINES = "refines"  # attempt -> attempt it was derived from (decision order)
TRANSFERRED_FROM = "transferred_from"  # attempt -> attempt of another task it reused
SIMILAR = "similar"  # task -> task
EDGE_KINDS = (HAS_ATTEMPT, REFINES, TRANSFERRED_FROM, SIMILAR)

# Where an attempt's kernel came from.
SOURCE_EAGER = "eager"
SOURCE_REFERENCE = "reference"
SOURCE_AGENT = "agent"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


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
    threads: int = 0
    eager_us: float | None = None
    reference_us: float | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_reference: float | None = None
    parent: str | None = None
    created: float = field(default_factory=time.time)


@dataclass
class EdgeRecord:
    src: str
    dst: str
    kind: str


RECORD_TYPES: dict[str, type] = {"task": TaskRecord, "attempt": AttemptRecord, "edge": EdgeRecord}
_TYPE_NAMES = {cls: name for name, cls in RECORD_TYPES.items()}

# Migrations from version v to v+1, applied in order to older records.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def to_json(record: Any) -> dict[str, Any]:
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
