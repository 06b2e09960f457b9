"""The heuristic agent's learned cost model: how fast a configuration will run on an operator,
fitted on the timed attempts of similar operators and of this one.

A training row is one timed attempt: features of its operator and of its configuration -> the
log of its speedup over eager, less the mean of its operator's attempts (`relative`). Of the
operator: the loop trip counts of the op its schedule tiles (right-aligned, log2), its work
(their product), the payload's linalg op count, and its input and output sizes. Of the
configuration: every decision as log2 of its value (list-valued ones element by element, flags
as 0/1), the work per thread, and how each tile fits the loop it
tiles — tiles per extent and the share a padded last tile wastes, which no tree could derive
from the logs alone. A row weighs the square of its operator's similarity, as the decision
values of `kope.agents.search.learn` do, and at least `CROSS_OP_WEIGHT` where it was measured
on this target: ACMI's similarity puts another operator of the same kernel family (a softmax
beside a layer norm, both rows kernels) too far away to count, but its features say what it
shares with this one, and the held-out `trust` says whether that transfers. This operator's
own attempts weigh 1. The rows come from the store's measured records of the nearest
operators (`kope.tuner.experience.measured_evidence`), not only from what ACMI packs into a context.

The regressor is scikit-learn's `GradientBoostingRegressor` (50 trees of depth 3 at a
learning rate of 0.2, a fixed random_state: deterministic). Leave-one-operator-out on 565
timed attempts of 90 operators from earlier stores, its first pick reached 0.81-0.87 of the
held-out operator's best (a random pick: 0.75), as 100 trees at 0.1 did in half the fitting
time, and as well as a random forest or extra trees, better on shapes unlike any it was
trained on; histogram boosting's default leaf size (20) learned nothing from that little data.
Below `MIN_ROWS` rows or `MIN_EVIDENCE` of their weight nothing is fitted: the agent then
ranks by its static prior, as before it learned. Above it, the model's share of the score
scales with its `trust`: how well it orders the attempts of operators held out of its fitting.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from kope.agents.base import Experience, Feedback, TaskView
from kope.passes.analysis import PayloadInfo
from kope.spaces.schedules import Config, principal_op

MIN_ROWS = 4  # timed attempts before a model fits
MIN_EVIDENCE = 1.0  # ... of summed weight: four of an operator half alike, twenty unlike ones
CROSS_OP_WEIGHT = 0.05  # the least weight of an attempt of the kernel family on this target
# The weight of a roofline estimate (`Experience.estimate_us`) beside a timing's: a model of the
# device, trained on where no device has timed anything, and never beside a timing of its own
# operator (an operator's rows are all timings or all estimates).
ESTIMATE_WEIGHT = 0.5
HALF_EVIDENCE = 1.0  # summed row weight (an operator's attempt, twenty unlike ones) for half
MAX_BLEND = 1.0  # the model's share of the score with plentiful evidence it is shown right on
TRUST_FOLDS = 4  # held-out groups of operators that measure how far the model ranks right
# Pairs of one operator's attempts that the trust counts: those whose speedups differ by more
# than 10%. The same kernel measured twice moved by 5.6% (median; p90 14.5%) on this project's
# stores: pairs closer than that are ordered by the noise, and counting them measured the
# noise, not the model (a warm store's trust read 0.12-0.20, where the pairs 10% apart gave
# 0.22-0.47).
TRUST_PAIR_GAP = math.log(1.10)
RANGE_SLOTS = 7  # loop trip counts kept (a convolution has 7 loops), right-aligned
# Which decision tiles which loop, per schedule family: (decision, list index or None, loop
# index into the tiled op's loop ranges; negative counts from the innermost).
TILES: dict[str, tuple[tuple[str, int | None, int], ...]] = {
    "contraction": (
        ("register", 0, -3),
        ("register", 1, -2),
        ("register", 2, -1),
        ("cache", 0, -3),
        ("cache", 1, -2),
        ("cache", 2, -1),
    ),
    "rows": (("vector", None, -1), ("rows", None, -2)),
    "conv": (("channels", None, 1), ("columns", None, 3), ("inputs", None, 4)),
    "depthwise": (("channels", None, 3), ("columns", None, 2)),
}


@dataclass(frozen=True)
class Workload:
    """What a configuration's speed depends on, of the operator."""

    loops: tuple[int, ...]  # trip counts of the op a schedule tiles (else the output's shape)
    linalg_ops: int
    inputs: int  # elements read
    outputs: int  # elements written

    @property
    def work(self) -> int:
        return math.prod(max(r, 1) for r in self.loops)


