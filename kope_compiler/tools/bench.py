"""`kope bench`: a suite of operators through `kope precompile`, as paper-style tables.

One engine, `run_bench`, runs a suite (`kope.tools.suite.load_suite` of a directory, or the built-in
`OPSET` / `SEQUENCE`) in a fixed order, seed by seed, in one or two arms:

- no ablation: one arm, `default`, one store per seed through the whole suite;
- `memory`: `memory_on` (one store per seed, the suite in order, so later operators can use
  what earlier ones taught) against `memory_off` (an empty store for every operator);
- `context`: `context_acmi` (ACMI packing at the loop's default context budget) against
  `context_passive` (no retrieved experience; every earlier attempt of the operator, kernel
  text and feedback, appended to the prompt: agent-led context construction). Only the LLM
  agent reads the prompt, so only it differs between these arms;
- `prior`: `static` (the heuristic agent's hand-written prior) and `flat` (no prior), each from
  an empty store for every operator, against `flat_warm` (no prior, starting from a copy of
  the warm store and carried through the suite): whether experience replaces hand knowledge.

`warm_store`: every arm that carries a store through the suite (`default`, `memory_on`, the
context arms, `flat_warm`) starts each seed from a copy of it (merged into the arm's empty
store; the warm store is only read). Arms that start empty per operator never see it.

Fair arms: each seed starts from fresh stores, the two arms of one operator run back to back
(which goes first alternates), and their winners are then re-timed against eager together in
one interleaved round, so that the speedups compared come from one measurement (over the
reference lowering, through one reference/eager ratio for all arms). With `checkpoint` K, each
arm's best kernel after its first K attempts joins that round (`geomean_after_checkpoint`):
the best of K noisy figures against the best of many reads the longer search high.

Per arm the report has the pass rate (`PASS_RATE`), geomean speedups over eager and over the
reference lowering (of the kernel each operator runs: eager, 1.0, when no kernel beats it),
fast_p for p = 1.0 and 1.2 (KernelBench's, for what KOPE runs: the share of ALL operators
whose running kernel is KOPE's, the agent's or the reference lowering, verified, and more than
p times faster than eager), prompt and completion
tokens, attempts needed to reach 90% of the best kernel either arm found (`budget + 1` when
never reached), and wall time; each as the mean over seeds with its spread.
"""

from __future__ import annotations

import json
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from kope.core.errors import KopeError
from kope.core.options import Options
from kope.core.task import Task
from kope.frontend.report import PASS_RATE, shorten, table_lines
from kope.frontend.report import speedup_text as _x
from kope.memory.standing import winner
from kope.memory.store import ExperienceStore
from kope.targets.base import Target
from kope.targets.measure import MeasureConfig, eager_threads, measure_interleaved, rotating
from kope.targets.verify import timing_inputs
from kope.tools.precompile import geomean, precompile, trace_tasks
from kope.tools.suite import Example
from kope.tuner.measuring import seed_for, stored_kernel, threads_now
from kope.tuner.optimize import Budget, is_proposal
from kope.vocabulary.evidence import (
    SOURCE_AGENT,
    SOURCE_REFERENCE,
    TIMING_CLEAN,
    TIMING_CONTAMINATED,
    VERIFIED,
    Timing,
)
from kope.vocabulary.kernels import Kernel

log = logging.getLogger("kope.bench")

Suite = dict[str, Callable[[], Example]]

