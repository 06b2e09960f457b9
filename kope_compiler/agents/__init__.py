"""Agents by name: `heuristic` (offline, the default) and `llm` (any OpenAI-compatible endpoint).

KOPE's own and third parties' agents are entry points of the `kope.agents` group
(`kope.vocabulary.registry.AGENTS`).
"""

from __future__ import annotations

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
from kope.vocabulary.registry import AGENTS


def agent_names() -> list[str]:
    return AGENTS.names()


def agent_class(name: str) -> type[Agent]:
    cls: type[Agent] = AGENTS.load(name)
    return cls


def make_agent(name: str, prior: str | None = None, **config: Any) -> Agent:
    """Agent `name` configured by `config`; `prior`, where given, reaches only agents that
    have one (the options' validation refuses a flat prior for those that do not)."""
    cls = agent_class(name)
    if cls.has_prior and prior is not None:
        config["prior"] = prior
    return cls(**config)


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
