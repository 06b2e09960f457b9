"""The heuristic agent: the embedded default, offline and deterministic under a seed.

It only wires three parts together, as MetaSchedule does: the space of the target's kernel
family (`kope.spaces`: transform-dialect schedules of the operator's linalg payload on MLIR
targets, the CPU; Triton kernels translated from that payload on Triton targets, CUDA and
Ascend, under the rules the target supplies), the search over it, which learns from the
experience store (`kope.agents.search`; with `prior="flat"` it searches with no hand-written
ranking at all), and the cost model that search fits (`kope.agents.cost_model`).
Where nothing is timed (Triton's interpreter, no device) it stops after `UNTIMED_KERNELS`
verified kernels: the device ranks them (`kope export`).
"""

from __future__ import annotations

import logging
from typing import Any

from kope.agents import cost_model
from kope.agents.base import Agent, Feedback, Proposal, ProposalRequest
from kope.agents.search import WIDENED, Choice, Search, Space
from kope.passes.analysis import PayloadInfo, analyze, prepare_payload
from kope.spaces.cpu import BIG_WORK, STRUCTURAL, prepared_space, renders, schedule_space
from kope.spaces.kernels import kernel_source
from kope.spaces.schedules import COLLAPSE, REGROUP, Config, config_key, describe, work
from kope.spaces.triton_kernels import describe_config as describe_triton
from kope.spaces.triton_kernels import render_triton, triton_space, unsupported_reason
from kope.vocabulary.kernels import FORM_MLIR, FORM_TRITON

log = logging.getLogger("kope.agents.heuristic")

# Verified Triton kernels per operator where nothing is timed (under Triton's interpreter):
# more would only verify more variants that no figure ranks.
UNTIMED_KERNELS = 3


def candidate_space(info: PayloadInfo, capabilities: dict[str, Any]) -> list[tuple[Config, float]]:
    """Every configuration worth trying for this payload, with its prior score (a widened
    point's less WIDENED: what the agent ranks by while it has learned nothing). The rows
    points over the payload regrouped or collapsed, which need the payload before
    preparation, the agent adds itself (`prepared_space`)."""
    space, widened = schedule_space(info, capabilities)
    return [
        (config, prior - (WIDENED if config_key(config) in widened else 0.0))
        for config, prior in space
    ]


# -- the agent ---------------------------------------------------------------------------------

# A payload's preparation: the task, polynomial math, f64 narrowed, reshapes regrouped,
# inner loops collapsed.
_Prepared = tuple[str, bool, bool, bool, bool]
# The preparations beyond the plain payload a rows configuration may ask for, each with the
# one it refines (`prepared_space`).
_PREPARATIONS: tuple[tuple[Config, Config], ...] = (
    ({REGROUP: True}, {}),
    ({COLLAPSE: True}, {}),
    ({REGROUP: True, COLLAPSE: True}, {REGROUP: True}),
)


def _prepared_key(request: ProposalRequest, config: Config | None) -> _Prepared:
    return (
        request.task.key,
        bool(config and config.get("approximate_math")),
        bool(config and config.get("narrow_f64")),
        bool(config and config.get(REGROUP)),
        bool(config and config.get(COLLAPSE)),
    )


