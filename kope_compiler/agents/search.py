"""The search that learns: a strategy over any kernel family's space that knows no target.

As TVM's MetaSchedule splits them, four parts meet here: a space (`Space`: a space generator's
configurations of one kernel family on one operator, each with the hand-written prior's score,
and a test of which configurations off its grid it can render), this search strategy, a cost
model (`kope.agents.cost_model`), and the experience store as the database of measured records
(`kope.tuner.experience.measured_evidence`: every attempt of the nearest operators, weighted by the
similarity ACMI's retrieval computes). The CPU schedules and the Triton kernels of the
heuristic agent are spaces; this module never asks which target or family it searches.

One proposal:
1. Candidates: the space's untried points, the configurations proven on similar operators
   (the elites of the evidence, on or off the grid), and their mutations: each elite with one
   decision changed to a value the space uses for it, kept where the space can render it
   (evolution, as MetaSchedule and Ansor propose). An off-grid candidate ranks as a widened
   point does: below the grid while nothing is learned.
2. Scores (`Scorer`): with a cost model fitted on the evidence, its predicted speedup decides
   and the prior only breaks ties, in proportion to how far the model has been shown right
   (`CostModel.blend`); without one, the prior and what similar operators taught of each
   decision value. Failed decision values lose, a configuration that failed on a very similar
   operator is not tried, and the best one proven on a very similar operator earns a bonus by
   its gain (it seeds the first attempt where the evidence outweighs the rest).
3. The climb: after the first verified kernel, the next attempt changes one decision of the
   best so far (the highest-scoring such neighbour); every third explores the best untried,
   of a sketch not yet tried where one is left (`Space.structural`: the decisions that change
   a kernel's structure, such as packing an operand or the algorithm, as MetaSchedule's
   sketches; a model fitted on similar operators extrapolates least reliably across them:
   a warm store whose products ran best packed kept a 48-row linear from ever trying the
   unpacked kernels that beat it, 1.18x eager against 1.00x).
4. Stopping: the space exhausted; hopeless after a few verified attempts (eager is best);
   converged; or, once a trusted cost model has seen at least `EARLY_STOP_AFTER` verified
   kernels of this operator, when it predicts that no remaining candidate beats the best one
   by more than noise (`stop_reason` says which).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from kope.agents import cost_model
from kope.agents.base import Experience, Feedback, ProposalRequest
from kope.memory.standing import WIN_MARGIN, first_of_the_fastest
from kope.spaces.cpu import BIG_WORK
from kope.spaces.schedules import Config, config_key

# Prior points a widened or off-grid point gives up while nothing is learned: more than the
# prior's whole span plus the seeded jitter, so that with no experience the core grid is
# searched first, in its own order. Under a fitted cost model it gives up only UNPROVEN, more
# than the jitter: where the model cannot tell a widened point from its core twin (a decision
# no similar operator varied), the core point goes first, except on an exploring attempt.
WIDENED = 5.0
UNPROVEN = 0.5
ELITES = 4  # configurations of the evidence mutated per proposal (the best by weighted gain)
# The early stop: verified kernels of this operator the model must have seen, the trust it
# must have earned, and the gain over the best that still counts as noise.
EARLY_STOP_AFTER = 3
EARLY_STOP_TRUST = 0.6
EARLY_STOP_NOISE = math.log(1.0 + WIN_MARGIN)


@dataclass
class Space:
    """A kernel family's configurations on one operator, as its space generator gives them."""

    points: list[tuple[Config, float]]  # each with the hand-written prior's score
    widened: set[str] = field(default_factory=set)  # keys of the points beyond the core grid
    # Whether a configuration off the grid (a proven one, a mutation) renders here.
    renders: Callable[[Config], bool] | None = None
    # The decisions that change the kernel's structure, not a number on it: a configuration's
    # values of them are its sketch, and exploring attempts go to sketches not yet tried.
    structural: tuple[str, ...] = ()

    @cached_property
    def keys(self) -> set[str]:
        return {config_key(config) for config, _ in self.points}

    @cached_property
    def _schemas(self) -> set[frozenset[str]]:
        return {frozenset(config) for config, _ in self.points}

    def can_render(self, config: Config) -> bool:
        # The decisions of one of the space's points, no more, no fewer: a record of another
        # version's schema, or a partial one, is not this space's to render.
        if frozenset(config) not in self._schemas:
            return False
        if self.renders is None:
            return config_key(config) in self.keys
        return self.renders(config)

    def sketch(self, config: Config) -> tuple[str, ...]:
        return tuple(json.dumps(config.get(name), sort_keys=True) for name in self.structural)

    @property
    def family(self) -> Any:
        return self.points[0][0].get("family") if self.points else None

    def values(self) -> dict[str, list[Any]]:
        """Each decision's values over the space's points, in first-seen order."""
        found: dict[str, dict[str, Any]] = {}
        for config, _ in self.points:
            for key, value in config.items():
                if key != "family":
                    found.setdefault(key, {}).setdefault(config_key(value), value)
        return {key: list(values.values()) for key, values in found.items()}


