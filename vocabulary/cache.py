"""Content-addressed caches of derived files under `$KOPE_HOME/cache/<kind>/`.

What a process derives from a Task or a kernel and the toolchain alone (a Task's reference
lowering, a verified kernel's machine code) is the same in the next process, and costs tenths
of a second per operator to derive again. Each entry is named by the sha256 of everything it
was derived from: the input, the versions of the tools, and the source of KOPE's code that
derives it (`source_digest`), so an edit of that code or a new torch-mlir is a miss, never a
stale hit. Entries are written atomically (a temporary file, then a rename), so processes
sharing a cache never read half an entry. Deleting the folder only costs the time to refill it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from kope.vocabulary.home import kope_home


def cache_dir(kind: str) -> Path:
    return kope_home() / "cache" / kind


def digest(*parts: str) -> str:
    """The sha256 of `parts`, each length-prefixed so that no two lists of parts collide."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


@functools.cache
def source_digest(paths: tuple[Path, ...]) -> str:
    """The sha256 of the source files at `paths` (directories: their `*.py`, recursively)."""
    return digest(*(f.read_text() for f in sorted(_files(paths))))


def _files(paths: Iterable[Path]) -> Iterable[Path]:
    for path in paths:
        if path.is_dir():
            yield from path.rglob("*.py")
        else:
            yield path


def write_atomically(path: Path, data: bytes) -> None:
    """Write `path` so that a reader sees the whole file or none of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
