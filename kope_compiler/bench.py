"""`kope bench`: the operator suite and the memory ablation, as paper-style tables.

suite    — `kope precompile` on every operator of `kope.suite.OPSET` (one store), reporting per
           operator the speedup over eager and over the pinned reference lowering, attempts
           and verdict counts, against the agents issue's goals.
ablation — the same agent with the same static priors on the fixed `kope.suite.SEQUENCE`, at a
           small budget, with the experience graph (one store through the sequence) vs with
           an empty one (a fresh store per operator), over several seeds: geomean speedup,
           pass rate, and attempts needed to reach 90% of the best kernel either arm found.
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kope.memory.store import ExperienceStore
from kope.optimize import Budget
from kope.precompile import geomean, precompile
from kope.report import PASS_RATE, table_lines, timing_text
from kope.report import speedup_text as _x
from kope.suite import ELEMENTWISE, OPSET, SEQUENCE, Example
from kope.targets.base import Target
from kope.vocabulary.evidence import SOURCE_AGENT


def run_suite(
    target: Target,
    store_dir: Path,
    budget: int,
    names: list[str] | None = None,
    seed: int = 0,
    progress: bool = True,
    cluster: str | None = None,
) -> dict[str, Any]:
    """Precompile each suite operator (on `cluster`, when given: `kope.cluster`); the report
    has one row per operator and the goals."""
    store = ExperienceStore(store_dir)
    rows: list[dict[str, Any]] = []
    start = time.monotonic()
    for name in names or list(OPSET):
        model, inputs = OPSET[name]()
        report = precompile(
            model,
            inputs,
            target=target,
            store=store,
            budget=Budget(attempts=budget),
            seed=seed,
            progress=progress,
            cluster=cluster,
        )
        for row in report["operators"]:
            rows.append({"name": name, **row})
    non_elementwise = [r for r in rows if r["name"] not in ELEMENTWISE]
    wins = [r for r in rows if r["winner"] == "agent" and (r["speedup_vs_eager"] or 0) >= 1.1]
    return {
        "operators": rows,
        "summary": {
            "operators": len(rows),
            "pass_rate": sum(1 for r in rows if r["verified"]) / max(len(rows), 1),
            "geomean_speedup_vs_eager": geomean([r["speedup_vs_eager"] for r in rows]),
            "geomean_speedup_vs_reference": geomean([r["speedup_vs_reference"] for r in rows]),
            "geomean_speedup_vs_reference_non_elementwise": geomean(
                [r["speedup_vs_reference"] for r in non_elementwise]
            ),
            "agent_beats_eager_1_1x": len(wins),
            "tokens": sum(r["tokens"] for r in rows),
            "budget": budget,
            "timed": target.timed(),  # False: kernels interpreted, no figures
            "wall_s": time.monotonic() - start,
        },
    }


def format_suite(report: dict[str, Any]) -> str:
    header = (
        "operator",
        "winner",
        "eager µs",
        "best µs",
        "vs eager",
        "vs reference",
        "timing",
        "attempts",
        "verdicts",
    )
    rows = [header]
    timed = report["summary"].get("timed", True)
    for r in report["operators"]:
        rows.append(
            (
                r["name"],
                r["winner"],
                _f(r["eager_us"]),
                _f(r["best_us"]),
                _x(r["speedup_vs_eager"], r["timing_quality"]),
                _x(r["speedup_vs_reference"], r["timing_quality"]),
                timing_text(r) if timed else "untimed",
                str(r["attempts"]),
                " ".join(f"{k}:{v}" for k, v in r["verdicts"].items()),
            )
        )
    s = report["summary"]
    lines = table_lines(rows)
    lines += [
        f"pass rate {s['pass_rate']:.0%} of {s['operators']} operators ({PASS_RATE}); "
        f"geomean speedup {_x(s['geomean_speedup_vs_eager'])} vs eager, "
        f"{_x(s['geomean_speedup_vs_reference'])} vs reference",
        f"goal: geomean >= 5x over the reference on non-elementwise operators: "
        f"{_x(s['geomean_speedup_vs_reference_non_elementwise'])}",
        f"goal: the agent's kernel beats eager by >= 1.1x on >= {math.ceil(s['operators'] / 3)} "
        f"operators: {s['agent_beats_eager_1_1x']}",
        f"budget {s['budget']} attempts per operator; {s['wall_s']:.0f} s",
    ]
    return "\n".join(lines)


# -- the memory ablation -----------------------------------------------------------------------


def _trajectory(store: ExperienceStore, key: str, agent: str) -> list[float]:
    """Best-so-far latency (µs) after each agent attempt, inf before a verified one."""
    best, out = math.inf, []
    for attempt in store.attempts(key):
        if attempt.source != SOURCE_AGENT or attempt.agent != agent or attempt.confirms:
            continue
        if attempt.verdict == "verified" and attempt.latency_us:
            best = min(best, attempt.latency_us)
        out.append(best)
    return out


def run_ablation(
    target: Target,
    budget: int,
    seeds: list[int],
    work_dir: Path,
    sequence: dict[str, Callable[[], Example]] = SEQUENCE,
    progress: bool = False,
    agent_config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Memory vs empty memory, seed by seed, operator by operator (the two arms interleaved)."""
    results: dict[str, dict[int, list[dict[str, Any]]]] = {"memory": {}, "empty": {}}
    for seed in seeds:
        shared = ExperienceStore(work_dir / f"memory-seed{seed}")
        for arm in results:
            results[arm][seed] = []
        for index, (name, factory) in enumerate(sequence.items()):
            model, inputs = factory()
            arms = ["memory", "empty"] if (index + seed) % 2 == 0 else ["empty", "memory"]
            for arm in arms:
                store = (
                    shared
                    if arm == "memory"
                    else ExperienceStore(work_dir / f"empty-seed{seed}-{index}")
                )
                report = precompile(
                    model,
                    inputs,
                    target=target,
                    store=store,
                    budget=Budget(attempts=budget),
                    seed=seed,
                    progress=progress,
                    agent_config=agent_config,
                )
                row = report["operators"][0]
                row["name"] = name
                row["trajectory"] = _trajectory(store, row["key"], "heuristic")
                results[arm][seed].append(row)
    summary = summarize_ablation(results, budget)
    summary["agent_config"] = agent_config or {}
    return summary


