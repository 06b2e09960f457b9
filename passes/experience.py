"""`kope-annotate-experience`: what the experience store knows about each operator, in the IR.

Each function carrying `kope.key` (see `kope-outline-operators`) gets one attribute,
`kope.experience`, a dictionary of what memory holds for that key:

    kope.experience = {attempts = 5 : i64, best_attempt = "attempt-…", best_us = 12.5 : f64,
                       eager_us = 30.0 : f64, op = "aten.mm.default", speedup_vs_eager = 2.4 : f64,
                       verdicts = {compile_error = 1 : i64, verified = 4 : i64}, winner = "agent"}

An operator memory has never seen gets `{attempts = 0 : i64}`. The pass only reads the store.
Both store-reading passes open it with `open_store`.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from torch_mlir import ir

from kope.memory import ExperienceStore
from kope.memory.standing import winner
from kope.passes.base import ModulePass, PassError
from kope.passes.keys import KEY_ATTR
from kope.vocabulary.home import kope_home

log = logging.getLogger("kope.passes")

EXPERIENCE_ATTR = "kope.experience"
STORE_HELP = "experience store directory (default: $KOPE_HOME, else ~/.cache/kope)"


def open_store(path: str, pass_name: str) -> ExperienceStore:
    """The store at `path` (empty: KOPE's home); a directory that does not exist is an error.

    Opening a missing directory would create an empty store as a side effect of a typo, and
    the pass would then silently find nothing.
    """
    root = Path(path).expanduser() if path else kope_home()
    if not root.is_dir():
        what = "the path is a file" if root.exists() else "the directory does not exist"
        raise PassError(
            f"no experience store at {root}: {what}; give "
            f"{pass_name}{{store=DIR}} a store that `kope compile` or `kope precompile` filled, "
            f"or set KOPE_HOME"
        )
    return ExperienceStore(root)


def keyed_functions(module: ir.Operation) -> list[ir.Operation]:
    """The top-level `func.func`s that carry a `kope.key`, in order."""
    return [
        op.operation
        for op in module.regions[0].blocks[0].operations
        if op.operation.name == "func.func" and KEY_ATTR in op.operation.attributes
    ]


def outlined_functions(pass_: ModulePass, module: ir.Operation) -> list[ir.Operation]:
    """`keyed_functions`, with a warning at the module where there are none: a pass that acts
    on outlined operators would otherwise do nothing to a module nobody outlined, silently."""
    funcs = keyed_functions(module)
    if not funcs:
        pass_.warn(
            module.location,
            f"no function carries {KEY_ATTR}, so there is nothing to do: outline the operators "
            f"first (kope-outline-operators before {pass_.name} in the pipeline)",
        )
    return funcs


def function_key(func: ir.Operation) -> str:
    return ir.StringAttr(func.attributes[KEY_ATTR]).value


def symbol_name(op: ir.Operation) -> str:
    return ir.StringAttr(op.attributes["sym_name"]).value


def experience_of(store: ExperienceStore, key: str) -> ir.DictAttr:
    """What `store` knows about task `key`, as a dictionary attribute (in the current context)."""
    i64 = ir.IntegerType.get_signless(64)
    attempts = store.attempts(key)
    entries: dict[str, ir.Attribute] = {"attempts": ir.IntegerAttr.get(i64, len(attempts))}
    if not attempts:
        return ir.DictAttr.get(entries)
    verdicts = Counter(a.verdict for a in attempts)
    entries["verdicts"] = ir.DictAttr.get(
        {verdict: ir.IntegerAttr.get(i64, n) for verdict, n in sorted(verdicts.items())}
    )
    task = store.task(key)
    if task is not None:
        entries["op"] = ir.StringAttr.get(task.op)
    best = winner(store.attempts(key)).best
    if best is not None:
        entries["winner"] = ir.StringAttr.get(best.source)
        entries["best_attempt"] = ir.StringAttr.get(best.id)
        numbers = {
            "best_us": best.latency_us,
            "eager_us": best.eager_us,
            "speedup_vs_eager": best.speedup_vs_eager,
        }
        for name, value in numbers.items():
            if value is not None:
                # Rounded: three decimals of a microsecond or of a ratio are below the noise.
                entries[name] = ir.FloatAttr.get_f64(round(float(value), 3))
    return ir.DictAttr.get(entries)


@dataclass
class AnnotateExperience(ModulePass):
    """Attach `kope.experience` (attempts, verdicts, winner, latency, speedup) to keyed funcs."""

    name = "kope-annotate-experience"
    summary = "Attach what the experience store knows about each keyed operator as kope.experience"

    store: str = field(default="", metadata={"help": STORE_HELP})

    def run(self, module: ir.Operation) -> None:
        store = open_store(self.store, self.name)
        try:
            for func in outlined_functions(self, module):
                func.attributes[EXPERIENCE_ATTR] = experience_of(store, function_key(func))
                log.debug("annotated @%s from %s", symbol_name(func), store.root)
        finally:
            store.close()