@dataclass(frozen=True)
class Choice:
    config: Config
    parent: str | None  # the attempt it refines
    why: str
    transferred_from: str | None  # an attempt of another operator it reuses as is


def decisions(config: Config) -> list[tuple[str, str]]:
    """The decision values of a configuration, e.g. ("threads", "2")."""
    return [
        (k, config_key(v) if isinstance(v, list) else str(v))
        for k, v in sorted(config.items())
        if k != "family"
    ]


@dataclass
class MemoryAdvice:
    value: dict[tuple[str, str], float]  # decision value -> score learned from timed attempts
    penalty: dict[tuple[str, str], float]  # decision value -> score lost to failed attempts
    banned: set[str]  # configurations that failed on a very similar operator
    bonus: dict[str, tuple[float, str]]  # config key -> (score bonus, attempt it was proven by)


# A prior point's worth beside a trusted model's prediction: the static prior's whole span
# (about 4 points) weighs as much as a predicted 7% speedup, so it settles only near-ties.
PRIOR_TIE = 0.05
MIN_TRANSFER = 0.85  # similarity below which a configuration is not reused as is
VALUE_SCALE = 3.0  # weight of learned log speedups against the prior's units


def learn(experience: Iterable[Experience], family: str, big: bool | None = None) -> MemoryAdvice:
    """What experience says about each decision value and each configuration.

    A decision value's learned worth is how much better than average (in log speedup over
    eager) the attempts that used it did, weighted by the square of their operator's
    similarity, and scaled by the confidence that weight gives (evidence from unlike
    operators moves nothing). The best configuration proven on an operator at least
    MIN_TRANSFER similar earns a bonus in proportion to similarity and gain; one that failed on an
    operator at least 0.8 similar is banned; failures count against their decision values.

    Whether threads pay depends on the work (`BIG_WORK`), so where this operator's work
    (`big`) is on the other side of it from an attempt's operator, that attempt says nothing
    of threads and its configuration is not reused as is: one proven on a 128x256 GELU ran
    on one thread, and reused on a 257x513 one it ran at 0.6x the prior's two-thread pick.
    """
    verified: list[tuple[float, float, list[tuple[str, str]]]] = []
    value: dict[tuple[str, str], float] = {}
    penalty: dict[tuple[str, str], float] = {}
    banned: set[str] = set()
    # Only the best proven configuration seeds: a bonus on every configuration proven there
    # would hold the climb among them (a thin store proved only one-thread kernels of a big
    # GELU, and the bonus kept two threads, 1.9x faster, from ever being tried).
    bonus: dict[str, tuple[float, str]] = {}  # at most one entry
    for item in experience:
        config = item.config
        if not config or config.get("family") != family:
            continue
        weight = max(0.0, min(1.0, item.similarity)) ** 2
        if item.verdict == "verified" and not item.speedup_vs_eager:
            continue  # verified, never timed (interpreted): says nothing of speed, nor failure
        if item.verdict == "verified" and item.speedup_vs_eager:
            gain = math.log(max(item.speedup_vs_eager, 1e-3))
            crossing = big is not None and item.work and (item.work >= BIG_WORK) != big
            used = [d for d in decisions(config) if not (crossing and d[0] == "threads")]
            verified.append((weight, gain, used))
            if item.similarity >= MIN_TRANSFER and gain > 0 and not crossing:
                score = VALUE_SCALE * item.similarity * gain
                if score > max((b for b, _ in bonus.values()), default=0.0):
                    bonus = {config_key(config): (score, item.attempt_id)}
        else:
            for decision in decisions(config):
                penalty[decision] = penalty.get(decision, 0.0) - 0.5 * weight
            if item.similarity >= 0.8:
                banned.add(config_key(config))
    total = sum(w for w, _, _ in verified)
    if total > 0:
        baseline = sum(w * g for w, g, _ in verified) / total
        sums: dict[tuple[str, str], list[float]] = {}
        for weight, gain, used in verified:
            for decision in used:
                entry = sums.setdefault(decision, [0.0, 0.0])
                entry[0] += weight * (gain - baseline)
                entry[1] += weight
        for decision, (weighted, weights) in sums.items():
            confidence = weights / (weights + 1.0)
            value[decision] = VALUE_SCALE * confidence * weighted / weights
    return MemoryAdvice(value, penalty, banned, bonus)


