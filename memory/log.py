"""A durable, append-only record log shared safely by several processes.

Each record is one line: the CRC-32 of its JSON, a space, the JSON, a newline. An append takes
an exclusive `flock`, writes the line in one `write` on an `O_APPEND` descriptor and `fsync`s,
so a record is durable when `append` returns, and concurrent writers never interleave. A torn
or corrupt line (a crash mid-write, a damaged disk block) is skipped with a warning on reading;
the next append first terminates a torn tail so that no later record is glued to it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import zlib
from pathlib import Path
from typing import Any, Iterable

log = logging.getLogger("kope.memory")


def encode(record: dict[str, Any]) -> bytes:
    body = json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=True)
    raw = body.encode()
    return b"%08x " % zlib.crc32(raw) + raw + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    crc, _, raw = line.partition(b" ")
    if len(crc) != 8 or int(crc, 16) != zlib.crc32(raw):
        raise ValueError("checksum mismatch")
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError("record is not an object")
    return value


class RecordLog:
    """Append and read records of one log file."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = None

    def _writer(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self._fd

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        """Write records durably (one write, one fsync for the batch)."""
        data = b"".join(encode(r) for r in records)
        if not data:
            return
        fd = self._writer()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            size = os.fstat(fd).st_size
            if size and _last_byte(self.path, size) != b"\n":
                data = b"\n" + data  # close a torn tail left by a crashed writer
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def read_from(self, offset: int) -> tuple[list[dict[str, Any]], int]:
        """Records after byte `offset`, and the offset to continue from."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return [], 0
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                size = os.fstat(fd).st_size
                if size < offset:
                    log.warning("%s shrank below what was read; reading it again", self.path)
                    offset = 0
                os.lseek(fd, offset, os.SEEK_SET)
                data = _read_all(fd, size - offset)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        records: list[dict[str, Any]] = []
        position = offset
        for line in data.split(b"\n")[:-1]:
            lineno_offset = position
            position += len(line) + 1
            if not line:
                continue
            try:
                records.append(decode(line))
            except (ValueError, json.JSONDecodeError) as err:
                log.warning("%s: skipping a damaged record at byte %d (%s)", self.path, lineno_offset, err)
        tail = data[data.rfind(b"\n") + 1 :]
        if tail:
            log.warning("%s: skipping a torn record at its end (%d bytes)", self.path, len(tail))
            position += len(tail)
        return records, position

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _last_byte(path: Path, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(size - 1)
        return f.read(1)


def _read_all(fd: int, n: int) -> bytes:
    chunks = []
    while n > 0:
        chunk = os.read(fd, min(n, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)
