"""Exporting the experience graph (JSON, GraphML, DOT), reading exports back, and pruning.

rustworkx's own node-link JSON drops payloads that are not strings and its GraphML writer
rounds floats to 32 bits, so KOPE serialises records itself: each node carries its whole
record as JSON text (Python's float repr, exact), and GraphML holds that text as a string
attribute beside a few readable ones. `read_json` and `read_graphml` give back the same
records and edges; DOT is for looking at (Graphviz), not for reading back.
"""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from kope.memory.schema import (
    SCHEMA_VERSION,
    AttemptRecord,
    InsightRecord,
    TaskRecord,
    from_json,
    to_json,
    type_name,
)
from kope.memory.store import ATTEMPT, ExperienceStore

FORMATS = ("json", "graphml", "dot")
_GRAPHML_NS = "http://graphml.graphdrawing.org/xmlns"
_GRAPHML_KEYS = ("type", "label", "verdict", "record")


def export(store: ExperienceStore, fmt: str, out: TextIO) -> None:
    """Write the whole graph to `out` in `fmt` (json, graphml or dot)."""
    if fmt == "json":
        _write_json(store, out)
    elif fmt == "graphml":
        _write_graphml(store, out)
    elif fmt == "dot":
        _write_dot(store, out)
    else:
        raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")


def _write_json(store: ExperienceStore, out: TextIO) -> None:
    nodes = [{"id": r.id, "type": type_name(r), "record": to_json(r)} for r in store.iter_records()]
    edges = [{"src": s, "dst": d, "kind": k} for s, d, k in store.iter_edges()]
    json.dump(
        {"schema_version": SCHEMA_VERSION, "nodes": nodes, "edges": edges},
        out,
        sort_keys=True,
        allow_nan=True,
    )
    out.write("\n")


def read_json(path: Path) -> tuple[list[Any], list[tuple[str, str, str]]]:
    """The records and (src, dst, kind) edges of a JSON export."""
    data = json.loads(path.read_text())
    records = [from_json(n["record"]) for n in data["nodes"]]
    return records, [(e["src"], e["dst"], e["kind"]) for e in data["edges"]]


def _write_graphml(store: ExperienceStore, out: TextIO) -> None:
    root = ET.Element("graphml", xmlns=_GRAPHML_NS)
    for key in _GRAPHML_KEYS:
        ET.SubElement(
            root, "key", {"id": key, "for": "node", "attr.name": key, "attr.type": "string"}
        )
    ET.SubElement(
        root, "key", {"id": "kind", "for": "edge", "attr.name": "kind", "attr.type": "string"}
    )
    graph = ET.SubElement(root, "graph", id="kope", edgedefault="directed")
    for record in store.iter_records():
        node = ET.SubElement(graph, "node", id=record.id)
        values = {
            "type": type_name(record),
            "label": _label(record),
            "verdict": getattr(record, "verdict", ""),
            "record": json.dumps(to_json(record), sort_keys=True, allow_nan=True),
        }
        for key in _GRAPHML_KEYS:
            ET.SubElement(node, "data", key=key).text = values[key]
    for i, (src, dst, kind) in enumerate(store.iter_edges()):
        edge = ET.SubElement(graph, "edge", id=f"e{i}", source=src, target=dst)
        ET.SubElement(edge, "data", key="kind").text = kind
    ET.indent(root)
    out.write('<?xml version="1.0" encoding="UTF-8"?>\n')
    out.write(ET.tostring(root, encoding="unicode"))
    out.write("\n")


def read_graphml(path: Path) -> tuple[list[Any], list[tuple[str, str, str]]]:
    """The records and (src, dst, kind) edges of a GraphML export."""
    ns = {"g": _GRAPHML_NS}
    graph = ET.parse(path).getroot().find("g:graph", ns)
    if graph is None:
        raise ValueError(f"{path}: no <graph> element")
    records = []
    for node in graph.findall("g:node", ns):
        data = {d.get("key"): d.text or "" for d in node.findall("g:data", ns)}
        records.append(from_json(json.loads(data["record"])))
    edges = []
    for edge in graph.findall("g:edge", ns):
        kind = edge.find("g:data", ns)
        edges.append(
            (
                edge.get("source", ""),
                edge.get("target", ""),
                kind.text or "" if kind is not None else "",
            )
        )
    return records, edges


_DOT_STYLE = {
    "verified": "palegreen",
    "mismatch": "salmon",
    "compile_error": "orange",
    "runtime_error": "tomato",
    "timeout": "gray",
}


def _write_dot(store: ExperienceStore, out: TextIO) -> None:
    out.write("digraph kope {\n  rankdir=LR;\n  node [fontname=monospace, fontsize=10];\n")
    for record in store.iter_records():
        if isinstance(record, TaskRecord):
            attrs = "shape=box, style=bold"
        elif isinstance(record, InsightRecord):
            attrs = "shape=note, style=filled, fillcolor=lightyellow"
        else:
            color = _DOT_STYLE.get(getattr(record, "verdict", ""), "white")
            attrs = f"shape=ellipse, style=filled, fillcolor={color}"
        out.write(f"  {_q(record.id)} [label={_q(_label(record))}, {attrs}];\n")
    for src, dst, kind in store.iter_edges():
        out.write(f"  {_q(src)} -> {_q(dst)} [label={_q(kind)}];\n")
    out.write("}\n")


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _label(record: Any) -> str:
    if isinstance(record, TaskRecord):
        return record.label
    if isinstance(record, InsightRecord):
        return f"{record.decision} ({record.family}, w={record.weight:.2f})"
    a: AttemptRecord = record
    speed = f" {a.speedup_vs_eager:.2f}x" if a.speedup_vs_eager is not None else ""
    quality = f" {a.timing_quality}" if a.latency_us is not None else ""
    return f"{a.source}: {a.decision[:40]} [{a.verdict}{speed}{quality}]"


@dataclass
class PruneReport:
    """What `prune` removed (or would remove, in a dry run)."""

    artifacts_removed: int
    bytes_removed: int
    artifacts_kept: int


def prune(
    store: ExperienceStore, older_than_days: float = 30.0, dry_run: bool = False
) -> PruneReport:
    """Delete the kernel texts nobody needs any more: those of failed attempts recorded more
    than `older_than_days` ago that are not also the text of a verified or a newer attempt.
    The attempts themselves stay in the graph (their history, verdicts and errors); only
    `get_artifact` of a pruned one returns None."""
    cutoff = time.time() - older_than_days * 86400.0
    store.refresh()
    rows = store.rows_of_kind(ATTEMPT)
    hot = store.hot(rows)
    drop: set[str] = set()
    keep: set[str] = set()
    for row, verdict, created in zip(
        rows, hot["verdict"].tolist(), hot["created"].tolist(), strict=True
    ):
        attempt = store.record_at(row)
        if not attempt.artifact:
            continue
        (drop if verdict != 0 and created < cutoff else keep).add(attempt.artifact)
    removed = nbytes = 0
    for digest in sorted(drop - keep):
        path = store.artifact_path(digest)
        if path.exists():
            nbytes += path.stat().st_size
            removed += 1
            if not dry_run:
                path.unlink()
    return PruneReport(removed, nbytes, len(keep))
