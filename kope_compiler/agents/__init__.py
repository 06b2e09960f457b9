"""Agents by name: `heuristic` (offline, the default) and `llm` (any OpenAI-compatible endpoint).

Third parties add agents under the `kope.agents` entry point group.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import entry_points
from typing import Any

from kope.agents.base import (
    Agent,
    Experience,
    Feedback,
    Proposal,
    ProposalRequest,
    Rejected,
    TaskView,
)

_BUILTIN = {
    "heuristic": "kope.agents.heuristic:HeuristicAgent",
    "llm": "kope.agents.llm:LLMAgent",
}


def _registry() -> dict[str, str]:
    found = dict(_BUILTIN)
    for ep in entry_points(group="kope.agents"):
        found.setdefault(ep.name, ep.value)
    return found


def agent_names() -> list[str]:
    return sorted(_registry())


def agent_class(name: str) -> type[Agent]:
    registry = _registry()
    if name not in registry:
        raise KeyError(f"unknown agent {name!r}; known agents: {', '.join(sorted(registry))}")
    module, _, attr = registry[name].partition(":")
    cls: type[Agent] = getattr(import_module(module), attr)
    return cls


def make_agent(name: str, **config: Any) -> Agent:
    return agent_class(name)(**config)


__all__ = [
    "Agent",
    "Experience",
    "Feedback",
    "Proposal",
    "ProposalRequest",
    "Rejected",
    "TaskView",
    "agent_class",
    "agent_names",
    "make_agent",
]