class HeuristicAgent(Agent):
    """Schedules from a searched grid, ordered by a prior and by experience."""

    name = "heuristic"
    has_prior = True

    def __init__(self, seed: int = 0, jitter: float = 0.3, prior: str = "static", **_: Any):
        from kope.core.options import PRIORS

        if prior not in PRIORS:
            raise ValueError(f"prior={prior!r} is not one of {', '.join(PRIORS)}")
        self.seed = seed
        self.jitter = jitter
        self.prior = prior
        # flat: no hand-written ranking at all (what experience finds on its own)
        self.search = Search(seed, jitter, prior_weight=1.0 if prior == "static" else 0.0)
        self._prepared: dict[_Prepared, str] = {}
        self._analyzed: dict[_Prepared, PayloadInfo] = {}

    def _payload(self, request: ProposalRequest, config: Config | None = None) -> str:
        """The task's payload prepared as `config` asks (polynomial math, f64 narrowed,
        reshapes regrouped, inner loops collapsed)."""
        key = _prepared_key(request, config)
        if key not in self._prepared:
            _, approximate, narrow, regroup, collapse = key
            self._prepared[key] = prepare_payload(
                request.task.payload,
                approximate_math=approximate,
                narrow_f64=narrow,
                refine_reshapes=regroup,
                collapse_dims=collapse,
            )
        return self._prepared[key]

    def _info(self, request: ProposalRequest, config: Config | None = None) -> PayloadInfo:
        """`_payload`'s analysis, kept with it: every proposal for the task reads it again."""
        key = _prepared_key(request, config)
        if key not in self._analyzed:
            self._analyzed[key] = analyze(self._payload(request, config))
        return self._analyzed[key]

    def _prepared_variant(self, request: ProposalRequest, marks: Config, base: Config) -> bool:
        """Whether preparing the payload as `marks` asks changes it from `base`'s, which
        itself differs from the plain payload (or is the plain payload)."""
        if base and not self._prepared_variant(request, base, {}):
            return False
        return self._payload(request, marks) != self._payload(request, base)

    def propose(self, request: ProposalRequest) -> Proposal | None:
        forms = request.task.kernel_forms
        if FORM_MLIR in forms:
            return self._propose_schedule(request)
        if FORM_TRITON in forms:
            return self._propose_triton(request)
        return None  # it writes MLIR schedules and Triton kernels; this target builds neither

    def _propose_schedule(self, request: ProposalRequest) -> Proposal | None:
        info = self._info(request)
        capabilities = request.task.capabilities
        points, widened = schedule_space(info, capabilities)
        variants: set[_Prepared] = set()  # the preparations that change the payload
        if any(config.get("family") == "rows" for config, _ in points):
            for marks, base in _PREPARATIONS:
                if not self._prepared_variant(request, marks, base):
                    continue
                more, more_widened = prepared_space(
                    self._info(request, marks), self._info(request, base), capabilities, marks
                )
                points, widened = [*points, *more], widened | more_widened
                variants.add(_prepared_key(request, marks))

        def fits(config: Config) -> bool:
            if config.get(REGROUP) or config.get(COLLAPSE):
                key = _prepared_key(request, {k: config.get(k) for k in (REGROUP, COLLAPSE)})
                return key in variants and renders(
                    self._info(request, config), capabilities, config
                )
            return renders(info, capabilities, config)

        space = Space(points, widened, fits, STRUCTURAL)
        found = self._search(space, request, info)
        if found is None:
            return None
        source = kernel_source(
            self._payload(request, found.config), self._info(request, found.config), found.config
        )
        return Proposal(
            source=source,
            decision=f"{describe(found.config)} ({found.why})",
            config=found.config,
            parent=found.parent,
            transferred_from=found.transferred_from,
        )

    def _propose_triton(self, request: ProposalRequest) -> Proposal | None:
        task = request.task
        if task.capabilities.get("interpreter") and _verified(request.history) >= UNTIMED_KERNELS:
            return None  # nothing is timed here: a few verified variants are the device's to rank
        if task.rules is None:
            log.info("%s: no Triton kernel: the target supplies no kernel rules", task.label)
            return None
        try:
            space = triton_space(task.payload, task.inputs, task.outputs, task.rules)
        except Exception:  # a generator defect must cost this operator its kernel, not the run
            log.exception("%s: the Triton kernel generator failed; no Triton kernel", task.label)
            return None
        if not space:
            reason = unsupported_reason(task.payload, task.inputs, task.outputs, task.rules)
            log.info("%s: no Triton kernel: %s", task.label, reason or "no configuration fits")
            return None
        try:
            info: PayloadInfo | None = self._info(request)
        except Exception:  # its loops only sharpen the cost model's features
            log.warning("%s: the payload's loops are unknown to the cost model", task.label)
            info = None
        # The Triton generator renders only its own points: no configuration off them.
        found = self._search(Space(space), request, info)
        if found is None:
            return None
        try:
            source = render_triton(
                task.payload, task.inputs, task.outputs, found.config, task.rules
            )
        except Exception:
            log.exception("%s: the Triton kernel generator failed on %s", task.label, found.config)
            return None
        return Proposal(
            source=source,
            decision=f"{describe_triton(found.config)} ({found.why})",
            form=FORM_TRITON,
            config=found.config,
            parent=found.parent,
            transferred_from=found.transferred_from,
        )

    def _search(
        self,
        space: Space,
        request: ProposalRequest,
        info: PayloadInfo | None = None,
    ) -> Choice | None:
        """The next configuration of `space` (`kope.agents.search`); None to stop."""
        here = cost_model.task_workload(request.task, info)
        big = work(info) >= BIG_WORK if info is not None else None
        choice = self.search.next(space, request, here, big)
        self.stop_reason = self.search.stop_reason
        return choice


def _verified(history: list[Feedback]) -> int:
    return sum(1 for f in history if f.verdict == "verified")
