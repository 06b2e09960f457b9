"""Logging set-up: every module logs under `kope.<room>`; `KOPE_LOG=debug` turns it on.

`TORCH_LOGS=+kope` works too: torch resolves the name to this package's logger tree.
"""

from __future__ import annotations

import logging
import os

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure_from_env() -> None:
    """Attach a stderr handler to the `kope` logger when `KOPE_LOG` names a level."""
    wanted = os.environ.get("KOPE_LOG", "").strip().lower()
    if not wanted:
        return
    level = _LEVELS.get(wanted)
    if level is None:
        logging.getLogger("kope").warning(
            "KOPE_LOG=%r is not a level; use one of %s", wanted, ", ".join(_LEVELS)
        )
        return
    root = logging.getLogger("kope")
    root.setLevel(level)
    if not any(getattr(h, "_kope", False) for h in root.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(name)s] %(levelname)s: %(message)s"))
        handler._kope = True  # type: ignore[attr-defined]
        root.addHandler(handler)
        root.propagate = False  # this handler prints it; do not print twice via the root
