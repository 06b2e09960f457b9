"""`kope memory ...`: look into the experience store from the command line.

`add_commands(subparsers)` registers the `memory` command on the `kope` parser; each
subcommand opens the store given by `--store DIR` (default `$KOPE_HOME`, else
`~/.cache/kope`), except `merge`, whose store is `--into DST` (the same default).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kope.memory.merge import MergeError, MergeReport, check_sources, merge_stores
from kope.memory.schema import AttemptRecord, TaskRecord
from kope.memory.standing import winner
from kope.memory.store import LOG_NAME, TASK, ExperienceStore, StoreError
from kope.vocabulary.arguments import at_least_zero, positive
from kope.vocabulary.evidence import SOURCE_GRAPH, TIMING_CLEAN
from kope.vocabulary.home import kope_home


class MemoryCommandError(Exception):
    """A `kope memory` argument that cannot be acted on (the message says why)."""


SUBCOMMANDS = (
    "stats",
    "tasks",
    "show",
    "context",
    "export",
    "prune",
    "compact",
    "merge",
    "remeasure",
    "import-results",
)
"""Every `kope memory` subcommand, in the order `--help` lists them. `remeasure` and
`import-results` need a target, which memory knows nothing of: the `kope` command line
registers them through `store_command` on the subparsers `add_commands` returns."""


def add_commands(subparsers: Any) -> Any:
    """Register `memory` and its subcommands on an argparse subparsers object; returns the
    subparsers of `memory`, for commands registered from outside (see `store_command`)."""
    memory = subparsers.add_parser(
        "memory",
        help=f"inspect the experience store ({', '.join(SUBCOMMANDS)})",
        description="Inspect KOPE's experience store: what was tried for each operator, what "
        "worked, and what the agent would be shown.",
    )
    memory.set_defaults(run=lambda args: (memory.print_help(), 0)[1])
    sub = memory.add_subparsers(dest="memory_command", metavar="SUBCOMMAND")

    def command(name: str, help_text: str, run: Any) -> argparse.ArgumentParser:
        return store_command(sub, name, help_text, run)

    stats = command("stats", "counts of tasks, attempts, verified attempts and insights", _stats)
    stats.add_argument("--json", action="store_true", help="print JSON")
    tasks = command(
        "tasks",
        "the tasks of the store, oldest first: label, key prefix, attempts "
        "and best speedup over eager (keys for `show` and `context`)",
        _tasks,
    )
    tasks.add_argument("--limit", type=int, default=50, help="tasks per page (default 50)")
    tasks.add_argument(
        "--offset", type=int, default=0, help="tasks to skip before the page (default 0)"
    )
    tasks.add_argument("--json", action="store_true", help="print JSON")
    show = command("show", "a task's trajectory: attempts as a tree of refinements", _show)
    show.add_argument("key", help="task key, or a unique prefix of one")
    context = command(
        "context", "exactly the context ACMI would inject for a task, with scores", _context
    )
    context.add_argument("key", help="task key, or a unique prefix of one")
    context.add_argument(
        "--budget", type=positive(int), default=4000, help="token budget (default 4000)"
    )
    context.add_argument(
        "--counter",
        choices=["estimate", "bpe"],
        default="estimate",
        help="token counter: the offline estimate, or o200k from bpe-openai",
    )
    context.add_argument("--json", action="store_true", help="print the context as JSON")
    export = command("export", "write the whole graph as JSON, GraphML or DOT", _export)
    export.add_argument(
        "--format",
        choices=["json", "graphml", "dot"],
        default="json",
        help="json (lossless, default), graphml or dot",
    )
    export.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")
    prune = command(
        "prune", "delete kernel texts of old failed attempts; keep the graph's history", _prune
    )
    prune.add_argument(
        "--older-than",
        type=at_least_zero(float),
        default=30.0,
        metavar="DAYS",
        help="only attempts recorded more than DAYS ago (default 30)",
    )
    prune.add_argument("--dry-run", action="store_true", help="say what would go; delete nothing")
    command(
        "compact", "write a snapshot so that the store opens without replaying its log", _compact
    )
    merge = sub.add_parser(
        "merge",
        help="copy what other stores learned (other machines' $KOPE_HOME) into one store",
        description="Copy every task, attempt, insight and edge of each SRC that DST lacks into "
        "DST, ids kept, with the kernel texts they name. SRC is only read. Running it again adds "
        "nothing; a merge killed midway leaves DST loadable and running it again completes it. "
        "A record DST holds under the same id with other content is a conflict: DST keeps its "
        "own and the differing fields are listed. Exit status: 0 when the merge completed, "
        "conflicts included (they are reported, not errors); 2 when a SRC is not a store or is "
        "DST itself (nothing is merged then).",
    )
    merge.add_argument("sources", nargs="+", type=Path, metavar="SRC", help="a store to read")
    merge.add_argument(
        "--into",
        type=Path,
        default=None,
        metavar="DST",
        help="the store to merge into (default: $KOPE_HOME or ~/.cache/kope)",
    )
    merge.set_defaults(run=_merge)
    return sub


def store_command(sub: Any, name: str, help_text: str, run: Any) -> argparse.ArgumentParser:
    """Add `kope memory NAME`: it takes `--store DIR`, and `run(args, store)` gets the open
    store; a MemoryCommandError it raises is printed as an error (exit status 2)."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
    p.add_argument(
        "--store",
        type=Path,
        default=None,
        help="store directory (default: $KOPE_HOME or ~/.cache/kope)",
    )
    p.set_defaults(run=lambda args: _guarded(run, args))
    return p


