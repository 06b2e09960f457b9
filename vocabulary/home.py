"""Where KOPE keeps its files: `$KOPE_HOME`, else `~/.cache/kope` (the store, the OpenMP shim,
the caches of `kope.vocabulary.cache`, pipeline repros)."""

from __future__ import annotations

import os
from pathlib import Path


def kope_home() -> Path:
    env = os.environ.get("KOPE_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kope"