ABLATIONS: dict[str | None, tuple[str, ...]] = {
    None: ("default",),
    "memory": ("memory_on", "memory_off"),
    "context": ("context_acmi", "context_passive"),
    "prior": ("static", "flat", "flat_warm"),
}
# Arms that start every operator from an empty store (the cold agent); the others carry one
# store through the suite, from the warm store where one is given.
COLD_ARMS = ("memory_off", "static", "flat")
ARM_AGENT_CONFIG: dict[str, dict[str, Any]] = {
    "context_passive": {"context": "passive"},
    "static": {"prior": "static"},
    "flat": {"prior": "flat"},
    "flat_warm": {"prior": "flat"},
}
FAST_P = (1.0, 1.2)
# fast_p counts an operator whose running kernel is one of these: KOPE's answer for it.
KOPE_KERNELS = (SOURCE_AGENT, SOURCE_REFERENCE)
RETIMES = 3  # rounds of the arms' joint re-timing, while the machine disturbs them
AFTER_CHECKPOINT = "@checkpoint"  # an arm's kernel after the checkpoint, in a joint round
REACH = 0.9  # attempts_to_90: attempts until a kernel within 90% of the best either arm found
METRICS = (
    "pass_rate",
    "geomean_speedup_vs_eager",
    "geomean_speedup_vs_reference",
    *(f"fast_{p}" for p in FAST_P),
    "tokens",
    "prompt_tokens",
    "completion_tokens",
    "attempts_to_90",
    "attempts",
    "wall_s",
    "geomean_after_checkpoint",
)


@dataclass
class BenchConfig:
    """One bench run: the target, the suite's settings, the ablation's arms."""

    target: Target
    # The `budget` option (attempts per operator), default read from `Options`; the CLI gives
    # ablations a smaller one (`kope bench --help`).
    budget: int = field(default_factory=lambda: Options.default("budget"))
    seeds: list[int] = field(default_factory=lambda: [0])
    ablate: str | None = None  # None | "memory" | "context" | "prior"
    agent: str = "heuristic"
    agent_config: dict[str, Any] = field(default_factory=dict)
    progress: bool = True
    cluster: str | None = None
    report_path: Path | None = None  # rewritten after every operator while the run goes on
    warm_store: Path | None = None  # the store-carrying arms start from a copy of it
    # Also re-time each arm's best kernel after its first `checkpoint` agent attempts, in the
    # winners' round: a warm store after budget/4 attempts against a cold search's final
    # (issue 44's cost), from one measurement rather than from the best of many noisy ones.
    checkpoint: int | None = None

    @property
    def arms(self) -> tuple[str, ...]:
        return ABLATIONS[self.ablate]


def run_bench(suite: Suite, config: BenchConfig, work_dir: Path, name: str = "") -> dict[str, Any]:
    """Run `suite` in order, seed by seed and arm by arm; the report (module docstring)."""
    if config.ablate not in ABLATIONS:
        raise ValueError(f"unknown ablation {config.ablate!r}: use memory, context or prior")
    if config.ablate == "prior" and config.warm_store is None:
        raise ValueError("the prior ablation's flat_warm arm needs a warm store")
    rows: list[dict[str, Any]] = []
    wall: dict[tuple[str, int], float] = {}
    broken: dict[str, str] = {}  # suite entry -> why it could not run
    for seed in config.seeds:
        stores = {arm: _arm_store(work_dir, arm, seed, config) for arm in config.arms}
        # A Task met again in a later suite entry (the same linear in two models) counts once,
        # where it first appeared: the arms then compare the same set of Tasks.
        counted: set[str] = set()
        for index, (op_name, factory) in enumerate(suite.items()):
            try:
                model, inputs = factory()
            except Exception as err:  # one broken file must not cost the suite its figures
                _broken(broken, op_name, err)
                continue
            order = config.arms if (index + seed) % 2 == 0 else config.arms[::-1]
            used: dict[str, ExperienceStore] = {}
            for arm in order:
                store = stores[arm]
                if arm in COLD_ARMS:  # an empty store for every operator
                    store = ExperienceStore(work_dir / f"{arm}-seed{seed}" / f"{index:03d}")
                start = time.monotonic()
                try:
                    report = precompile(
                        model,
                        inputs,
                        target=config.target,
                        store=store,
                        agent_name=config.agent,
                        agent_config={**config.agent_config, **_arm_agent_config(arm)},
                        budget=Budget(attempts=config.budget),
                        seed=seed,
                        progress=config.progress,
                        cluster=config.cluster,
                    )
                except KopeError:
                    raise  # the user must act (an unreachable endpoint, a store it cannot use)
                except Exception as err:  # the model fails as eager runs it, say
                    _broken(broken, op_name, err)
                    # Neither arm counts it: the arms compare the same operators.
                    rows[:] = [r for r in rows if (r["seed"], r["name"]) != (seed, op_name)]
                    used.clear()
                    break
                used[arm] = store
                wall[arm, seed] = wall.get((arm, seed), 0.0) + time.monotonic() - start
                if not report["operators"]:
                    # Nothing KOPE compiles (every operator ATen's): still one of the suite's
                    # operators, and one no arm sped up.
                    row = _eager_row(arm, seed, op_name, report)
                    rows.append(_with_checkpoint(row, config.checkpoint))
                for summary in report["operators"]:
                    if summary["key"] not in counted:
                        row = _row(arm, seed, op_name, store, summary, config.agent)
                        rows.append(_with_checkpoint(row, config.checkpoint))
            if not used:
                continue
            counted.update(r["key"] for r in rows if r["seed"] == seed)
            if len(used) > 1:
                mine = [r for r in rows if r["seed"] == seed and r["name"] == op_name]
                _retime_together(model, inputs, config, used, mine)
            if config.report_path is not None:  # a run cut short keeps what it measured
                partial = summarize(rows, config, wall, name, broken)
                write_json({**partial, "complete": False}, config.report_path)
    return {**summarize(rows, config, wall, name, broken), "complete": True}