def _elements(shapes: Iterable[Sequence[int]]) -> int:
    return sum(math.prod(shape) for shape in shapes)


def task_workload(task: TaskView, info: PayloadInfo | None) -> Workload:
    """The workload of the operator an agent is asked about (`info`: its payload's analysis)."""
    op = principal_op(info) if info is not None else None
    outputs = [spec.shape for spec in task.outputs]
    return Workload(
        tuple(op.ranges) if op else tuple(outputs[0] if outputs else ()),
        len(info.ops) if info is not None else 0,
        _elements(spec.shape for spec in task.inputs),
        _elements(outputs),
    )


def experience_workload(item: Experience) -> Workload:
    """The workload of a retrieved attempt's operator (its output shape where its loops are
    unknown)."""
    loops = item.loop_ranges or (item.outputs[0] if item.outputs else ())
    return Workload(tuple(loops), item.linalg_ops, _elements(item.shapes), _elements(item.outputs))


@dataclass(frozen=True)
class Row:
    """One timed attempt as training data."""

    workload: Workload
    config: Config
    speedup: float  # over eager
    weight: float


def training_rows(
    experience: Iterable[Experience], history: Iterable[Feedback], here: Workload, family: str
) -> list[Row]:
    """The timed attempts of `family`'s configurations: retrieved ones weighted by their
    operator's similarity squared, this session's own (the operator itself) by 1. Where no
    device timed an operator's attempts, their roofline estimates stand in at
    `ESTIMATE_WEIGHT` (as 1 / estimate: `relative` keeps only differences within an operator)."""
    rows: list[Row] = []
    estimated: list[Row] = []
    own: set[str] = set()
    for feedback in history:
        config = feedback.config
        if feedback.verdict == "verified" and config and config.get("family") == family:
            if feedback.speedup_vs_eager:
                rows.append(Row(here, config, feedback.speedup_vs_eager, 1.0))
            elif feedback.estimate_us:
                estimated.append(Row(here, config, 1.0 / feedback.estimate_us, ESTIMATE_WEIGHT))
        own.add(feedback.attempt_id)
    for item in experience:
        config = item.config
        if item.attempt_id in own or item.verdict != "verified":
            continue
        if not config or config.get("family") != family:
            continue
        weight = max(0.0, min(1.0, item.similarity)) ** 2
        if item.same_target:
            weight = max(weight, CROSS_OP_WEIGHT)
        if weight <= 1e-3:
            continue
        if item.speedup_vs_eager:
            rows.append(Row(experience_workload(item), config, item.speedup_vs_eager, weight))
        elif item.estimate_us:
            weight *= ESTIMATE_WEIGHT
            estimated.append(Row(experience_workload(item), config, 1.0 / item.estimate_us, weight))
    timed = {row.workload for row in rows}
    return rows + [row for row in estimated if row.workload not in timed]


def _log2(value: float) -> float:
    return math.log2(value) if value > 0 else 0.0


def _schema(configs: Iterable[Config]) -> tuple[tuple[str, int], ...]:
    """Every decision of these configurations with its length (0: a scalar)."""
    found: dict[str, int] = {}
    for config in configs:
        for key, value in config.items():
            if key != "family":
                size = len(value) if isinstance(value, list) else 0
                found[key] = max(found.get(key, 0), size)
    return tuple(sorted(found.items()))


def _decision(value: object) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return _log2(float(value))
    return 0.0


def _tile(config: Config, key: str, index: int | None) -> int:
    value = config.get(key)
    if isinstance(value, list):
        value = value[index] if index is not None and index < len(value) else None
    return int(value) if isinstance(value, int | float) and value > 0 else 0


