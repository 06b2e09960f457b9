"""The target interface: what a target supplies, and the evaluation every target shares.

Every target evaluates a candidate the same way (`kope.targets.evaluation`): build it in an
isolated worker, verify it against an oracle on fresh random and edge inputs with poisoned,
guarded outputs, time it interleaved with eager ATen, check the timed outputs, and map what
went wrong to a verdict. Failures are data (`Evaluation.verdict`, `Evaluation.error`), never
exceptions that escape to the caller.

A target supplies only what differs: what it accepts (torch device, dtypes, kernel forms),
how it builds a kernel into something callable (`build`, run in the worker and, for a verified
kernel, in the calling process by `load`), the threads a built kernel uses, how its timer
waits for the device (`synchronize`), its key, and its description for the agents
(`capabilities`, `describe`). A new target is one module with one `Target` subclass,
registered under the `kope.targets` entry point group (`kope.vocabulary.registry.TARGETS`).
"""

from __future__ import annotations

from typing import Any

from kope.targets.evaluation import evaluate
from kope.targets.hooks import BuildError, BuiltKernel, TargetHooks
from kope.vocabulary.evidence import Evaluation
from kope.vocabulary.kernels import Kernel
from kope.vocabulary.specs import TaskSpec

__all__ = ["BuildError", "BuiltKernel", "Target"]


class Target(TargetHooks):
    """A hardware target. Subclasses set the class attributes and implement `key` and `build`
    (`TargetHooks`); the evaluation is every target's own."""

    # -- what every target shares -------------------------------------------------------------
    def evaluate(
        self,
        task: TaskSpec,
        kernel: Kernel | None,
        *,
        oracle: Kernel | None = None,
        measure: bool = True,
        seed: int = 0,
        config: Any = None,
        limit_s: float | None = None,
    ) -> Evaluation:
        """Build, verify and (if verified and `measure`) time `kernel` in an isolated worker,
        within a limit scaled to its work and at most `limit_s` where given.

        The oracle is `oracle` when this target builds its form, else eager ATen (in float64
        where the op allows). With `kernel` None, eager ATen alone is timed: the baseline of a
        target that cannot run the reference lowering. Never raises for a bad candidate."""
        return evaluate(
            self,
            task,
            kernel,
            oracle=oracle,
            measure=measure,
            seed=seed,
            config=config,
            limit_s=limit_s,
        )