def _broken(broken: dict[str, str], name: str, err: Exception) -> None:
    why = f"{type(err).__name__}: {err}".strip().splitlines()[0][:300]
    if name not in broken:
        log.warning("suite entry %s could not run (%s); the suite goes on without it", name, why)
    broken[name] = why


def _eager_row(arm: str, seed: int, name: str, report: dict[str, Any]) -> dict[str, Any]:
    """The row of a suite entry none of whose operators KOPE compiles: eager runs it."""
    why = "; ".join(sorted({str(e.get("reason", "")) for e in report.get("eager", [])})) or (
        "no compute operator reached KOPE"
    )
    return {
        "arm": arm,
        "seed": seed,
        "name": name,
        "key": f"eager:{name}",
        "op": "",
        "label": f"(runs on ATen: {shorten(why, 80)})",
        "winner": "eager",
        "verified": False,
        "attempts": 0,
        "speedup_vs_eager": 1.0,
        "speedup_vs_reference": None,
        "timing_quality": TIMING_CLEAN,
        "best_decision": "",
        "trajectory": [],
        "attempt_verdicts": [],
        "attempt_decisions": [],
        "tokens_in": 0,
        "tokens_out": 0,
        "store": "",
    }


def _arm_agent_config(arm: str) -> dict[str, Any]:
    return ARM_AGENT_CONFIG.get(arm, {})


def _arm_store(work_dir: Path, arm: str, seed: int, config: BenchConfig) -> ExperienceStore:
    """The store `arm` carries through the suite in `seed`: from a copy of the warm store,
    where one is given and the arm carries experience (a fresh folder: resuming an earlier
    bench's store merges nothing new)."""
    store = ExperienceStore(work_dir / f"{arm}-seed{seed}")
    if config.warm_store is not None and arm not in COLD_ARMS:
        from kope.memory.merge import merge_stores

        merged = merge_stores([config.warm_store], store)
        log.info(
            "%s seed %d starts from %d records of %s", arm, seed, merged.added, config.warm_store
        )
    return store


def _row(
    arm: str,
    seed: int,
    name: str,
    store: ExperienceStore,
    summary: dict[str, Any],
    agent: str,
) -> dict[str, Any]:
    attempts = [a for a in store.attempts(summary["key"]) if is_proposal(a, agent)]
    return {
        "arm": arm,
        "seed": seed,
        "name": name,
        **summary,
        "trajectory": _trajectory(attempts),
        "attempt_verdicts": [a.verdict for a in attempts],
        "attempt_decisions": [a.decision for a in attempts],
        "tokens_in": sum(a.tokens_in for a in attempts),
        "tokens_out": sum(a.tokens_out for a in attempts),
        "store": str(store.root),
    }


