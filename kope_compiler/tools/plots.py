"""Plots of a `kope bench` report and of one task's experience graph, as PNG and SVG.

- `speedup_bars`: per operator, the speedup over eager of each arm's kernel (log scale)
- `best_so_far`: per arm, the geomean speedup KOPE would run after each agent attempt
- `trajectory_tree`: one task's attempts as a tree under its baselines, coloured by verdict
- `plot_report`: the above into one directory, under fixed names

matplotlib is an optional dependency (`pip install 'kope[bench]'`), imported only when a plot
is drawn so that `kope bench` without plots needs none of it. Figures are drawn on
`matplotlib.figure.Figure` objects, never through pyplot, so drawing one changes no global
backend or state of the calling process (PNG is rendered with Agg, SVG with the SVG backend).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import networkx as nx

from kope.core.errors import KopeError
from kope.frontend.report import shorten
from kope.memory.schema import CONFIRMS, REFINES, AttemptRecord
from kope.memory.standing import speedup_over_baseline, winner
from kope.memory.store import ExperienceStore
from kope.vocabulary.evidence import (
    COMPILE_ERROR,
    MISMATCH,
    RUNTIME_ERROR,
    SOURCE_AGENT,
    SOURCE_EAGER,
    SOURCE_REFERENCE,
    TIMEOUT,
    VERDICT_NAMES,
    VERIFIED,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.typing import LineStyleType

# Fill colours of the trajectory tree's nodes, one per verdict (light, so labels stay black).
VERDICT_COLOURS = {
    VERIFIED: "#8fd19e",
    MISMATCH: "#f28b82",
    COMPILE_ERROR: "#fbc26e",
    RUNTIME_ERROR: "#c7a4e0",
    TIMEOUT: "#bdbdbd",
}
# The tree's edge that no store edge stands behind: an agent attempt with no recorded parent
# is drawn under the task's baseline, the program every proposal starts from.
STARTS = "starts"
EDGE_STYLES: dict[str, tuple[str, LineStyleType, str]] = {  # kind -> colour, style, legend
    REFINES: ("#444444", "-", "refines (attempt it was derived from)"),
    CONFIRMS: ("#1f6fb4", "--", "confirms (re-measured against eager)"),
    STARTS: ("#aaaaaa", ":", "no recorded parent"),
}
FASTER, SLOWER = "#2a9d8f", "#e76f51"  # a single arm's bars above / below eager
ARM_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")
LABEL_WIDTH = 40  # characters of an operator's tick label


def speedup_bars(report: dict[str, Any], path_stem: Path) -> list[Path]:
    """Per operator, each arm's speedup over eager as a bar from 1 (eager) on a log axis: the
    geomean over seeds, with whiskers from the least to the most; an operator with no verified
    kernel in an arm keeps its slot, marked with an x at 1.

    One row per operator, in the suite's order from the top: a suite of a hundred operators
    then grows down, with its labels level, where columns made a picture 17,000 pixels wide."""
    rows = report["operators"]
    groups, group_of = _operator_groups(rows)
    arms = _arms(report)
    fig = _figure(10.0, max(3.5, 1.8 + len(groups) * (0.1 + 0.14 * len(arms))))
    ax = fig.add_subplot()
    multi = len(arms) > 1
    height = 0.8 / len(arms)
    found: list[float] = [1.0]
    unverified_y: list[float] = []
    for a, arm in enumerate(arms):
        colour = ARM_COLOURS[a % len(ARM_COLOURS)]
        for g, group in enumerate(groups):
            y = g - 0.4 + height * (a + 0.5)
            seeds = [r for r in rows if r["arm"] == arm and group_of(r) == group]
            values = [v for r in seeds if (v := _verified_speedup(r)) is not None]
            if not values:
                if seeds:
                    unverified_y.append(y)
                continue
            mean = statistics.geometric_mean(values)
            lo, hi = min(values), max(values)
            found += [lo, hi]
            faster = mean >= 1.0
            ax.barh(
                y,
                mean - 1.0,
                height * 0.9,
                left=1.0,
                color=colour if multi else FASTER if faster else SLOWER,
                alpha=1.0 if faster or not multi else 0.55,
                hatch="" if faster or not multi else "///",
                edgecolor="white" if faster or not multi else colour,
                linewidth=0.8,
                zorder=2,
            )
            if len(values) > 1:
                ax.errorbar(
                    mean,
                    y,
                    xerr=[[mean - lo], [hi - mean]],
                    color="#333333",
                    capsize=2,
                    linewidth=1,
                    zorder=3,
                )
            share = "" if len(values) == len(seeds) else f" ({len(values)}/{len(seeds)} seeds)"
            ax.annotate(
                f"{mean:.2f}×{share}",
                (hi if faster else lo, y),
                xytext=(3 if faster else -3, 0),
                textcoords="offset points",
                ha="left" if faster else "right",
                va="center",
                fontsize=7,
            )
    ax.axvline(1.0, color="black", linewidth=1.2, zorder=2.5)
    if unverified_y:
        ax.plot(
            [1.0] * len(unverified_y),
            unverified_y,
            "x",
            color="#c0392b",
            markersize=8,
            markeredgewidth=2,
            zorder=4,
        )
    ax.set_xscale("log")
    _speedup_axis(ax, min(found) / 1.5, max(found) * 1.5)
    ax.set_yticks(range(len(groups)), [_row_label(g) for g in groups], fontsize=8)
    ax.set_ylim(len(groups) - 0.4, -0.6)  # the first operator on top
    if len(groups) > 12:
        ax.tick_params(axis="x", labeltop=True)  # a tall figure: the scale at both ends
    ax.grid(axis="x", which="major", alpha=0.3, zorder=0)
    ax.set_ylabel("operator")
    ax.set_xlabel("speedup over eager (log scale)")
    ax.legend(  # beside the bars, never over one
        handles=_bar_legend(arms, multi, bool(unverified_y)),
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
    )
    seeds = report.get("seeds") or []
    fig.suptitle("Speedup over eager, per operator", fontweight="bold")
    ax.set_title(
        f"{_run_text(report)}\nbar: geomean over {len(seeds)} seed(s); whiskers: min to max "
        "over seeds; right of 1 the kernel beats eager",
        fontsize=9,
    )
    return _save(fig, path_stem)


def best_so_far(report: dict[str, Any], path_stem: Path) -> list[Path]:
    """Per arm, the geomean over operators and seeds of the effective speedup after each
    agent attempt: max(1, the best verified speedup over eager so far), what KOPE would run;
    the band spans the seeds' own geomeans, from the least to the most."""
    fig = _figure(8.0, 5.0)
    from matplotlib.ticker import MaxNLocator

    ax = fig.add_subplot()
    rows = report["operators"]
    steps = int(report.get("budget") or 0) or max((len(r["trajectory"]) for r in rows), default=0)
    x = list(range(1, steps + 1))
    top = 1.0
    for a, arm in enumerate(_arms(report)):
        colour = ARM_COLOURS[a % len(ARM_COLOURS)]
        mine = [r for r in rows if r["arm"] == arm]
        if not mine or not steps:
            continue
        curves = [_effective(r["trajectory"], steps) for r in mine]
        mean = [statistics.geometric_mean(c[i] for c in curves) for i in range(steps)]
        by_seed: dict[int, list[list[float]]] = {}
        for row, curve in zip(mine, curves, strict=True):
            by_seed.setdefault(row["seed"], []).append(curve)
        seed_means = [
            [statistics.geometric_mean(c[i] for c in seed) for i in range(steps)]
            for seed in by_seed.values()
        ]
        lo = [min(s[i] for s in seed_means) for i in range(steps)]
        hi = [max(s[i] for s in seed_means) for i in range(steps)]
        top = max(top, *hi)
        ax.plot(
            x,
            mean,
            color=colour,
            linewidth=2,
            marker="o" if steps <= 24 else None,
            markersize=4,
            label=f"{arm}: {mean[-1]:.2f}× after {steps}",
            zorder=3,
        )
        if len(seed_means) > 1:
            ax.fill_between(x, lo, hi, color=colour, alpha=0.18, linewidth=0, zorder=2)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="eager (1×)", zorder=2)
    ax.set_xlim(0.5, max(steps, 1) + 0.5)
    ax.set_ylim(0.97, 1.0 + (top - 1.0) * 1.12 + 0.05)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_formatter(_times_formatter())
    ax.grid(alpha=0.3, zorder=0)
    ax.set_xlabel("agent attempts")
    ax.set_ylabel("geomean effective speedup over eager")
    ax.legend(loc="lower right", fontsize=8)
    operators = len({(r["name"], r["label"]) for r in rows})
    seeds = len({r["seed"] for r in rows})
    fig.suptitle("Best speedup so far, per attempt", fontweight="bold")
    ax.set_title(
        f"{_run_text(report)}\neffective speedup = max(1, best verified speedup so far): KOPE "
        f"runs eager unless a kernel beats it\ngeomean over {operators} operator(s) × "
        f"{seeds} seed(s); band: min to max over seeds",
        fontsize=9,
    )
    return _save(fig, path_stem)


