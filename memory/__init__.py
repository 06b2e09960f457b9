"""Experience Graph Memory: what KOPE learned about each operator, durable on disk."""

from kope.memory.paths import kope_home
from kope.memory.schema import SCHEMA_VERSION, AttemptRecord, TaskRecord
from kope.memory.store import ExperienceStore

__all__ = ["SCHEMA_VERSION", "AttemptRecord", "ExperienceStore", "TaskRecord", "kope_home"]
