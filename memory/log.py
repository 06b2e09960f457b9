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
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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
        self._rfd: int | None = None
        self.damaged = 0  # damaged lines skipped by this reader

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
        records: list[dict[str, Any]] = []
        more = True
        while more:
            entries, offset, more = self.scan(offset)
            records.extend(record for _, _, record in entries)
        return records, offset

    def scan(
        self, offset: int, max_bytes: int = 1 << 26
    ) -> tuple[list[tuple[int, int, dict[str, Any]]], int, bool]:
        """(byte offset, length, record) of the records after byte `offset`, at most about
        `max_bytes` of them; the offset to continue from; and whether more remain."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return [], 0, False
        try:
            # Under the shared lock no writer is mid-line, so every line before `size` is
            # whole (or torn for good by a crash); those bytes never change afterwards.
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                size = os.fstat(fd).st_size
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            if size < offset:
                log.warning("%s shrank below what was read; reading it again", self.path)
                offset = 0
            data = _pread_all(fd, min(size - offset, max_bytes), offset)
            last = offset + len(data) >= size
            if not last and b"\n" not in data:  # one line longer than max_bytes
                data, last = _pread_all(fd, size - offset, offset), True
        finally:
            os.close(fd)
        end = data.rfind(b"\n") + 1
        entries: list[tuple[int, int, dict[str, Any]]] = []
        start = 0
        while start < end:
            stop = data.index(b"\n", start)
            if stop > start:
                try:
                    entries.append((offset + start, stop - start, decode(data[start:stop])))
                except (ValueError, json.JSONDecodeError) as err:
                    self.damaged += 1
                    log.warning(
                        "%s: skipping a damaged record at byte %d (%s)",
                        self.path,
                        offset + start,
                        err,
                    )
            start = stop + 1
        if not last:
            return entries, offset + end, True
        if end < len(data):
            log.warning(
                "%s: skipping a torn record at its end (%d bytes)", self.path, len(data) - end
            )
        return entries, offset + len(data), False

    def read_at(self, offset: int, length: int) -> dict[str, Any]:
        """The record stored at `offset` (as returned by `scan`); ValueError if damaged."""
        if self._rfd is None:
            self._rfd = os.open(self.path, os.O_RDONLY)
        return decode(os.pread(self._rfd, length, offset))

    def read_bytes(self, offset: int, length: int) -> bytes:
        """Raw bytes of the log, for checking that a snapshot still matches it."""
        if self._rfd is None:
            self._rfd = os.open(self.path, os.O_RDONLY)
        return os.pread(self._rfd, length, offset)

    def size(self) -> int:
        try:
            return os.path.getsize(self.path)
        except FileNotFoundError:
            return 0

    def close(self) -> None:
        for fd in (self._fd, self._rfd):
            if fd is not None:
                os.close(fd)
        self._fd = self._rfd = None


def _last_byte(path: Path, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(size - 1)
        return f.read(1)


def _pread_all(fd: int, n: int, offset: int) -> bytes:
    chunks = []
    while n > 0:
        chunk = os.pread(fd, min(n, 1 << 24), offset)
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)