def trajectory_graph(store: ExperienceStore, key: str) -> nx.DiGraph:
    """Task `key`'s attempts as a tree: an edge from each attempt to the attempts derived from
    it (`refines`) and to those that re-measured it (`confirms`), and from the baseline to an
    agent attempt with no recorded parent (`STARTS`). Each node is an attempt id with the
    attributes `record`, `role` (eager, reference, agent, confirmation, ...), `index` (the
    agent attempt's number, from 1, in the order they were made), `label`, `depth`, and
    `runs`: whether the task's choice rests on it (`ExperienceStore.standing`)."""
    task = store.task(key)
    if task is None:
        raise KopeError(
            f"no task {key!r} in the experience store at {store.root}; "
            f"`kope memory tasks --store {store.root}` lists its tasks"
        )
    graph = nx.DiGraph(label=task.label, target=task.target)
    pinned = winner(store.attempts(key)).pinned
    number = 0
    baseline: str | None = None
    # Edges are added child by child, oldest first, so that a node's successors (the order
    # the layout draws siblings in) are in the order they were made.
    for attempt in store.attempts(key):
        role = _role(attempt)
        if role == SOURCE_AGENT:
            number += 1
        graph.add_node(
            attempt.id,
            record=attempt,
            role=role,
            index=number if role == SOURCE_AGENT else None,
            label=_node_label(attempt, role, number),
            runs=pinned is not None and pinned.id == attempt.id,
        )
        if role == SOURCE_REFERENCE or (role == SOURCE_EAGER and baseline is None):
            baseline = attempt.id
        for dst, kind in store.edges_from(attempt.id):
            if kind in (REFINES, CONFIRMS) and dst in graph:
                graph.add_edge(dst, attempt.id, kind=kind)
        if role == SOURCE_AGENT and attempt.parent is None and baseline is not None:
            graph.add_edge(baseline, attempt.id, kind=STARTS)
    for node in nx.topological_sort(graph):
        parents = [graph.nodes[p]["depth"] for p in graph.predecessors(node)]
        graph.nodes[node]["depth"] = 1 + min(parents) if parents else 0
    return graph