def _trajectory(attempts: list[Any]) -> list[float | None]:
    """The best verified speedup over eager after each agent attempt (None before one), of
    clean figures only: one the machine's load disturbed (537x for a 14x kernel) would set
    the best either arm found, and with it every operator's attempts to 90%."""
    best: float | None = None
    out: list[float | None] = []
    for attempt in attempts:
        clean = attempt.timing_quality == TIMING_CLEAN
        if attempt.verdict == VERIFIED and attempt.speedup_vs_eager and clean:
            best = max(best or 0.0, attempt.speedup_vs_eager)
        out.append(best)
    return out


def time_against_eager(task: Task, target: Target, kernels: dict[str, Kernel]) -> dict[str, Timing]:
    """Eager and each of `kernels` (verified kernels of `task`) timed in this process in one
    interleaved measurement, on the same rotating input sets; timings by name ("eager" too)."""
    sets = timing_inputs(task.spec, seed_for(task.key), MeasureConfig().input_sets)
    assert task.spec.eager is not None, "an operator known only as IR has no eager to time"
    fns: dict[str, Callable[[], Any]] = {
        "eager": rotating([task.spec.eager.bind(s) for s in sets])[0]
    }
    threads = {"eager": eager_threads()}
    for name, kernel in kernels.items():
        built = target.load(task.spec, kernel)
        fns[name] = rotating([partial(built, *s) for s in sets])[0]
        threads[name] = target.kernel_threads(built, eager_threads())
    return measure_interleaved(fns, MeasureConfig(), threads)


def _with_checkpoint(row: dict[str, Any], checkpoint: int | None) -> dict[str, Any]:
    """`row` with its best speedup over eager after `checkpoint` attempts, by their own
    figures (1.0 where none beat eager yet), until a joint re-timing replaces it."""
    if checkpoint is not None:
        seen = [s for s in row["trajectory"][:checkpoint] if s]
        row["speedup_vs_eager_after_checkpoint"] = max([1.0, *seen])
    return row


def _best_after(attempts: list[Any], checkpoint: int) -> Any | None:
    """The fastest of the first `checkpoint` attempts by its own clean figure, where it beats
    eager (the attempt `_trajectory` counts at that point); None: eager runs."""
    timed = [
        a
        for a in attempts[:checkpoint]
        if a.verdict == VERIFIED and a.timing_quality == TIMING_CLEAN and a.speedup_vs_eager
    ]
    best = max(timed, key=lambda a: a.speedup_vs_eager, default=None)
    return best if best is not None and best.speedup_vs_eager > 1.0 else None


def _retime_together(
    model: Any,
    inputs: Any,
    config: BenchConfig,
    stores: dict[str, ExperienceStore],
    rows: list[dict[str, Any]],
) -> None:
    """Time each arm's running kernel of every task of this suite entry against eager in one
    interleaved round, and put those figures in the entry's `rows` (the precompile figures
    stay, as `*_own_run`); with `config.checkpoint`, each arm's best kernel after that many
    attempts joins the round. A round the machine disturbed is measured again, up to RETIMES
    rounds; if none is clean, the rows keep their own figures, and say so. Only where the
    target times kernels in this process (the CPU)."""
    target = config.target
    if not target.timed() or target.memory_device() != "cpu":
        return
    tasks = {t.key: t for t in trace_tasks(model, inputs, target)}
    mine = {(r["arm"], r["key"]): r for r in rows if r["arm"] in stores}
    for key, task in tasks.items():
        arm_rows = {arm: mine.get((arm, key)) for arm in stores}
        if task.spec.eager is None or any(r is None for r in arm_rows.values()):
            continue
        kernels: dict[str, Kernel] = {}
        same: dict[str, str] = {}  # a checkpoint's kernel that is its arm's winner: timed once
        for arm, store in stores.items():
            attempts = store.attempts(key)
            pinned = winner(attempts, threads_now()).pinned
            kernel = _kernel_of(task, store, pinned)
            if kernel is not None:
                kernels[arm] = kernel
            if config.checkpoint is not None:
                proposals = [a for a in attempts if is_proposal(a, config.agent)]
                best = _best_after(proposals, config.checkpoint)
                if best is not None and pinned is not None and best.artifact == pinned.artifact:
                    same[f"{arm}{AFTER_CHECKPOINT}"] = arm
                elif (early := _kernel_of(task, store, best)) is not None:
                    kernels[f"{arm}{AFTER_CHECKPOINT}"] = early
        for row in arm_rows.values():
            assert row is not None
            row["retimed"] = bool(kernels)  # False: eager runs in every arm, nothing to compare
        if not kernels:
            continue
        for _ in range(RETIMES):
            timings = time_against_eager(task, target, kernels)
            clean = all(t.quality == TIMING_CLEAN for t in timings.values())
            if clean:
                break
        timings.update({early: timings[arm] for early, arm in same.items() if arm in timings})
        _apply_retiming(arm_rows, timings, clean)


