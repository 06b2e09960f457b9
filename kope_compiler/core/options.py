"""The options of `torch.compile(..., backend="kope", options={...})`, validated by name and
value."""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kope.core.errors import OptionError
from kope.vocabulary.home import kope_home
from kope.vocabulary.registry import AGENTS, DEFAULT_TARGET, target_names

KERNEL_POLICIES = ("auto", "reference", "eager")
PRIORS = ("static", "flat")


@dataclass(frozen=True)
class Options:
    """What a user can choose per compiled model. Every field is an option name."""

    target: str = DEFAULT_TARGET
    """The hardware target that runs the kernels (`kope.targets` lists them)."""
    store: str | None = None
    """The experience store directory; default `$KOPE_HOME` (`~/.cache/kope`)."""
    kernels: str = "auto"
    """`auto`: the fastest verified kernel; `reference`: the reference lowering wherever it
    verifies; `eager`: ATen for everything (compile and partition only)."""
    workers: int = 1
    """Isolated worker processes that verify and time candidates."""
    timeout_s: float = 60.0
    """Wall-clock limit for building, verifying and timing one candidate in a worker."""
    fuse: bool = True
    """Fuse connected groups of elementwise and row operators into one kernel each (elementwise
    ones with the matmul before them, as its epilogue), and make the graph rewrites of
    `kope.frontend.rewrites` (batch norm folded, stacks of convolutions channels-last, attention
    as one kernel)."""
    optimize: bool = False
    """Let the agent optimize operators the store has not seen optimized, inline."""
    agent: str = "heuristic"
    """The agent for `optimize`: `heuristic` (offline) or `llm` (OpenAI-compatible endpoint)."""
    budget: int = 16
    """Attempts per operator when optimizing: the one default of this setting, read by the
    CLI, `kope-optimize`, `BenchConfig` and the loop's `Budget.attempts`."""
    prior: str = "static"
    """What the heuristic agent knows before any experience: `static`, its hand-written
    ranking of candidates, which breaks ties where the experience graph has no evidence;
    `flat`, none (the search learns the machine from the store alone)."""

    @property
    def store_path(self) -> Path:
        return Path(self.store).expanduser() if self.store else kope_home()

    @classmethod
    def names(cls) -> list[str]:
        return sorted(f.name for f in dataclasses.fields(cls))

    @classmethod
    def parse(cls, given: Mapping[str, Any] | None) -> Options:
        """Validate user options; an unknown name or bad value raises `OptionError` naming it."""
        given = dict(given or {})
        valid = cls.names()
        unknown = sorted(k for k in given if k not in valid)
        if unknown:
            guesses = [
                f"{k!r} (did you mean {close[0]!r}?)" if close else repr(k)
                for k in unknown
                for close in [difflib.get_close_matches(k, valid, n=1)]
            ]
            raise OptionError(
                f"unknown KOPE option {', '.join(guesses)}; valid options are: {', '.join(valid)}"
            )
        if isinstance(given.get("store"), os.PathLike):
            given["store"] = os.fspath(given["store"])
        opts = cls(**given)
        opts._validate()
        return opts

    @classmethod
    def default(cls, name: str) -> Any:
        """The default of option `name`: the one source the CLI, precompile and bench read."""
        return getattr(cls(), name)

    def _validate(self) -> None:
        if self.target not in target_names():
            raise OptionError(
                f"option target={self.target!r} is not a known target; "
                f"choose one of: {', '.join(target_names())}"
            )
        if self.kernels not in KERNEL_POLICIES:
            raise OptionError(
                f"option kernels={self.kernels!r} is not valid; "
                f"choose one of: {', '.join(KERNEL_POLICIES)}"
            )
        if self.store is not None and not isinstance(self.store, str):
            raise OptionError(f"option store={self.store!r} must be a directory path")
        if not isinstance(self.workers, int) or isinstance(self.workers, bool) or self.workers < 1:
            raise OptionError(f"option workers={self.workers!r} must be an integer >= 1")
        if not isinstance(self.timeout_s, (int, float)) or self.timeout_s <= 0:
            raise OptionError(f"option timeout_s={self.timeout_s!r} must be a positive number")
        if not isinstance(self.fuse, bool):
            raise OptionError(f"option fuse={self.fuse!r} must be True or False")
        if not isinstance(self.optimize, bool):
            raise OptionError(f"option optimize={self.optimize!r} must be True or False")
        if self.agent not in AGENTS.names():
            raise OptionError(
                f"option agent={self.agent!r} is not a known agent; choose one of: "
                f"{', '.join(AGENTS.names())}"
            )
        if not isinstance(self.budget, int) or isinstance(self.budget, bool) or self.budget < 1:
            raise OptionError(f"option budget={self.budget!r} must be an integer >= 1")
        if self.prior not in PRIORS:
            raise OptionError(
                f"option prior={self.prior!r} is not valid; choose one of: {', '.join(PRIORS)}"
            )
        if self.prior != Options.default("prior") and not AGENTS.load(self.agent).has_prior:
            raise OptionError(
                f"option prior={self.prior!r}: the {self.agent} agent has no hand-written prior "
                "to flatten; leave prior out, or use agent='heuristic'"
            )


def check_options(given: Mapping[str, Any] | None) -> Options:
    """Validate `torch.compile(..., options=given)` now, before any tracing.

    torch hands the options to the backend only at the first call, after dynamo has traced the
    model, so a misspelt option surfaces only then; a script calls this first to fail fast.
    Raises the same `OptionError` the backend would.
    """
    return Options.parse(given)