def trajectory_tree(
    store: ExperienceStore, key: str, path_stem: Path, where: str = ""
) -> list[Path]:
    """Task `key`'s experience graph as a trajectory tree (`trajectory_graph`): baselines on
    top, each attempt under the one it refines, coloured by verdict, labelled with its number
    and speedup over eager; the kernel the task runs is outlined. `where` says which run the
    store is (a bench's arm and seed); the subtitle names the store."""
    graph = trajectory_graph(store, key)
    if not graph:
        raise KopeError(f"task {key!r} in {store.root} has no attempts yet: no tree to draw")
    xy = tree_positions(graph)
    slots = 1 + max(x for x, _ in xy.values())
    depth = 1 - min(y for _, y in xy.values())
    fig = _figure(min(32.0, max(9.0, 1.25 * slots + 4.5)), min(24.0, 0.9 * depth + 2.0))
    ax = fig.add_subplot()
    kinds = set()
    for src, dst, kind in graph.edges(data="kind"):
        kinds.add(kind)
        colour, style, _ = EDGE_STYLES[kind]
        (x0, y0), (x1, y1) = xy[src], xy[dst]
        ax.plot([x0, x1], [y0, y1], color=colour, linestyle=style, linewidth=1.4, zorder=1)
    for node, data in graph.nodes(data=True):
        record: AttemptRecord = data["record"]
        runs = data["runs"]
        ax.text(
            *xy[node],
            data["label"],
            ha="center",
            va="center",
            fontsize=8,
            fontweight="bold" if runs else "normal",
            zorder=3,
            bbox={
                "boxstyle": "round,pad=0.35" if data["role"] == SOURCE_AGENT else "square,pad=0.35",
                "facecolor": VERDICT_COLOURS.get(record.verdict, "white"),
                "edgecolor": "#d4a017" if runs else "#555555",
                "linewidth": 3.0 if runs else 0.8,
            },
        )
    xs = [p[0] for p in xy.values()]
    ys = [p[1] for p in xy.values()]
    ax.set_xlim(min(xs) - 0.7, max(xs) + 0.7)
    ax.set_ylim(min(ys) - 0.6, max(ys) + 0.6)
    ax.set_axis_off()
    verdicts = {d["record"].verdict for _, d in graph.nodes(data=True)}
    ax.legend(
        handles=_tree_legend(verdicts, kinds, any(runs for _, runs in graph.nodes(data="runs"))),
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
        frameon=False,
    )
    agents = sum(1 for _, d in graph.nodes(data=True) if d["role"] == SOURCE_AGENT)
    confirmations = sum(1 for _, d in graph.nodes(data=True) if d["role"] == "confirmation")
    fig.suptitle(f"Trajectory tree: {shorten(graph.graph['label'], 90)}", fontweight="bold")
    ax.set_title(
        f"{agents} agent attempt(s) and {confirmations} confirmation(s) on "
        f"{graph.graph['target']}{f' ({where})' if where else ''}; store {store.root}"
        "\nlabel: attempt number and speedup over eager",
        fontsize=9,
    )
    return _save(fig, path_stem)