def _kernel_of(task: Task, store: ExperienceStore, attempt: Any | None) -> Kernel | None:
    """The kernel `attempt` ran (None: eager runs)."""
    if attempt is None:
        return None
    if attempt.source == SOURCE_REFERENCE:
        return task.reference
    return stored_kernel(store, attempt)


def _apply_retiming(
    arm_rows: dict[str, dict[str, Any] | None], timings: dict[str, Timing], clean: bool
) -> None:
    """Put one joint re-timing's figures in the arms' rows (their own stay, as `*_own_run`);
    a round that was not clean changes no figure, and says so."""
    eager = timings["eager"]
    # The reference lowering and eager are the same code in every arm: one ratio of their
    # times (the geomean of the arms' own runs) turns each re-timed figure into one over the
    # reference, so that identical kernels read alike against it too.
    per_eager = geomean(
        [
            r["reference_us"] / r["eager_us"]
            for r in arm_rows.values()
            if r is not None and r.get("reference_us") and r.get("eager_us")
        ]
    )
    for arm, row in arm_rows.items():
        assert row is not None
        row["speedup_vs_eager_own_run"] = row["speedup_vs_eager"]
        row["speedup_vs_reference_own_run"] = row.get("speedup_vs_reference")
        row["retimed_quality"] = TIMING_CLEAN if clean else TIMING_CONTAMINATED
        if clean:
            timing = timings.get(arm)
            row["speedup_vs_eager"] = eager.median_us / timing.median_us if timing else 1.0
            if per_eager is not None:
                row["speedup_vs_reference"] = row["speedup_vs_eager"] * per_eager
            if "speedup_vs_eager_after_checkpoint" in row:
                early = timings.get(f"{arm}{AFTER_CHECKPOINT}")
                row["speedup_vs_eager_after_checkpoint"] = (
                    eager.median_us / early.median_us if early else 1.0
                )


# -- the figures -------------------------------------------------------------------------------


def summarize(
    rows: list[dict[str, Any]],
    config: BenchConfig,
    wall: dict[tuple[str, int], float],
    name: str = "",
    broken: dict[str, str] | None = None,
) -> dict[str, Any]:
    reach = attempts_to_reach(rows, config.budget)
    arms: dict[str, dict[str, Any]] = {}
    for arm in config.arms:
        per_seed = {m: [] for m in METRICS}  # type: dict[str, list[float]]
        for seed in config.seeds:
            mine = [r for r in rows if r["arm"] == arm and r["seed"] == seed]
            figures = _figures(mine, reach, wall.get((arm, seed), 0.0))
            for metric, value in figures.items():
                if value is not None:
                    per_seed[metric].append(value)
        arms[arm] = {
            **{m: statistics.mean(v) if v else None for m, v in per_seed.items()},
            "spread": {m: _spread(v) for m, v in per_seed.items() if v},
        }
    return {
        "suite": name,
        "target": config.target.name,
        "timed": config.target.timed(),  # False: kernels interpreted, no figures
        "agent": config.agent,
        "budget": config.budget,
        "seeds": list(config.seeds),
        "ablate": config.ablate,
        "prior": config.agent_config.get("prior", Options.default("prior")),
        "warm_store": str(config.warm_store) if config.warm_store else None,
        "checkpoint": config.checkpoint,
        "pass_rate_means": PASS_RATE,
        "arms": arms,
        "operators": rows,
        "broken": dict(broken or {}),  # suite entries that could not run, and why
    }


