"""What KOPE did with each compiled graph: per Task, the kernel it runs, why, and how fast.

`kope.report()` returns the report of every graph compiled in this process. Kernel calls are
counted at run time, so a test can tell a kernel that was chosen from one that actually ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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

    @property
    def jit(self) -> bool:
        return self.kernel != "eager"

    @property
    def speedup(self) -> float | None:
        if self.eager_us and self.kernel_us:
            return self.eager_us / self.kernel_us
        return None


@dataclass
class EagerReport:
    """A node that ran eagerly, and why; `compute` marks operators KOPE could not take."""

    op: str
    reason: str
    compute: bool


@dataclass
class GraphReport:
    tasks: list[TaskReport] = field(default_factory=list)
    eager: list[EagerReport] = field(default_factory=list)
    views: int = 0
    compile_s: float = 0.0
    policy: str = "auto"

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
        """A per-Task table: kernel, latency vs eager, and the reason for each choice."""
        rows = [("task", "kernel", "kernel µs", "eager µs", "speedup", "calls", "why")]
        for t in self.tasks:
            rows.append((
                _clip(t.label, 60), t.kernel, _us(t.kernel_us), _us(t.eager_us),
                f"{t.speedup:.2f}x" if t.speedup else "-", str(t.calls), _clip(t.reason, 50),
            ))
        for e in self.eager:
            if e.compute:
                rows.append((_clip(e.op, 60), "eager", "-", "-", "-", "-", _clip(e.reason, 50)))
        lines = table_lines(rows)
        lines.append(
            f"{len(self.tasks)} tasks, {sum(1 for t in self.tasks if t.jit)} on JIT kernels; "
            f"JIT share of compute operators that ran: {self.jit_share():.0%}"
        )
        return "\n".join(lines)


def table_lines(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows of cells as aligned text columns, the first row a header underlined with dashes."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def speedup_text(value: float | None) -> str:
    return f"{value:.2f}x" if value else "-"


def _us(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


_REPORT = Report()


def report() -> Report:
    """The report of every graph compiled by the kope backend in this process."""
    return _REPORT


def reset_report() -> None:
    _REPORT.graphs.clear()


def add_graph(graph: GraphReport) -> None:
    _REPORT.graphs.append(graph)