def features(
    workload: Workload, config: Config, schema: tuple[tuple[str, int], ...]
) -> list[float]:
    """The feature vector of one configuration on one operator (see the module docstring)."""
    loops = [_log2(r) for r in workload.loops][-RANGE_SLOTS:]
    row = [0.0] * (RANGE_SLOTS - len(loops)) + loops
    work = _log2(workload.work)
    row += [work, float(workload.linalg_ops), _log2(workload.inputs), _log2(workload.outputs)]
    for key, size in schema:
        value = config.get(key)
        if size:
            items = value if isinstance(value, list) else []
            row += [_decision(items[i]) if i < len(items) else 0.0 for i in range(size)]
        else:
            row.append(_decision(value))
    row.append(work - _log2(float(config.get("threads", 1))))
    for key, index, loop in TILES.get(str(config.get("family")), ()):
        tile = _tile(config, key, index)
        inside = -len(workload.loops) <= loop < len(workload.loops)
        extent = workload.loops[loop] if inside else 0
        if tile and extent:
            row += [math.log2(extent / tile), math.ceil(extent / tile) * tile / extent - 1.0]
        else:
            row += [0.0, 0.0]
    return row


def relative(rows: list[Row]) -> tuple[list[Row], list[float]]:
    """The rows of operators with at least two timed attempts, and each one's log speedup
    less its operator's weighted mean: what sets one configuration apart from another on the
    same operator, which is what a search ranks. Log speedups over eager vary far more from
    operator to operator (0.06x to 26x on one suite) than from configuration to configuration,
    and a model of them spends its trees on which operator it is (as MetaSchedule normalizes
    each workload's throughputs)."""
    groups: dict[Workload, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.workload, []).append(row)
    kept: list[Row] = []
    targets: list[float] = []
    for members in groups.values():
        if len(members) < 2:
            continue
        logs = [math.log(max(r.speedup, 1e-3)) for r in members]
        total = sum(r.weight for r in members)
        mean = sum(r.weight * v for r, v in zip(members, logs, strict=True)) / total
        kept += members
        targets += [v - mean for v in logs]
    return kept, targets


class CostModel:
    """Predicted log speedup of configurations on an operator, relative to the mean of its
    configurations (`relative`): comparable between configurations of one operator."""

    def __init__(
        self, rows: list[Row], own: Workload | None = None, checked: list[Row] | None = None
    ):
        """`own`: the operator being searched; `checked`: the rows its trust is measured on
        (`rows` where None; see `_held_out_concordance`)."""
        rows, targets = relative(rows)
        self.schema = _schema(row.config for row in rows)
        self.evidence = sum(row.weight for row in rows)
        x = np.array([features(r.workload, r.config, self.schema) for r in rows])
        y = np.array(targets)
        self.regressor = _regressor()
        self.regressor.fit(x, y, sample_weight=np.array([r.weight for r in rows]))
        if checked is not None:
            rows, targets = relative(checked)
            x = np.array([features(r.workload, r.config, self.schema) for r in rows])
            y = np.array(targets)
        self.trust = _held_out_concordance(x, y, rows, own) if rows else 0.0

    @property
    def blend(self) -> float:
        """The model's share of a configuration's score: it grows with the evidence and with
        how well the model ranked the attempts of operators it was not fitted on. Shown right
        on plenty, it decides alone, and the prior only breaks its ties (`search.Scorer`)."""
        return MAX_BLEND * self.trust * self.evidence / (self.evidence + HALF_EVIDENCE)

    def predict(self, workload: Workload, configs: Sequence[Config]) -> list[float]:
        if not configs:
            return []
        x = np.array([features(workload, c, self.schema) for c in configs])
        return [float(v) for v in self.regressor.predict(x)]


def _regressor() -> Any:
    """The regressor every fit uses (the module's docstring says why these settings)."""
    # Imported when a model is first fitted: scikit-learn takes ~2 s to import, and a compile
    # that optimizes nothing never fits one.
    from sklearn.ensemble import GradientBoostingRegressor

    return GradientBoostingRegressor(
        n_estimators=50, learning_rate=0.2, max_depth=3, random_state=0
    )