def _figures(
    rows: list[dict[str, Any]], reach: dict[tuple[str, int, str], int], wall_s: float
) -> dict[str, float | None]:
    total = max(len(rows), 1)
    needed = [
        reach[r["arm"], r["seed"], r["key"]]
        for r in rows
        if (r["arm"], r["seed"], r["key"]) in reach
    ]
    figures: dict[str, float | None] = {
        "pass_rate": sum(1 for r in rows if r["verified"]) / total,
        "geomean_speedup_vs_eager": geomean([r["speedup_vs_eager"] for r in rows]),
        "geomean_speedup_vs_reference": geomean([r["speedup_vs_reference"] for r in rows]),
        "prompt_tokens": float(sum(r["tokens_in"] for r in rows)),
        "completion_tokens": float(sum(r["tokens_out"] for r in rows)),
        "tokens": float(sum(r["tokens_in"] + r["tokens_out"] for r in rows)),
        "attempts_to_90": statistics.mean(needed) if needed else None,
        # Agent attempts per operator: fewer than the budget where the search stopped early.
        "attempts": statistics.mean(r["attempts"] for r in rows) if rows else None,
        "wall_s": wall_s,
        "geomean_after_checkpoint": geomean([r["speedup_vs_eager_after_checkpoint"] for r in rows])
        if rows and all("speedup_vs_eager_after_checkpoint" in r for r in rows)
        else None,
    }
    for p in FAST_P:
        figures[f"fast_{p}"] = (
            sum(
                1
                for r in rows
                if r["winner"] in KOPE_KERNELS and (r["speedup_vs_eager"] or 0.0) > p
            )
            / total
        )
    return figures


