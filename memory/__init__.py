"""Experience Graph Memory: what KOPE learned about each operator, durable on disk, and ACMI,
the retrieval that packs the relevant part of it under a token budget."""

from kope.memory.insights import distil_insights
from kope.memory.recorder import Recorder, attempt_of
from kope.memory.retrieval import Context, ContextItem, retrieve
from kope.memory.schema import SCHEMA_VERSION, AttemptRecord, InsightRecord, TaskRecord
from kope.memory.store import ExperienceStore
from kope.memory.tokens import BpeCounter, EstimatingCounter, TokenCounter
from kope.vocabulary.home import kope_home

__all__ = [
    "SCHEMA_VERSION",
    "AttemptRecord",
    "BpeCounter",
    "Context",
    "Recorder",
    "attempt_of",
    "ContextItem",
    "EstimatingCounter",
    "ExperienceStore",
    "InsightRecord",
    "TaskRecord",
    "TokenCounter",
    "distil_insights",
    "kope_home",
    "retrieve",
]