def _held_out_concordance(
    x: np.ndarray, y: np.ndarray, rows: list[Row], own: Workload | None = None
) -> float:
    """How far to trust the model's ranking on an operator it has not seen, in [0, 1]: fitted
    without some operators' attempts (at most `TRUST_FOLDS` grouped folds), the share of each
    held-out operator's pairs of attempts (those farther apart than noise, `TRUST_PAIR_GAP`)
    it orders as measured, a coin's 0.5 mapping to 0.
    On the suite, a model fitted on other operators' attempts ranked a new shape's candidates
    worse than the static prior about as often as better; this keeps such a model from
    overruling the prior. Nothing to check it on (no operator with two distinct timings
    beside another operator): 0.

    `own` (the operator being searched, whose attempts grow by one each proposal) is held out
    on its own, against a model of every other operator's attempts; the other operators are
    folded among themselves, without it. The other operators' rows (the store's evidence) do
    not change while one operator is searched, so their folds are fitted once per search
    (`_others`), not at every attempt: a warm store's search had spent more time refitting
    them than its workers spent starting."""
    groups = [row.workload for row in rows]
    weights = np.array([row.weight for row in rows])
    mine = np.array([group == own for group in groups])
    others = _others(x[~mine], y[~mine], weights[~mine], [g for g in groups if g != own])
    agree, pairs = others.agree, others.pairs
    if own is not None and mine.any() and not mine.all():
        index = np.flatnonzero(mine)
        more = _ordered(y[index].tolist(), others.model.predict(x[index]).tolist())
        agree, pairs = agree + more[0], pairs + more[1]
    return max(0.0, 2.0 * agree / pairs - 1.0) if pairs else 0.0


def _ordered(measured: list[float], predicted: list[float]) -> tuple[int, int]:
    """Of one operator's pairs of attempts farther apart than noise, how many the predictions
    order as measured, and how many there are."""
    agree = pairs = 0
    for (a, pa), (b, pb) in itertools.combinations(zip(measured, predicted, strict=True), 2):
        if abs(a - b) > TRUST_PAIR_GAP:
            pairs += 1
            agree += (pa - pb) * (a - b) > 0
    return agree, pairs


@dataclass
class _Folds:
    agree: int  # held-out pairs of attempts ordered as measured
    pairs: int
    x: np.ndarray
    y: np.ndarray
    weights: np.ndarray

    @cached_property
    def model(self) -> Any:
        """Fitted on every row: what an operator outside them is checked against."""
        model = _regressor()
        model.fit(self.x, self.y, sample_weight=self.weights)
        return model


_FOLDS_CACHE: dict[str, _Folds] = {}
_FOLDS_KEPT = 8  # searches whose folds are kept (a precompile searches one operator at a time)


def _others(x: np.ndarray, y: np.ndarray, weights: np.ndarray, groups: list[Workload]) -> _Folds:
    """The grouped folds of these rows, and a model of them all; memoized on the rows."""
    # In one order whatever order the records came in, and rounded (an operator's mean, which
    # its targets are relative to, sums in that order), so that the same rows are the same folds.
    order = sorted(range(len(groups)), key=lambda i: (repr(groups[i]), x[i].tolist(), y[i]))
    x, y, weights, groups = x[order], y[order], weights[order], [groups[i] for i in order]
    digest = hashlib.sha1()
    for part in (x, y, weights):
        digest.update(np.round(np.asarray(part, dtype=np.float64), 9).tobytes())
    digest.update(repr(groups).encode())
    key = digest.hexdigest()
    if key in _FOLDS_CACHE:
        return _FOLDS_CACHE[key]
    members: dict[Workload, list[int]] = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    checkable = [g for g, index in members.items() if len({round(y[i], 6) for i in index}) > 1]
    agree = pairs = 0
    if len(members) >= 2:
        for fold in (checkable[i::TRUST_FOLDS] for i in range(min(TRUST_FOLDS, len(checkable)))):
            held = np.array([group in fold for group in groups])
            model = _regressor()
            model.fit(x[~held], y[~held], sample_weight=weights[~held])
            predicted = dict(
                zip(np.flatnonzero(held).tolist(), model.predict(x[held]).tolist(), strict=True)
            )
            for group in fold:
                rows_of = members[group]
                more = _ordered([float(y[i]) for i in rows_of], [predicted[i] for i in rows_of])
                agree, pairs = agree + more[0], pairs + more[1]
    found = _Folds(agree, pairs, x, y, weights)
    if len(_FOLDS_CACHE) >= _FOLDS_KEPT:
        _FOLDS_CACHE.pop(next(iter(_FOLDS_CACHE)))
    _FOLDS_CACHE[key] = found
    return found


def fit(
    rows: list[Row], own: Workload | None = None, checked: list[Row] | None = None
) -> CostModel | None:
    """A model of these rows, or None while too few of them compare configurations on one
    operator, or they weigh too little. `own` and `checked`: what its trust is measured on
    (`CostModel`)."""
    compared, _ = relative(rows)
    enough = len(compared) >= MIN_ROWS and sum(row.weight for row in compared) >= MIN_EVIDENCE
    return CostModel(compared, own, checked) if enough else None
