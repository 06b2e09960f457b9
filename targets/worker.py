"""Isolated worker processes: a candidate that crashes, hangs or corrupts memory takes down a
worker, never the compiler.

The parent talks to each worker over a private pipe pair with length-prefixed pickles. A job
names a function (`"module:function"`) and its payload; while it runs the worker reports its
phase (`build`, `verify`, `measure`), so a crash is attributed to the right phase. A job past
its deadline gets its worker killed; a dead worker is replaced on the next job.
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any

log = logging.getLogger("kope.targets.worker")

_HEADER = struct.Struct("<Q")
STARTUP_TIMEOUT_S = 180.0


@dataclass
class Outcome:
    """The end of one job: a value, or how the worker failed (`crash`, `timeout`, `error`)."""

    value: Any = None
    failure: str | None = None  # None on success
    detail: str = ""
    phase: str = ""

    @property
    def ok(self) -> bool:
        return self.failure is None


# -- framing ------------------------------------------------------------------------------------


def _send(fd: int, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exactly(fd: int, n: int, deadline: float | None) -> bytes | None:
    chunks, remaining = [], n
    while remaining:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                raise TimeoutError
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            return None  # the other side is gone
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _recv(fd: int, deadline: float | None = None) -> Any:
    header = _read_exactly(fd, _HEADER.size, deadline)
    if header is None:
        raise EOFError
    body = _read_exactly(fd, _HEADER.unpack(header)[0], deadline)
    if body is None:
        raise EOFError
    return pickle.loads(body)


# -- the worker side ----------------------------------------------------------------------------


def _serve(read_fd: int, write_fd: int) -> None:
    cache: dict[str, Callable[..., Any]] = {}
    _send(write_fd, ("ready", os.getpid()))
    while True:
        try:
            message = _recv(read_fd)
        except EOFError:
            return
        if message is None:
            return
        target, payload = message

        def phase(name: str) -> None:
            _send(write_fd, ("phase", name))

        try:
            if target not in cache:
                module, _, attr = target.partition(":")
                cache[target] = getattr(import_module(module), attr)
            result = cache[target](payload, phase)
            _send(write_fd, ("result", result))
        except Exception:
            _send(write_fd, ("error", traceback.format_exc(limit=8)))


# -- the parent side ----------------------------------------------------------------------------


class Worker:
    """One worker process and its pipes."""

    def __init__(self, preload: str | None):
        parent_read, child_write = os.pipe()
        child_read, parent_write = os.pipe()
        self.stderr = tempfile.TemporaryFile()
        env = dict(os.environ)
        env.pop("KOPE_LOG", None)
        argv = [sys.executable, "-m", "kope.targets.worker", str(child_read), str(child_write)]
        if preload:
            argv.append(preload)
        self.proc = subprocess.Popen(
            argv,
            pass_fds=(child_read, child_write),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
            env=env,
            start_new_session=True,
        )
        os.close(child_read)
        os.close(child_write)
        self.read_fd, self.write_fd = parent_read, parent_write
        self.ready = False

    def _wait_ready(self) -> None:
        if self.ready:
            return
        message = _recv(self.read_fd, time.monotonic() + STARTUP_TIMEOUT_S)
        if message[0] != "ready":
            raise RuntimeError(f"worker sent {message!r} instead of ready")
        self.ready = True

    def call(self, target: str, payload: Any, timeout_s: float) -> Outcome:
        phase = "start"
        try:
            self._wait_ready()
            _send(self.write_fd, (target, payload))
            deadline = time.monotonic() + timeout_s
            while True:
                kind, value = _recv(self.read_fd, deadline)
                if kind == "phase":
                    phase = value
                elif kind == "result":
                    return Outcome(value=value, phase=phase)
                else:
                    return Outcome(failure="error", detail=value, phase=phase)
        except TimeoutError:
            self.kill()
            return Outcome(
                failure="timeout", detail=f"no answer within {timeout_s:g} s", phase=phase
            )
        except (EOFError, BrokenPipeError, OSError):
            return Outcome(failure="crash", detail=self._death_note(), phase=phase)

    def _death_note(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.wait()
        if code < 0:
            try:
                reason = f"worker killed by {signal.Signals(-code).name}"
            except ValueError:
                reason = f"worker killed by signal {-code}"
        else:
            reason = f"worker exited with status {code}"
        tail = self.stderr_tail()
        return reason + (f"; its stderr ends with:\n{tail}" if tail else "")

    def stderr_tail(self, limit: int = 2000) -> str:
        try:
            self.stderr.seek(0, os.SEEK_END)
            size = self.stderr.tell()
            self.stderr.seek(max(0, size - limit))
            return self.stderr.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def close(self) -> None:
        if self.alive:
            try:
                _send(self.write_fd, None)
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.stderr.close()


class WorkerPool:
    """A persistent pool of isolated workers; dead or hung workers are replaced."""

    def __init__(self, size: int = 1, preload: str | None = None):
        self.size = max(1, size)
        self.preload = preload
        self._idle: list[Worker] = []
        self._started = 0
        self._cond = threading.Condition()
        self._closed = False
        atexit.register(self.close)

    def call(self, target: str, payload: Any, timeout_s: float) -> Outcome:
        """Run `target(payload, phase)` in a worker; never raises for what the job does."""
        worker = self._acquire()
        try:
            outcome = worker.call(target, payload, timeout_s)
        finally:
            self._release(worker)
        if outcome.failure in ("crash", "timeout"):
            log.warning(
                "worker %s during %s: %s",
                outcome.failure,
                outcome.phase,
                outcome.detail.splitlines()[0] if outcome.detail else "",
            )
        return outcome

    def _acquire(self) -> Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("worker pool is closed")
                if self._idle:
                    return self._idle.pop()
                if self._started < self.size:
                    self._started += 1
                    break
                self._cond.wait()
        try:
            return Worker(self.preload)
        except BaseException:
            with self._cond:
                self._started -= 1
                self._cond.notify()
            raise

    def _release(self, worker: Worker) -> None:
        with self._cond:
            if worker.alive and not self._closed:
                self._idle.append(worker)
            else:
                worker.close()
                self._started -= 1
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.close()


def main(argv: list[str]) -> None:
    read_fd, write_fd = int(argv[1]), int(argv[2])
    if len(argv) > 3:
        import_module(argv[3])  # warm the imports the jobs need before reporting ready
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _serve(read_fd, write_fd)


if __name__ == "__main__":
    main(sys.argv)
