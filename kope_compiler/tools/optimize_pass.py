"""`kope-optimize`: the agent inside the compiler, one outlined operator at a time.

For every function carrying `kope.key` (see `kope-outline-operators`), the pass runs the
optimization loop of `kope.tuner.optimize` on it: experience retrieved from the store, the agent's
proposals built, verified against the function itself (its body is the reference lowering),
timed, and recorded through the loop's events, then the winner confirmed. Each function is
left annotated with the outcome,

    kope.optimized = {attempts = 2 : i64, best_attempt = "attempt-…", speedup = 31.5 : f64,
                      stopped = "budget spent", winner = "agent"}

so that `kope-apply-kernels` in the same pipeline puts the winning kernel in its place.
`speedup` is over the function's reference lowering, the baseline inside a pipeline. Where the
function carries the ATen call it came from (`kope.eager`, written by `kope import`), or
the store holds one for its key (the backend met the same operator), eager is timed too, the
winner is judged against it as on the backend's road, and `speedup_vs_eager` is annotated.
An operator already optimized to `budget` by this agent is not redone; its annotation comes
from the store. An operator that cannot be optimized (a type the target does not take, a
reference lowering that does not build) gets a warning at its function and keeps its body;
the pipeline goes on.

The pass lives with the loop in the driver (`kope`), not in `kope.passes`, which never
imports the driver; it is registered under the passes' entry point group, so `kope-opt` finds
it by name and imports it only when a pipeline names it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from torch_mlir import ir

from kope.agents.base import Agent
from kope.core.options import Options
from kope.core.task import Task
from kope.memory.standing import winner
from kope.memory.store import ExperienceStore
from kope.passes.base import ModulePass, PassError, check_target
from kope.passes.experience import STORE_HELP, function_key, outlined_functions, symbol_name
from kope.passes.keys import (
    EAGER_ATTR,
    KERNEL_ATTR,
    LABEL_ATTR,
    canonical_function,
    task_key,
    workload_digest,
)
from kope.targets.base import Target
from kope.vocabulary.home import kope_home
from kope.vocabulary.specs import (
    DTYPES,
    OpCall,
    Program,
    TaskSpec,
    TensorSpec,
    eager_from_json,
)

log = logging.getLogger("kope.passes")

OPTIMIZED_ATTR = "kope.optimized"
# MLIR element types back to torch dtype names (signless integers read as signed).
_DTYPE_OF = {short: name for name, short in DTYPES.items() if name != "uint8"}


class _Skip(Exception):
    """Why one operator is not optimized; a warning at its function."""


@dataclass
class OptimizeOperators(ModulePass):
    """Run the agent's optimization loop on each keyed operator and annotate the outcome."""

    name = "kope-optimize"
    summary = "Optimize each outlined operator with the agent: propose, verify, time, record"

    target: str = field(
        default=Options.default("target"), metadata={"help": "the target to optimize for"}
    )
    agent: str = field(
        default=Options.default("agent"), metadata={"help": "heuristic (offline) or llm"}
    )
    budget: int = field(
        default=Options.default("budget"), metadata={"help": "attempts per operator"}
    )
    store: str = field(default="", metadata={"help": STORE_HELP + "; created if missing"})
    seed: int = field(default=0, metadata={"help": "the agent's seed"})
    timeout_s: float = field(
        default=Options.default("timeout_s"),
        metadata={"help": "limit in seconds for building, verifying and timing one candidate"},
    )

    def __post_init__(self) -> None:
        check_target(self.name, self.target)
        from kope.agents import agent_names

        if self.agent not in agent_names():
            raise ValueError(
                f"pass '{self.name}' option agent={self.agent!r} is not a known agent; "
                f"known agents: {', '.join(agent_names())}"
            )
        if self.budget < 1:
            raise ValueError(f"pass '{self.name}' option budget={self.budget} must be >= 1")

    def run(self, module: ir.Operation) -> None:
        from kope.agents import make_agent
        from kope.frontend.compiler import store_at, target_for

        funcs = [f for f in outlined_functions(self, module) if KERNEL_ATTR not in f.attributes]
        if not funcs:
            return
        root = Path(self.store).expanduser() if self.store else kope_home()
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise PassError(f"cannot create the experience store {root}: {err}") from None
        store = store_at(root)
        target = target_for(self.target, 1, self.timeout_s)
        target_key = target.key()
        agent = make_agent(self.agent, seed=self.seed)
        try:
            for func in funcs:
                try:
                    self._optimize(func, target, target_key, store, agent)
                except _Skip as why:
                    self.warn(func.location, f"@{symbol_name(func)} not optimized: {why}")
        finally:
            agent.close()

    def _optimize(
        self,
        func: ir.Operation,
        target: Target,
        target_key: str,
        store: ExperienceStore,
        agent: Agent,
    ) -> None:
        from kope.tools.precompile import already_done
        from kope.tuner.optimize import Budget, optimize_task, summarize

        task = self._task(func, target, target_key, store)
        budget = Budget(attempts=self.budget)
        if already_done(store, task.key, self.agent, budget):
            summary = summarize(task, store, stopped="done in an earlier run")
        else:
            summary = optimize_task(task, target, store, agent, budget, seed=self.seed)
        if summary.stopped.startswith("reference lowering"):
            raise _Skip(summary.stopped)
        entries: dict[str, ir.Attribute] = {
            "winner": ir.StringAttr.get(summary.winner),
            "attempts": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), summary.attempts),
            "stopped": ir.StringAttr.get(summary.stopped),
        }
        speedup = summary.speedup_vs_reference
        if speedup is not None:
            entries["speedup"] = ir.FloatAttr.get(ir.F64Type.get(), speedup)
        if summary.speedup_vs_eager is not None:
            entries["speedup_vs_eager"] = ir.FloatAttr.get(
                ir.F64Type.get(), summary.speedup_vs_eager
            )
        pinned = winner(store.attempts(task.key)).pinned
        if pinned is not None:
            entries["best_attempt"] = ir.StringAttr.get(pinned.id)
        func.attributes[OPTIMIZED_ATTR] = ir.DictAttr.get(entries)

    def _task(
        self, func: ir.Operation, target: Target, target_key: str, store: ExperienceStore
    ) -> Task:
        """The Task a keyed function is: its body the reference lowering; its eager call the
        one it carries (`kope.eager`), else the one the store holds for its key (the backend
        recorded it), else none."""
        key = function_key(func)
        payload = canonical_function(func)
        if task_key(payload, target_key) != key:
            raise _Skip(
                f"its kope.key {key[:12]}... is not the key of its body on target "
                f"'{self.target}' (outlined for another target, or changed since)"
            )
        ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
        inputs = tuple(_spec(t, target) for t in ftype.inputs)
        outputs = tuple(_spec(t, target) for t in ftype.results)
        label = (
            ir.StringAttr(func.attributes[LABEL_ATTR]).value
            if LABEL_ATTR in func.attributes
            else f"@{symbol_name(func)}"
        )
        spec = TaskSpec(label, inputs, outputs, _eager_call(func, store, key))
        return Task([], [], spec, payload, key, workload_digest(payload))


def _eager_call(func: ir.Operation, store: ExperienceStore, key: str) -> OpCall | Program | None:
    if EAGER_ATTR in func.attributes:
        text = ir.StringAttr(func.attributes[EAGER_ATTR]).value
        try:
            return eager_from_json(json.loads(text))
        except (ValueError, KeyError, TypeError) as err:
            raise _Skip(f"its {EAGER_ATTR} is not an ATen call KOPE wrote ({err})") from None
    record = store.task(key)
    if record is not None and record.eager is not None:
        return eager_from_json(record.eager)
    return None


def _spec(t: ir.Type, target: Target) -> TensorSpec:
    if not isinstance(t, ir.RankedTensorType) or not t.has_static_shape:
        raise _Skip(f"it takes or returns {t}; KOPE's kernels take tensors of static shape")
    element = str(t.element_type)
    dtype = _DTYPE_OF.get(element)
    if dtype is None or dtype not in target.dtypes:
        raise _Skip(f"its element type {element} is not one the {target.name} target takes")
    return TensorSpec(tuple(t.shape), dtype)