def _guarded(run: Any, args: argparse.Namespace) -> int:
    root = Path(args.store or kope_home()).expanduser()
    if not (root / LOG_NAME).is_file():
        # Opening would create an empty store there, and a mistyped path would read as one.
        where = "--store" if args.store else "$KOPE_HOME (or ~/.cache/kope)"
        print(
            f"kope memory: error: no experience store at {root} (no {LOG_NAME} there): check "
            f"{where}; `kope precompile` or a compiled model creates one",
            file=sys.stderr,
        )
        return 2
    try:
        code: int = run(args, ExperienceStore(root))
        return code
    except (MemoryCommandError, StoreError) as err:
        print(f"kope memory: error: {err}", file=sys.stderr)
        return 2


def _stats(args: argparse.Namespace, store: ExperienceStore) -> int:
    summary = store.summary()
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
        return 0
    width = max(len(k) for k in summary)
    for key, value in summary.items():
        print(f"{key:<{width}}  {value}")
    if summary["tasks"]:
        print(f"`kope memory tasks --store {store.root}` lists the tasks and their keys")
    return 0


def task_summaries(
    store: ExperienceStore, offset: int = 0, limit: int | None = None
) -> tuple[list[dict[str, Any]], int]:
    """A page of the store's tasks (oldest first) as {key, label, op, attempts,
    best_speedup_vs_eager, timing_quality (of the best's figure)}, and how many tasks there
    are. Only the page's attempts are decoded."""
    tasks = store.tasks()
    page = tasks[offset : None if limit is None else offset + limit]
    rows = []
    for task in page:
        attempts = store.attempts(task.key)
        best = winner(attempts).best
        rows.append(
            {
                "key": task.key,
                "label": task.label,
                "op": task.op,
                "attempts": len(attempts),
                "best_speedup_vs_eager": best.speedup_vs_eager if best else None,
                "timing_quality": best.timing_quality if best else None,
            }
        )
    return rows, len(tasks)


def _tasks(args: argparse.Namespace, store: ExperienceStore) -> int:
    if args.limit < 1 or args.offset < 0:
        raise MemoryCommandError(
            f"--limit {args.limit} must be >= 1 and --offset {args.offset} >= 0"
        )
    rows, total = task_summaries(store, args.offset, args.limit)
    if args.json:
        print(
            json.dumps(
                {"total": total, "offset": args.offset, "limit": args.limit, "tasks": rows},
                indent=2,
            )
        )
        return 0
    if not rows:
        print(f"no tasks at offset {args.offset} ({total} in {store.root})")
        return 0
    width = max(len(r["label"]) for r in rows)
    for r in rows:
        # A figure the machine's load disturbed is no speedup: it is not printed as one.
        clean = r["timing_quality"] in ("clean", None)
        best = "-"
        if r["best_speedup_vs_eager"]:
            best = f"{r['best_speedup_vs_eager']:.2f}x" if clean else "not clean"
        print(f"{r['key'][:16]}  {r['label']:<{width}}  {r['attempts']:>5} attempts  best {best}")
    last = args.offset + len(rows)
    more = f"; --offset {last} for the next page" if last < total else ""
    print(f"tasks {args.offset + 1}-{last} of {total}{more}")
    return 0


