"""A snapshot file: named numpy arrays and a JSON header, checksummed, memory-mapped on load.

The experience store writes one so that opening a large store does not replay its whole log
(see `store.py`). The snapshot is derived data: the log stays the truth, and a snapshot that
is missing, damaged, of another format or not matching the log is ignored with a warning.

Layout: `KOPESNAP`, the header length (8 bytes, little endian), the header JSON (which names
each array's dtype, shape and offset), the arrays at 64-byte aligned offsets, and the CRC-32
of everything before it (4 bytes). Written to a temporary file, fsync'ed, then renamed over
the old one, so a reader sees the old snapshot or the new one, never a mix.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("kope.memory")

MAGIC = b"KOPESNAP"
FORMAT = 1
_ALIGN = 64


def write(path: Path, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> int:
    """Write a snapshot atomically; returns its size in bytes."""
    specs: dict[str, dict[str, Any]] = {}
    offset = 0
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        arrays[name] = array
        specs[name] = {"dtype": array.dtype.str, "shape": list(array.shape), "offset": offset}
        offset += _padded(array.nbytes)
    head = json.dumps({**header, "format": FORMAT, "arrays": specs}, sort_keys=True).encode()
    prefix = MAGIC + struct.pack("<Q", len(head)) + head
    prefix += b"\0" * (_padded(len(prefix)) - len(prefix))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".snapshot-")
    try:
        with os.fdopen(fd, "wb") as f:
            crc = zlib.crc32(prefix)
            f.write(prefix)
            for array in arrays.values():
                raw = memoryview(array.data).cast("B") if array.nbytes else b""
                pad = b"\0" * (_padded(array.nbytes) - array.nbytes)
                crc = zlib.crc32(pad, zlib.crc32(raw, crc))
                f.write(raw)
                f.write(pad)
            f.write(struct.pack("<I", crc))
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return size


def load(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """The header and (read-only, memory-mapped) arrays of a snapshot; None with a warning
    when it is damaged or of another format, None silently when there is none."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < len(MAGIC) + 12:
                raise ValueError("too short")
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        log.warning("%s: ignoring the snapshot (%s); replaying the log instead", path, err)
        return None
    try:
        if data[: len(MAGIC)] != MAGIC:
            raise ValueError("not a KOPE snapshot")
        (stored,) = struct.unpack("<I", data[size - 4 :])
        if zlib.crc32(memoryview(data)[: size - 4]) != stored:
            raise ValueError("checksum mismatch")
        (head_len,) = struct.unpack("<Q", data[len(MAGIC) : len(MAGIC) + 8])
        header = json.loads(data[len(MAGIC) + 8 : len(MAGIC) + 8 + head_len])
        if header.get("format") != FORMAT:
            raise ValueError(f"format {header.get('format')}, this KOPE reads {FORMAT}")
        base = _padded(len(MAGIC) + 8 + head_len)
        arrays: dict[str, np.ndarray] = {}
        for name, spec in header["arrays"].items():
            dtype = np.dtype(spec["dtype"])
            count = int(np.prod(spec["shape"], dtype=np.int64))
            arrays[name] = np.frombuffer(
                data, dtype=dtype, count=count, offset=base + spec["offset"]
            ).reshape(spec["shape"])
        return header, arrays
    except (ValueError, KeyError, TypeError, struct.error) as err:
        log.warning("%s: ignoring the snapshot (%s); replaying the log instead", path, err)
        return None


def _padded(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