class Scorer:
    """A candidate's score: its prior and what memory says of it.

    With a fitted cost model, `(1 - b) * prior + b * (VALUE_SCALE * predicted log speedup +
    PRIOR_TIE * prior)` (b: the model's blend, growing with the evidence and with the trust it
    earned on operators held out of its fitting: at 1 the prior only breaks the model's ties),
    a widened point's less UNPROVEN unless `exploring`; without one, the prior (a widened
    point's less WIDENED) plus the learned decision values. Failed decision values and the
    proven-transfer bonus apply to both."""

    def __init__(
        self,
        advice: MemoryAdvice,
        model: cost_model.CostModel | None,
        here: cost_model.Workload,
        prior_weight: float,
        widened: set[str],
        exploring: bool = False,
    ):
        self.advice = advice
        self.model = model
        self.here = here
        self.prior_weight = prior_weight
        self.widened = widened
        self.exploring = exploring

    @property
    def prior_share(self) -> float:
        """The prior's weight in the score: all of it without a model, PRIOR_TIE beside a
        model that has been shown right on plenty of evidence."""
        blend = self.model.blend if self.model is not None else 0.0
        return 1.0 - blend + blend * PRIOR_TIE

    def scores(self, candidates: Sequence[tuple[Config, float]]) -> list[float]:
        advice = self.advice
        learned: list[float]
        if self.model is None:
            blend = 0.0
            learned = [
                sum(advice.value.get(d, 0.0) for d in decisions(config))
                - (WIDENED if config_key(config) in self.widened else 0.0)
                for config, _ in candidates
            ]
        else:
            blend = self.model.blend
            predicted = self.model.predict(self.here, [config for config, _ in candidates])
            handicap = 0.0 if self.exploring else UNPROVEN
            learned = [
                blend * VALUE_SCALE * p - (handicap if config_key(config) in self.widened else 0.0)
                for p, (config, _) in zip(predicted, candidates, strict=True)
            ]
        scores = []
        for (config, prior), gained in zip(candidates, learned, strict=True):
            score = self.prior_share * self.prior_weight * prior + gained
            score += sum(advice.penalty.get(d, 0.0) for d in decisions(config))
            scores.append(score + advice.bonus.get(config_key(config), (0.0, ""))[0])
        return scores


def _exploring(history: list[Feedback]) -> bool:
    """Whether the next attempt explores (every third) instead of refining the best."""
    return len(history) % 3 == 2


def _best(history: list[Feedback]) -> Feedback | None:
    """The attempt the climb refines: the first of those within noise (WIN_MARGIN) of the
    fastest, so that a tie, which the machine decides, does not send two runs of the same seed
    down different paths."""
    verified = [f for f in history if f.verdict == "verified" and f.speedup_vs_eager]
    return first_of_the_fastest(verified, lambda f: f.speedup_vs_eager or 0.0)


def _distance(a: Config, b: Config) -> int:
    keys = set(a) | set(b)
    return sum(1 for k in keys if a.get(k) != b.get(k))


def _best_speedup(history: list[Feedback]) -> float:
    return max((f.speedup_vs_eager or 0.0 for f in history if f.verdict == "verified"), default=0.0)