def resolve_key(store: ExperienceStore, prefix: str) -> str:
    """The task key that `prefix` names; MemoryCommandError if none or several."""
    if store.task(prefix) is not None:
        return prefix
    matches = sorted(
        store.id_of(r) for r in store.rows_of_kind(TASK) if store.id_of(r).startswith(prefix)
    )
    if not matches:
        raise MemoryCommandError(
            f"no task key starts with {prefix!r} in {store.root}; "
            "`kope memory tasks` lists the keys it holds"
        )
    if len(matches) > 1:
        shown = ", ".join(m[:16] for m in matches[:5])
        raise MemoryCommandError(
            f"{prefix!r} names {len(matches)} tasks ({shown}...); give more of the key"
        )
    return matches[0]


def _show(args: argparse.Namespace, store: ExperienceStore) -> int:
    key = resolve_key(store, args.key)
    task = store.task(key)
    assert isinstance(task, TaskRecord)
    attempts = store.attempts(key)
    standing = winner(attempts)
    best = standing.best
    print(f"{task.label}  [{task.op}, {task.target}]")
    print(f"key {task.key}")
    graph = any(a.source == SOURCE_GRAPH for a in attempts)
    if graph:  # a whole graph's decisions: compiled or eager, with the timings they rest on
        print(f"hardware {task.hardware}; {len(attempts)} whole-graph decisions (latest last)")
    else:
        print(
            f"hardware {task.hardware}; {len(attempts)} attempts; best: "
            f"{_line(best) if best else 'none verified'}"
        )
    if not standing.clean and not graph:
        print(
            "the choice does not rest on clean figures (measured under load, unconfirmed, or "
            "before KOPE judged timings): it is re-timed at the next compile"
        )
    ids = {a.id for a in attempts}
    children: dict[str | None, list[AttemptRecord]] = {}
    for a in attempts:
        # A confirmation hangs under the figure it re-measured.
        above = a.parent if a.parent in ids else a.confirms if a.confirms in ids else None
        children.setdefault(above, []).append(a)

    def walk(parent: str | None, depth: int) -> None:
        for a in children.get(parent, []):
            mark = "*" if best is not None and a.id == best.id else " "
            print(f"{mark} {'  ' * depth}{'└─ ' if depth else ''}{_line(a)}")
            walk(a.id, depth + 1)

    walk(None, 0)
    return 0


def _line(a: AttemptRecord) -> str:
    """One attempt: id, source, verdict, latency, speedup (none from a figure that is not
    clean) and the timing's quality, the attempt it confirms, its decision."""
    latency = f"{a.latency_us:.1f} us" if a.latency_us is not None else "-"
    speed = ""
    if a.speedup_vs_eager is not None:
        clean = a.timing_quality == TIMING_CLEAN
        speed = f" {a.speedup_vs_eager:.2f}x eager" if clean else " speedup not clean"
    quality = ""
    if a.latency_us is not None:
        rounds = f" {a.clean_rounds}/{a.rounds} clean rounds" if a.rounds else ""
        quality = f" [{a.timing_quality}{rounds}, {a.threads} threads]"
    confirms = f" confirms {a.confirms[:16]}" if a.confirms else ""
    decision = f" {a.decision}" if a.decision and not a.confirms else ""
    return (
        f"{a.id[:16]} {a.source:9s} {a.verdict:13s} {latency:>11s}{speed}{quality}"
        f"{confirms}{decision}{_device_compile(a)}"
    )


