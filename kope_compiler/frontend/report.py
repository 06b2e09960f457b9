"""What KOPE did with each compiled graph: per Task, the kernel it runs, why, and how fast.

`kope.report()` returns the report of every graph compiled in this process. Kernel calls are
counted at run time, so a test can tell a kernel that was chosen from one that actually ran.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kope.vocabulary.evidence import Timing

PASS_RATE = "the share of operators with at least one verified agent kernel"
"""What `pass rate` (`summary.pass_rate` of the reports) means wherever KOPE prints it."""


@dataclass
class TaskReport:
    """One Task of a compiled graph."""

    label: str
    key: str
    op: str
    kernel: str  # eager | reference | agent
    reason: str
    eager_us: float | None = None
    kernel_us: float | None = None
    verdict: str | None = None  # of the reference lowering
    calls: int = 0
    quality: str = "unknown"  # of the timing the choice rests on: clean | contaminated | unknown
    attempt: str | None = None  # the recorded attempt whose kernel was chosen (`kope memory show`)

    @property
    def jit(self) -> bool:
        return self.kernel != "eager"

    @property
    def ran_us(self) -> float | None:
        """The µs of what runs: eager's for an eager Task (its `kernel_us` is the reference's,
        the candidate eager beat), the kernel's otherwise."""
        return self.eager_us if self.kernel == "eager" else self.kernel_us

    @property
    def speedup(self) -> float | None:
        if self.eager_us and self.ran_us:
            return self.eager_us / self.ran_us
        return None


@dataclass
class EagerReport:
    """A node that ran eagerly, and why; `compute` marks operators KOPE could not take."""

    op: str
    reason: str
    compute: bool
    label: str = ""  # the call with its shapes, where they are known


@dataclass
class GraphDecision:
    """Whether a compiled graph runs, or the eager graph, and the timings (one interleaved run
    in the calling process) it rests on (`kope.frontend.whole_graph`)."""

    compiled: bool  # False: the eager graph runs
    reason: str
    kope: Timing | None = None
    eager: Timing | None = None
    recorded_us: tuple[float | None, float | None] | None = None  # a decision reused
    disturbed: bool = False  # a step of the search was not clean
    unsure: bool = False  # reused from a record whose timings were not all clean
    # The intra-op thread count the chosen graph (compiled or eager) runs at; None: the
    # caller's. `kope` is then that graph's timing at this count.
    threads: int | None = None

    @property
    def clean(self) -> bool:
        return (
            self.kope is not None
            and self.eager is not None
            and self.kope.clean
            and self.eager.clean
        )

    @property
    def speedup(self) -> float | None:
        if self.kope is not None and self.eager is not None:
            return self.eager.median_us / self.kope.median_us
        if self.recorded_us is not None and all(self.recorded_us):
            kope_us, eager_us = self.recorded_us
            return (eager_us or 0.0) / (kope_us or 1.0)
        return None


@dataclass
class GraphReport:
    tasks: list[TaskReport] = field(default_factory=list)
    eager: list[EagerReport] = field(default_factory=list)
    views: int = 0
    rewrites: list[str] = field(default_factory=list)  # `kope.frontend.rewrites` made, one per site
    compile_s: float = 0.0
    policy: str = "auto"
    whole: GraphDecision | None = None  # the whole-graph check, where it ran
    structure: str = field(default="", repr=False)  # what the graph key hashes (`graph_structure`)
    # For the forward graph of a graph that needs gradients: what runs, and why.
    training: str = ""

    @property
    def compute_ops(self) -> int:
        return len(self.tasks) + sum(1 for e in self.eager if e.compute)

    def jit_share(self, ran: bool = True) -> float:
        """Share of compute operators served by a JIT kernel (that ran, if `ran`)."""
        if not self.compute_ops:
            return 1.0
        served = sum(1 for t in self.tasks if t.jit and (t.calls > 0 or not ran))
        return served / self.compute_ops