def _should_stop(history: list[Feedback]) -> bool:
    verified = [f for f in history if f.verdict == "verified" and f.speedup_vs_eager]
    best_now = _best_speedup(history)
    if len(verified) >= 4 and best_now < 0.3 and best_now <= _best_speedup(history[:-3]) * 1.05:
        return True
    if len(verified) >= 6 and best_now < 0.5:
        return True
    return len(history) >= 8 and best_now <= _best_speedup(history[:-5]) * 1.02


class Search:
    """The strategy of the module docstring, for one agent (seeded: deterministic)."""

    def __init__(self, seed: int = 0, jitter: float = 0.3, prior_weight: float = 1.0):
        self.seed = seed
        self.jitter = jitter  # seeded noise on the prior: different seeds explore differently
        self.prior_weight = prior_weight  # 0: a flat prior (experience alone)
        self.stop_reason = ""

    def next(
        self,
        space: Space,
        request: ProposalRequest,
        here: cost_model.Workload,
        big: bool | None = None,
    ) -> Choice | None:
        """The next configuration to try on the operator of `request`; None to stop (and
        `stop_reason` says why, where it is not the plain end of the space)."""
        self.stop_reason = ""
        history = request.history
        if not space.points or _should_stop(history):
            return None
        family = space.family
        records = _records(request)
        advice = learn(records, family, big)
        rows = cost_model.training_rows(records, history, here, family)
        # Trust is measured on the store's evidence, the same rows through one search (ACMI's
        # context adds a few more, different at each attempt), and this operator's attempts.
        checked = (
            cost_model.training_rows(request.evidence, history, here, family)
            if request.evidence
            else None
        )
        model = cost_model.fit(rows, here, checked)
        tried = {config_key(f.config) for f in history if f.config}
        candidates = [
            (config, prior)
            for config, prior in space.points
            if config_key(config) not in tried and config_key(config) not in advice.banned
        ]
        # Off the grid: a proven configuration has no prior (its bonus speaks for it); a
        # mutation ranks as a widened point, below the grid while nothing is learned.
        excluded = tried | advice.banned | space.keys
        proven = [
            config
            for config in map(json.loads, advice.bonus)
            if config_key(config) not in excluded and space.can_render(config)
        ]
        excluded |= {config_key(c) for c in proven}
        mutants = evolve(space, records, history, excluded)
        floor = min((prior for _, prior in space.points), default=0.0)
        candidates += [(c, 0.0) for c in proven] + [(c, floor) for c in mutants]
        if not candidates:
            return None
        if model is not None and _nothing_better_expected(model, here, history, candidates):
            self.stop_reason = (
                f"the cost model (trust {model.trust:.2f}) expects no remaining candidate to "
                f"beat the best by more than {WIN_MARGIN:.0%}"
            )
            return None
        handicapped = space.widened | {config_key(c) for c in mutants}
        exploring = _exploring(history)
        scorer = Scorer(advice, model, here, self.prior_weight, handicapped, exploring)
        rng = random.Random(f"{self.seed}:{request.task.key}")
        scores = scorer.scores(candidates)
        jitter = self.jitter * scorer.prior_share  # part of the prior: it yields to the model
        scored = [
            (score + rng.uniform(0.0, jitter), config)
            for score, (config, _) in zip(scores, candidates, strict=True)
        ]
        if exploring:
            scored = _untried_sketches(space, scored, history)
        config, parent = choose(scored, history)
        if config is None:
            return None
        transferred = advice.bonus.get(config_key(config), (0.0, None))[1]
        why = _why(config, parent, transferred, request, records, model is not None)
        return Choice(config, parent, why, transferred)


def _untried_sketches(
    space: Space, scored: list[tuple[float, Config]], history: Sequence[Feedback]
) -> list[tuple[float, Config]]:
    """The candidates of sketches no attempt of this operator has tried, where there are."""
    tried = {space.sketch(f.config) for f in history if f.config}
    fresh = [(score, config) for score, config in scored if space.sketch(config) not in tried]
    return fresh or scored


def _records(request: ProposalRequest) -> list[Experience]:
    """What ACMI chose and the store's measured evidence, each attempt once."""
    seen: set[str] = set()
    out: list[Experience] = []
    for item in [*request.experience, *request.evidence]:
        if item.attempt_id not in seen:
            seen.add(item.attempt_id)
            out.append(item)
    return out