def _device_compile(a: AttemptRecord) -> str:
    """What Triton's compiler made of a GPU kernel, per architecture: its registers, spills,
    shared memory and roofline estimate (labelled: never a timing), or why it refused."""
    parts = []
    for arch, r in sorted((a.device_compile or {}).items()):
        if not r.get("ok") and r.get("registers") is None:
            parts.append(f"{arch} refused")
            continue
        estimate = r.get("estimate_us")
        parts.append(
            f"{arch} {r.get('registers')} regs, {r.get('spills')} B spilled, "
            f"{r.get('shared_bytes')} B shared"
            + (f", est {estimate:.3g} us" if estimate else "")
            + ("" if r.get("ok") else " (refused)")
        )
    return f" [{'; '.join(parts)}]" if parts else ""


def _context(args: argparse.Namespace, store: ExperienceStore) -> int:
    from kope.memory.retrieval import dumps, retrieve
    from kope.memory.tokens import BpeCounter, EstimatingCounter, TokenCounter

    key = resolve_key(store, args.key)
    counter: TokenCounter
    if args.counter == "bpe":
        try:
            counter = BpeCounter()
        except ImportError as err:
            raise MemoryCommandError(
                f"--counter bpe needs bpe-openai ({err}); "
                "pip install bpe-openai, or use --counter estimate"
            ) from err
    else:
        counter = EstimatingCounter()
    context = retrieve(store, key, args.budget, counter=counter)
    if args.json:
        print(dumps(context))
        return 0
    print(context.explain())
    print("---- injected text " + "-" * 50)
    print(context.text)
    return 0


def _export(args: argparse.Namespace, store: ExperienceStore) -> int:
    from kope.memory.export import export

    if args.output is None:
        export(store, args.format, sys.stdout)
        return 0
    try:
        out = open(args.output, "w")
    except OSError as err:
        raise MemoryCommandError(f"cannot write {args.output}: {err.strerror}") from None
    with out:
        export(store, args.format, out)
    print(f"wrote {args.output} ({args.format})", file=sys.stderr)
    return 0


def _prune(args: argparse.Namespace, store: ExperienceStore) -> int:
    from kope.memory.export import prune

    report = prune(store, args.older_than, args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    print(
        f"{verb} {report.artifacts_removed} artifacts ({report.bytes_removed} bytes); "
        f"kept {report.artifacts_kept}"
    )
    return 0


def _merge(args: argparse.Namespace) -> int:
    into = args.into or kope_home()
    try:
        # Checked before DST is opened: opening a store may write a snapshot into it.
        sources = check_sources(args.sources, into)
        report = merge_stores(sources, ExperienceStore(into))
    except (MergeError, StoreError) as err:
        print(f"kope memory: error: {err}", file=sys.stderr)
        return 2
    _print_merge(report)
    return 0


SHOWN_CONFLICTS = 5
"""Conflicts `kope memory merge` lists per source (all are counted)."""


def _print_merge(report: MergeReport) -> None:
    for s in report.sources:
        print(f"from {s.source}:")
        for kind in ("task", "attempt", "insight"):
            print(
                f"  {kind + 's':<10} {s.added[kind]:>7} added  {s.present[kind]:>7} present  "
                f"{s.conflicts_of(kind):>5} conflicts"
            )
        recounted = f", {s.insights_recounted} insights recounted" if s.insights_recounted else ""
        print(
            f"  {'edges':<10} {s.added['edge']:>7} added  {s.present['edge']:>7} present  "
            f"{s.edges_skipped:>5} skipped (an end in conflict){recounted}"
        )
        print(
            f"  {'artifacts':<10} {s.added['artifact']:>7} added  {s.present['artifact']:>7} "
            f"present  {s.artifacts_missing:>5} missing in the source"
        )
        for c in s.conflicts[:SHOWN_CONFLICTS]:
            print(f"  conflict: {c.kind} {c.id} differs in {', '.join(c.fields)}")
        if len(s.conflicts) > SHOWN_CONFLICTS:
            print(f"  ... and {len(s.conflicts) - SHOWN_CONFLICTS} more conflicts")
    conflicts = len(report.conflicts)
    kept = f", conflicts: {conflicts} ({report.into} kept its own records)" if conflicts else ""
    print(f"merged {len(report.sources)} stores into {report.into}: {report.added} added{kept}")


def _compact(args: argparse.Namespace, store: ExperienceStore) -> int:
    store.compact()
    print(f"snapshot of {store.rows()} nodes written to {store.root}")
    return 0