@dataclass
class Report:
    graphs: list[GraphReport] = field(default_factory=list)
    # Graphs whose compile raised (a KOPE bug) and ran as dynamo traced them: why, one line each.
    failed: list[str] = field(default_factory=list)

    @property
    def tasks(self) -> list[TaskReport]:
        return [t for g in self.graphs for t in g.tasks]

    @property
    def eager(self) -> list[EagerReport]:
        return [e for g in self.graphs for e in g.eager]

    def jit_share(self, ran: bool = True) -> float:
        compute = sum(g.compute_ops for g in self.graphs)
        if not compute:
            return 1.0
        served = sum(1 for t in self.tasks if t.jit and (t.calls > 0 or not ran))
        return served / compute

    def format_table(self) -> str:
        """One row per distinct operator: kernel, latency vs eager, sites, calls, and under it
        why.

        Tasks with the same key (the same operator at several places of a graph, or in several
        graphs) share one row; `sites` says how many places, `calls` how often its JIT kernel
        ran in all of them. An eager row's µs are eager's, since eager is what ran; its calls
        are not counted (eager nodes are left as they are, unwrapped), hence `-`. `timing` is
        the quality of the figures; a speedup from a figure that is not clean reads `~1.23x`.
        """
        header = ("task", "kernel", "kernel µs", "eager µs", "speedup", "timing", "sites", "calls")
        rows: list[tuple[str, ...]] = [header]
        reasons: list[str] = [""]
        groups: dict[tuple[str, str], list[TaskReport]] = {}
        for t in self.tasks:
            groups.setdefault((t.key, t.kernel), []).append(t)
        for same in groups.values():
            t = same[0]
            calls = str(sum(s.calls for s in same)) if t.jit else "-"
            rows.append(
                (
                    shorten(t.label, 60),
                    t.kernel,
                    _us(t.ran_us),
                    _us(t.eager_us),
                    speedup_text(t.speedup, t.quality),
                    t.quality if t.eager_us is not None else "-",
                    str(len(same)),
                    calls,
                )
            )
            reasons.append(t.reason)
        # Operators KOPE leaves to ATen as they are (no Task: no shapes, no timing), one row
        # per operator and reason, with the places it occurs.
        aten = Counter((e.label or e.op, e.reason) for e in self.eager if e.compute)
        for (op, reason), sites in aten.items():
            rows.append((shorten(op, 60), "eager", "-", "-", "-", "-", str(sites), "-"))
            reasons.append(reason)
        lines = table_lines(rows, reasons)
        if sum(g.compute_ops for g in self.graphs):
            share = f"JIT share of compute operators that ran: {self.jit_share():.0%}"
        elif self.graphs:
            share = "no compute operator reached KOPE"
        elif self.failed:
            share = "no graph compiled"
        else:  # dynamo skipped the model (nn.LSTM, say): it ran eagerly, without a backend
            share = "dynamo compiled no graph (TORCH_LOGS=graph_breaks says why)"
        left = ""
        if aten:
            left = f", and {counted(len(aten), 'operator')} ATen runs as it is"
        jit = sum(1 for t in self.tasks if t.jit)
        footer = [
            f"{len(self.tasks)} tasks ({len(groups)} distinct){left}; "
            f"{counted(jit, 'task')} on JIT kernels; {share}"
        ]
        for why in self.failed:
            footer.append(f"a graph failed to compile and ran as dynamo traced it: {why}")
        for index, graph in enumerate(self.graphs):
            if graph.rewrites:
                counts = Counter(graph.rewrites)
                made = "; ".join(f"{name} ({n}x)" for name, n in counts.items())
                footer.append(f"graph {index}: rewritten: {made}")
            if graph.training:
                footer.append(f"graph {index}: {graph.training}")
            whole = graph.whole
            if whole is None:
                if graph.policy != "auto" and not graph.training:
                    # Forced: nothing was timed, and the line must not read as another graph's.
                    footer.append(f"graph {index}: kernels={graph.policy}: runs as forced, untimed")
                continue
            if graph.training:  # what runs is the line above; this is the forward's check
                speed = speedup_text(whole.speedup, "clean" if whole.clean else "unknown")
                footer.append(
                    f"graph {index}: its forward graph alone, compiled, timed {speed} eager: "
                    f"{whole.reason}"
                )
            else:
                footer.append(f"graph {index}: {graph_line(whole)}")
        for line in footer:
            lines += textwrap.wrap(line, max(len(lines[1]), REASON_WIDTH), subsequent_indent="    ")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format_table()