def plot_report(
    report: dict[str, Any], directory: Path, store: ExperienceStore | None = None
) -> list[Path]:
    """`speedup.png/svg` and `best_so_far.png/svg` of `report` in `directory`, and with `store`
    `tree-<label>.png/svg`, the trajectory tree of its operator with the most attempts."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = speedup_bars(report, directory / "speedup")
    paths += best_so_far(report, directory / "best_so_far")
    if store is not None:
        known = [r["key"] for r in report["operators"] if store.task(r["key"]) is not None]
        keys = list(dict.fromkeys(known)) or [t.key for t in store.tasks()]
        key = max(keys, key=lambda k: len(store.attempts(k)), default=None)
        if key is not None and store.attempts(key):
            task = store.task(key)
            label = task.label if task is not None else key
            row = next(
                (
                    r
                    for r in report["operators"]
                    if r["key"] == key and r["store"] == str(store.root)
                ),
                None,
            )
            where = f"arm {row['arm']}, seed {row['seed']}" if row else ""
            paths += trajectory_tree(store, key, directory / f"tree-{_safe_name(label)}", where)
    return paths


def require_matplotlib() -> None:
    """Raise the install hint where matplotlib is missing (`kope bench --plot` asks before
    its run, not after it)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise KopeError(
            "the plots of `kope bench` need matplotlib: pip install 'kope[bench]'"
        ) from err


def _figure(width: float, height: float) -> Figure:
    require_matplotlib()
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _save(fig: Figure, path_stem: Path) -> list[Path]:
    """Write `<path_stem>.png` and `<path_stem>.svg`: appended, never `with_suffix`, which
    would cut a stem with a dot of its own (`tree-aten.mm_...`) short."""
    path_stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [path_stem.with_name(f"{path_stem.name}{ext}") for ext in (".png", ".svg")]
    for path in paths:
        fig.savefig(path, dpi=150)
    return paths


def _arms(report: dict[str, Any]) -> list[str]:
    """The report's arms in its order, then any that only its rows name."""
    named = list(report.get("arms") or {})
    return named + [
        a for a in dict.fromkeys(r["arm"] for r in report["operators"]) if a not in named
    ]


def _operator_groups(
    rows: list[dict[str, Any]],
) -> tuple[list[str], Callable[[dict[str, Any]], str]]:
    """The bar groups in the order of the rows, and the function naming a row's group: its
    suite name, with the task's label when that name yields several tasks."""
    labels: dict[str, set[str]] = {}
    for row in rows:
        labels.setdefault(row["name"], set()).add(row["label"])

    def group_of(row: dict[str, Any]) -> str:
        name = str(row["name"])
        return name if len(labels[name]) == 1 else f"{name}: {row['label']}"

    return list(dict.fromkeys(group_of(r) for r in rows)), group_of


def _row_label(group: str) -> str:
    """A bar group's tick label: a suite name that yields several tasks gets its task's label
    on a second line, so that the tasks stay told apart when either is shortened."""
    name, _, label = group.partition(": ")
    return shorten(name, LABEL_WIDTH) + (f"\n{shorten(label, LABEL_WIDTH)}" if label else "")


def _verified_speedup(row: dict[str, Any]) -> float | None:
    value = row.get("speedup_vs_eager")
    if not row.get("verified") or value is None or not value > 0 or not math.isfinite(value):
        return None
    return float(value)


def _effective(trajectory: list[float | None], steps: int) -> list[float]:
    """max(1, best so far) after each of `steps` attempts; a run that stopped early keeps its
    last value (the best so far does not change after it)."""
    out: list[float] = []
    for i in range(steps):
        value = trajectory[min(i, len(trajectory) - 1)] if trajectory else None
        out.append(max(1.0, value) if value is not None and math.isfinite(value) else 1.0)
    return out


def _run_text(report: dict[str, Any]) -> str:
    parts = [
        f"suite {report.get('suite', '?')}",
        f"target {report.get('target', '?')}",
        f"agent {report.get('agent', '?')}",
        f"budget {report.get('budget', '?')}",
    ]
    if report.get("ablate"):
        parts.append(f"ablating {report['ablate']}")
    return " · ".join(parts)