def summarize_ablation(
    results: dict[str, dict[int, list[dict[str, Any]]]], budget: int
) -> dict[str, Any]:
    arms: dict[str, dict[str, Any]] = {}
    seeds = sorted(results["memory"])
    for arm, by_seed in results.items():
        geo, passes, reach = [], [], []
        for seed in seeds:
            rows = by_seed[seed]
            others = results["empty" if arm == "memory" else "memory"][seed]
            geo.append(geomean([r["speedup_vs_eager"] for r in rows]) or 0.0)
            passes.append(sum(1 for r in rows if r["verified"]) / len(rows))
            needed = []
            for row, other in zip(rows, others, strict=True):
                best = min(
                    min(row["trajectory"], default=math.inf),
                    min(other["trajectory"], default=math.inf),
                )
                hit = next(
                    (i + 1 for i, lat in enumerate(row["trajectory"]) if lat <= best / 0.9),
                    budget + 1,
                )
                needed.append(hit)
            reach.append(statistics.mean(needed))
        arms[arm] = {
            "geomean_speedup_vs_eager": _spread(geo),
            "pass_rate": _spread(passes),
            "attempts_to_90pct_of_best": _spread(reach),
        }
    return {"budget": budget, "seeds": seeds, "arms": arms, "runs": results}


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.mean(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def format_ablation(result: dict[str, Any]) -> str:
    rows = [("arm", "geomean speedup vs eager", "pass rate", "attempts to 90% of best")]
    for arm, m in result["arms"].items():
        g, p, a = m["geomean_speedup_vs_eager"], m["pass_rate"], m["attempts_to_90pct_of_best"]
        rows.append(
            (
                "with experience graph" if arm == "memory" else "empty memory",
                f"{g['mean']:.2f}x ± {g['stdev']:.2f}",
                f"{p['mean']:.0%} ± {p['stdev']:.0%}",
                f"{a['mean']:.2f} ± {a['stdev']:.2f}",
            )
        )
    lines = table_lines(rows)
    prior = (
        "flat prior" if result.get("agent_config", {}).get("prior_weight") == 0 else "static prior"
    )
    lines.append(
        f"heuristic agent, {prior}; budget {result['budget']} attempts per operator; "
        f"seeds {result['seeds']}; "
        f"{len(next(iter(result['runs']['memory'].values())))} operators in sequence "
        "(mean ± stdev over seeds; 'budget+1' counts an operator never reaching 90%)"
    )
    lines.append(f"pass rate: {PASS_RATE}")
    return "\n".join(lines)


def _f(value: float | None) -> str:
    return f"{value:.1f}" if value else "-"


def write_json(data: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def scratch_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