def counted(n: int, noun: str) -> str:
    """`1 task`, `2 tasks`."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def graph_line(whole: GraphDecision) -> str:
    """What the whole-graph check decided, in a sentence: which graph runs, on how many
    threads, how fast against eager (as timed, and how cleanly), and why."""
    reused_clean = whole.recorded_us is not None and not whole.unsure
    quality = "clean" if whole.clean else "reused" if reused_clean else "not clean"
    speed = speedup_text(whole.speedup, "clean" if whole.clean or reused_clean else "unknown")
    ran = "the compiled graph runs" if whole.compiled else "eager's graph runs"
    if whole.threads is not None:
        # `speedup` is then of the graph that runs, on its threads, against eager on the
        # caller's count.
        ran += (
            f" on {counted(whole.threads, 'thread')} (KOPE sets torch's thread count for each "
            f"call and restores it), {speed} eager"
        )
    elif whole.compiled:
        ran += f", {speed} eager"
    else:
        ran += f"; the compiled one timed {speed} eager"
    return f"{ran} ({quality}): {whole.reason}"


# A row's reason goes on lines of its own under the row, this wide at most and at most
# REASON_LINES of them: as a last column it made the table ~250 characters wide.
REASON_WIDTH = 100
REASON_LINES = 3


def table_lines(rows: Sequence[tuple[str, ...]], notes: Sequence[str] = ()) -> list[str]:
    """Rows of cells as aligned text columns, the first row a header underlined with dashes;
    `notes[i]`, where given and not empty, is wrapped under row i, indented."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
        elif index < len(notes) and notes[index]:
            lines += textwrap.wrap(
                notes[index],
                REASON_WIDTH,
                initial_indent="    ",
                subsequent_indent="    ",
                max_lines=REASON_LINES,
                placeholder=" …",
            )
    return lines


def speedup_text(value: float | None, quality: str = "clean") -> str:
    """`1.23x` for a clean figure; `not clean` for one the machine's load disturbed (or of
    unknown quality), which is no speedup: printed as one, a disturbed 2215.92x or a
    reference's 258.58x read as a measurement (the timing's quality is shown beside it)."""
    if not value:
        return "-"
    return f"{value:.2f}x" if quality == "clean" else "not clean"


def timing_text(row: dict[str, Any]) -> str:
    """A report row's timing quality with the clean rounds of all it ran: `clean 15/15`."""
    rounds = f" {row['clean_rounds']}/{row['rounds']}" if row.get("rounds") else ""
    # A report written before figures were judged has no quality: say so, don't fail.
    return f"{row.get('timing_quality', 'unknown')}{rounds}"


def _us(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


_BREAKS = (", ", " ", "(")  # a cut goes before a separator, or just after an opening paren


def shorten(text: str, width: int) -> str:
    """`text` in at most `width` characters, cut at a word or argument boundary with `…`.

    Operator labels are `op(arg, arg, ...)`; a label cut mid-argument (`f32[16x6`) reads as a
    different shape, so the cut goes after the last whole argument or word that fits.
    """
    if len(text) <= width:
        return text
    room = text[: width - 1]
    cut = max(room.rfind(b) + (b == "(") for b in _BREAKS)
    return (room[:cut] if cut > 0 else room).rstrip(" ,→") + "…"


_REPORT = Report()


def report() -> Report:
    """The report of every graph compiled by the kope backend in this process."""
    return _REPORT


def reset_report() -> None:
    _REPORT.graphs.clear()
    _REPORT.failed.clear()


def add_failure(why: str) -> None:
    _REPORT.failed.append(why)


def add_graph(graph: GraphReport) -> None:
    _REPORT.graphs.append(graph)


def drop_graph(graph: GraphReport) -> None:
    """Forget a graph compiled and then not used (a shape-generic try the backend set aside)."""
    _REPORT.graphs[:] = [g for g in _REPORT.graphs if g is not graph]