def attempts_to_reach(rows: list[dict[str, Any]], budget: int) -> dict[tuple[str, int, str], int]:
    """Per (arm, seed, task): attempts until its best-so-far reached REACH of the best kernel
    any arm found for that task in that seed; budget + 1 if never. Tasks no arm found a timed
    kernel for are left out."""
    best: dict[tuple[int, str], float] = {}
    for r in rows:
        top = max((s for s in r["trajectory"] if s), default=None)
        if top is not None:
            k = (r["seed"], r["key"])
            best[k] = max(best.get(k, 0.0), top)
    out: dict[tuple[str, int, str], int] = {}
    for r in rows:
        target = best.get((r["seed"], r["key"]))
        if target is None:
            continue
        out[r["arm"], r["seed"], r["key"]] = next(
            (i + 1 for i, s in enumerate(r["trajectory"]) if s and s >= REACH * target),
            budget + 1,
        )
    return out


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.mean(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


# -- the tables --------------------------------------------------------------------------------


def format_bench(report: dict[str, Any]) -> str:
    """Per-operator speedups (one column per arm, mean over seeds), then the arms' figures."""
    arms = list(report["arms"])
    timed = report.get("timed", True)
    by_op: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
    for r in report["operators"]:
        by_op.setdefault((r["name"], r["label"]), {}).setdefault(r["arm"], []).append(r)
    rows: list[tuple[str, ...]] = [
        ("operator", *(f"{a} vs eager" for a in arms), *(f"{a} attempts" for a in arms))
    ]
    for (name, label), per_arm in by_op.items():
        title = f"{name}: {shorten(label, 48)}"
        speed = [
            _x(geomean([r["speedup_vs_eager"] for r in per_arm.get(a, [])]), _quality(per_arm, a))
            if timed
            else "untimed"
            for a in arms
        ]
        tried = [
            f"{statistics.mean(r['attempts'] for r in per_arm[a]):.1f}" if a in per_arm else "-"
            for a in arms
        ]
        rows.append((title, *speed, *tried))
    lines = table_lines(rows)
    lines.append("")
    header = ("arm", "pass rate", "vs eager", "vs reference", "fast_1.0", "fast_1.2")
    lines += table_lines(
        [
            (*header, "tokens (prompt/completion)", "attempts to 90%", "attempts", "wall s"),
            *(_arm_line(a, report["arms"][a]) for a in arms),
        ]
    )
    seeds = report["seeds"]
    lines += [
        f"{report['agent']} agent on {report['target']}; budget {report['budget']} attempts per "
        f"operator; seeds {seeds}" + ("; mean ± stdev over seeds" if len(seeds) > 1 else ""),
        f"pass rate: {PASS_RATE}; speedups are of the kernel each operator runs (eager = 1.0 "
        "when none beats it; ~: a figure the machine's load disturbed); fast_p: share of all "
        "operators whose running kernel is KOPE's (the agent's or the reference lowering) and "
        "beats eager by more than p",
        f"attempts to 90%: attempts until the best kernel so far is within {REACH:.0%} of the "
        "best any arm found for the operator (budget + 1: never)",
    ]
    checkpoint = report.get("checkpoint")
    if checkpoint and timed:
        after = (report["arms"][a].get("geomean_after_checkpoint") for a in arms)
        lines.append(
            f"after {checkpoint} attempts, each arm's best kernel re-timed with the winners: "
            + ", ".join(f"{a} {_x(v)}" for a, v in zip(arms, after, strict=True) if v)
        )
    for entry, why in (report.get("broken") or {}).items():
        lines.append(f"not run: {entry}: {why}")
    if len(arms) > 1 and timed:
        # Each arm against the last (memory_off, context_passive) or, in the prior ablation,
        # against the static prior: what the ablation asks.
        base = "static" if "static" in arms else arms[-1]
        b = report["arms"][base]["geomean_speedup_vs_eager"]
        for arm in arms:
            a = report["arms"][arm]["geomean_speedup_vs_eager"]
            if arm != base and a and b:
                lines.append(f"{arm} / {base} geomean speedup: {a / b:.2f}x")
        ta, tb = (report["arms"][arm]["prompt_tokens"] for arm in arms[:2])
        if len(arms) == 2 and ta and tb:
            lines.append(f"{arms[1]} / {arms[0]} prompt tokens: {tb / ta:.1f}x")
    return "\n".join(lines)


def _quality(per_arm: dict[str, list[dict[str, Any]]], arm: str) -> str:
    """Clean when every figure of the arm's rows is: a re-timed row by its re-timing."""
    for row in per_arm.get(arm, []):
        quality = row.get("retimed_quality") or row.get("timing_quality") or TIMING_CLEAN
        if quality != TIMING_CLEAN:
            return str(quality)
    return TIMING_CLEAN


def _arm_line(arm: str, m: dict[str, Any]) -> tuple[str, ...]:
    def cell(metric: str, fmt: Callable[[float], str]) -> str:
        value = m.get(metric)
        if value is None:
            return "-"
        spread = m["spread"].get(metric, {}).get("stdev", 0.0)
        return fmt(value) + (f" ± {fmt(spread)}" if spread else "")

    def pct(v: float) -> str:
        return f"{v:.0%}"

    def times(v: float) -> str:
        return f"{v:.2f}x"

    prompt, completion = m.get("prompt_tokens") or 0, m.get("completion_tokens") or 0
    return (
        arm,
        cell("pass_rate", pct),
        cell("geomean_speedup_vs_eager", times),
        cell("geomean_speedup_vs_reference", times),
        cell("fast_1.0", pct),
        cell("fast_1.2", pct),
        f"{prompt + completion:.0f} ({prompt:.0f}/{completion:.0f})",
        cell("attempts_to_90", lambda v: f"{v:.2f}"),
        cell("attempts", lambda v: f"{v:.2f}"),
        cell("wall_s", lambda v: f"{v:.0f}"),
    )


def write_json(data: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def scratch_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