def _times_formatter() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: f"{v:g}×")


def _speedup_axis(ax: Axes, lo: float, hi: float) -> None:
    """Log-scale x limits around [lo, hi] with ticks at 1-2-5 steps, written as `2×`."""
    from matplotlib.ticker import FixedLocator, NullFormatter

    lo, hi = min(lo, 0.8), max(hi, 1.25)
    ticks = [
        m * 10.0**e
        for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
        for m in (1, 2, 5)
        if lo <= m * 10.0**e <= hi
    ]
    ax.set_xlim(lo, hi)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(_times_formatter())
    ax.xaxis.set_minor_formatter(NullFormatter())


def _bar_legend(arms: list[str], multi: bool, unverified: bool) -> list[Any]:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    if multi:
        handles: list[Any] = [
            Patch(facecolor=ARM_COLOURS[a % len(ARM_COLOURS)], label=arm)
            for a, arm in enumerate(arms)
        ]
        handles.append(
            Patch(facecolor="white", edgecolor="#555555", hatch="///", label="slower than eager")
        )
    else:
        handles = [
            Patch(facecolor=FASTER, label="faster than eager"),
            Patch(facecolor=SLOWER, label="slower than eager"),
        ]
    handles.append(Line2D([], [], color="black", linewidth=1.2, label="eager (1×)"))
    if unverified:
        handles.append(
            Line2D(
                [],
                [],
                marker="x",
                color="#c0392b",
                linestyle="",
                markeredgewidth=2,
                label="no verified kernel",
            )
        )
    return handles


def _tree_legend(verdicts: set[str], kinds: set[str], pinned: bool) -> list[Any]:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Any] = [
        Patch(facecolor=colour, edgecolor="#555555", label=VERDICT_NAMES[verdict])
        for verdict, colour in VERDICT_COLOURS.items()
        if verdict in verdicts
    ]
    handles += [
        Line2D([], [], color=colour, linestyle=style, label=text)
        for kind, (colour, style, text) in EDGE_STYLES.items()
        if kind in kinds
    ]
    if pinned:
        handles.append(
            Patch(
                facecolor="white",
                edgecolor="#d4a017",
                linewidth=3,
                label="pinned: the kernel it runs",
            )
        )
    handles.append(Patch(facecolor="white", edgecolor="#555555", label="square: baseline"))
    return handles


def _role(attempt: AttemptRecord) -> str:
    if attempt.confirms is not None:
        return "confirmation"
    return attempt.source


def _node_label(attempt: AttemptRecord, role: str, number: int) -> str:
    speedup = speedup_over_baseline(attempt) if attempt.latency_us is not None else 0.0
    figure = f"{speedup:.2f}×" if speedup else "-"
    head = {
        SOURCE_AGENT: f"#{number}",
        SOURCE_EAGER: "eager",
        SOURCE_REFERENCE: "reference",
        "confirmation": "confirm",
    }.get(role, role)
    reused = "\nreused" if attempt.transferred_from else ""
    return f"{head}\n{figure}{reused}"


def tree_positions(graph: nx.DiGraph) -> dict[str, tuple[float, float]]:
    """(x, y) of each node of a `trajectory_graph`: y is minus its depth; x puts each leaf in
    the next slot, in depth-first order from the roots (eager first, then by age), and each
    parent at the mean of its children's. networkx's layered layouts (multipartite, bfs) centre
    each layer on its own, which draws an attempt under an unrelated one; this keeps every
    subtree under its root, with no two subtrees' edges crossing."""
    roots = sorted(
        (n for n in graph if graph.in_degree(n) == 0),
        key=lambda n: (graph.nodes[n]["role"] != SOURCE_EAGER, graph.nodes[n]["record"].created),
    )
    x: dict[str, float] = {}
    leaves = 0
    for root in roots:
        for node in nx.dfs_postorder_nodes(graph, root):
            if node in x:
                continue
            below = graph.nodes[node]["depth"] + 1
            kids = [x[k] for k in graph.successors(node) if graph.nodes[k]["depth"] == below]
            if kids:
                x[node] = statistics.fmean(kids)
            else:
                x[node], leaves = float(leaves), leaves + 1
    return {n: (x[n], -float(graph.nodes[n]["depth"])) for n in graph}


def _safe_name(label: str) -> str:
    """A file-name part of an operator label: `aten.mm(4x4xf32)` -> `aten.mm_4x4xf32`."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_")[:80] or "task"