def evolve(
    space: Space, records: Sequence[Experience], history: Sequence[Feedback], excluded: set[str]
) -> list[Config]:
    """Configurations worth scoring beyond `excluded` (the grid, what was tried or banned):
    the elites (the best verified configurations of this operator and of similar ones, by
    similarity-weighted gain) and each elite with one decision changed to another value the
    space uses for it, where the space renders them."""
    family = space.family
    weighted: dict[str, tuple[float, Config]] = {}
    for item in records:
        if item.config and item.config.get("family") == family and item.speedup_vs_eager:
            gain = math.log(max(item.speedup_vs_eager, 1e-3)) * max(item.similarity, 0.0) ** 2
            key = config_key(item.config)
            if key not in weighted or gain > weighted[key][0]:
                weighted[key] = (gain, item.config)
    for f in history:
        if f.config and f.verdict == "verified" and f.speedup_vs_eager:
            weighted[config_key(f.config)] = (math.log(max(f.speedup_vs_eager, 1e-3)), f.config)
    elites = [c for _, c in sorted(weighted.values(), key=lambda v: -v[0])[:ELITES]]
    values = space.values()
    found: dict[str, Config] = {}
    for elite in elites:
        mutants = [elite] + [
            {**elite, key: value}
            for key, options in values.items()
            for value in options
            if key in elite and elite[key] != value
        ]
        for config in mutants:
            key = config_key(config)
            if key in excluded or key in found:
                continue
            if space.can_render(config):
                found[key] = json.loads(key)  # a copy: elites are shared records
    return list(found.values())


def _nothing_better_expected(
    model: cost_model.CostModel,
    here: cost_model.Workload,
    history: Sequence[Feedback],
    candidates: Sequence[tuple[Config, float]],
) -> bool:
    """Whether a trusted model, after enough verified kernels of this operator, predicts
    that no remaining candidate beats the best of them by more than noise."""
    verified = [f for f in history if f.verdict == "verified" and f.speedup_vs_eager and f.config]
    if len(verified) < EARLY_STOP_AFTER or model.trust < EARLY_STOP_TRUST or not candidates:
        return False
    best = _best(list(history))
    if best is None or best.config is None:
        return False
    predicted = model.predict(here, [best.config, *(c for c, _ in candidates)])
    return max(predicted[1:]) - predicted[0] < EARLY_STOP_NOISE


def choose(
    scored: list[tuple[float, Config]], history: Sequence[Feedback]
) -> tuple[Config | None, str | None]:
    """The next configuration, and the attempt it refines (if it changes the best one)."""
    if not scored:
        return None, None
    scored.sort(key=lambda s: -s[0])
    if not history:
        return scored[0][1], None
    best = _best(list(history))
    if best is not None and best.config and not _exploring(list(history)):
        neighbours = [(s, c) for s, c in scored if _distance(c, best.config) == 1]
        if neighbours:
            return neighbours[0][1], best.attempt_id
    failed = [f for f in history if f.verdict != "verified" and f.config]
    if failed and best is None:
        bad = {d for f in failed for d in decisions(f.config or {})}
        clean = [(s, c) for s, c in scored if not (set(decisions(c)) & bad)]
        if clean:
            return clean[0][1], None
    return scored[0][1], None


def _why(
    config: Config,
    parent: str | None,
    transferred: str | None,
    request: ProposalRequest,
    records: Iterable[Experience],
    learned: bool,
) -> str:
    if transferred:
        source = next((e for e in records if e.attempt_id == transferred), None)
        where = source.task_label if source else "a similar operator"
        return f"best schedule of {where}"
    if parent:
        best = next((f for f in request.history if f.attempt_id == parent), None)
        changed: list[str] = []
        if best and best.config:
            # a decision either side takes (a flag the mutation dropped changed too)
            named = dict.fromkeys(k for c in (config, best.config) for k, _ in decisions(c))
            changed = [k for k in named if config.get(k) != best.config.get(k)]
        return f"changes {', '.join(changed) or 'nothing'} of the best so far"
    if request.history:
        return "exploring"
    return "highest score by the cost model" if learned else "highest prior"
