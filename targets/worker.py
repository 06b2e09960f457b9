"""Isolated worker processes: a candidate that crashes, hangs or corrupts memory takes down a
worker, never the compiler.

The parent talks to each worker over a private pipe pair with length-prefixed pickles. A job
names a function (`"module:function"`) and its payload; while it runs the worker reports its
phase (`build`, `verify`, `measure`), so a crash is attributed to the right phase. A job past
its deadline gets its worker killed; a dead worker is replaced on the next job.

A worker never outlives its parent: a stale build keeps a core busy and spoils every figure
measured on the machine meanwhile. Three lines of defence, each for what the others miss:

- The parent-death signal. The worker asks the kernel for SIGKILL when its parent dies
  (`prctl(PR_SET_PDEATHSIG)`), then checks that its parent is still the process that started
  it, which may have died before the request. This covers SIGKILL and SIGTERM of the parent
  (`timeout`), where no atexit handler runs. The kernel sends the signal when the *thread*
  that started the worker ends, not the process, and the pool is called from threads that
  end while the process lives (`kope precompile --workers N` runs each operator in a
  ThreadPoolExecutor thread, gone when the run ends; its workers stay in the pool). So every
  worker is started by one daemon thread of this module (`_Starter`) that lives as long as
  the process: a worker is never killed while its parent lives.
- A watchdog, a process. MLIR's `PassManager.run`, `ExecutionEngine(...)` and its
  `raw_lookup`, which compiles, hold the GIL throughout (measured with torch-mlir 20261001: a
  Python thread ticking every 0.5 ms got no turn through an 18 s lookup), so a watchdog
  thread would be stuck whenever a build is. The worker starts one at start-up instead: this
  file run with `python -I -S` (its imports are the standard library's), not a fork, as the
  worker has threads by then (a native one, from importing `kope`). It waits in poll() until
  the pipe from the parent hangs up (every writer gone: the parent died) or the worker's
  lifeline pipe does (the worker died), and checks each second that the worker's parent is
  the one that started it; then it kills the worker, removes the worker's scratch directory
  (which a parent killed with SIGKILL, or a Ray worker shut down, could not), and kills the
  worker's process group: any compiler the job started, and itself. The signal alone would
  leave the worker's children running.
- A process group, not a session. The worker leads its own process group, so Ctrl-C in a
  terminal reaches the parent alone and a kill of the group takes whatever the job started,
  but it stays in the parent's session: Linux's autogroup scheduling shares the CPU fairly
  between sessions, and `nice` only orders processes within one, so a worker in a session of
  its own competed as an equal with every other session's work, and `nice 19` neighbours
  starved its timings (eager 347 µs quiet, 8545 µs beside four nice-19 spinners).
- The parent kills. A job past its deadline has its worker's process group killed; a kill is
  followed by a bounded wait, never an open-ended one. `WorkerPool.close` (also at exit) asks
  idle workers to exit, kills those still there after `CLOSE_GRACE_S`, and kills busy ones.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import pickle
import queue
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from importlib import import_module
from typing import Any

log = logging.getLogger("kope.targets.worker")

_HEADER = struct.Struct("<Q")
STARTUP_TIMEOUT_S = 180.0
# How long an idle worker asked to exit may take before it is killed.
CLOSE_GRACE_S = 2.0
# The longest wait for a SIGKILLed worker to be reaped (one in uninterruptible sleep takes
# longer: it is left to the kernel, not waited for).
KILL_WAIT_S = 5.0
# How often the watchdog checks the worker's parent pid; a pipe that hangs up wakes it at once.
WATCH_INTERVAL_S = 1.0
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Names a worker's scratch directory in its environment: files it writes there (a Triton
# kernel's source) go with the directory, which the parent removes, or the watchdog where the
# parent died first.
SCRATCH_VARIABLE = "KOPE_WORKER_SCRATCH"
SCRATCH_PREFIX = "kope-worker-"
# The phase a job reports while it waits for the machine's timing lock, and the longest wait
# (a holder past its own limit is killed, which releases the lock).
QUEUED = "queued"
QUEUE_WAIT_S = 3600.0
EXIT_ORPHANED = 3  # the worker's exit status when its parent died before it could ask for a signal


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


def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies; exit if it already has."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: %s", os.strerror(ctypes.get_errno()))
    if os.getppid() != parent_pid:
        os._exit(EXIT_ORPHANED)


def _parent_of(pid: int) -> int | None:
    """The parent pid of `pid` from /proc, or None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # The command name may hold spaces and parentheses: the fields follow the last ")".
            return int(stat.read().rpartition(b")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _start_watchdog(parent_fd: int, parent_pid: int) -> subprocess.Popen[bytes]:
    """Start the watchdog of this worker (see the module docstring), in the worker's group.

    The worker keeps the write end of the lifeline open, unused, for as long as it lives; it is
    close-on-exec, so a compiler the job starts does not hold it.
    """
    lifeline_read, _lifeline_write = os.pipe()
    argv = [sys.executable, "-I", "-S", __file__, "watch", str(os.getpid()), str(parent_pid)]
    scratch = os.environ.get(SCRATCH_VARIABLE, "")
    try:
        return subprocess.Popen(
            [*argv, str(parent_fd), str(lifeline_read), scratch],
            pass_fds=(parent_fd, lifeline_read),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
    finally:
        os.close(lifeline_read)


def watch(worker_pid: int, parent_pid: int, parent_fd: int, lifeline_fd: int, scratch: str) -> None:
    """The watchdog: wait until the parent or the worker is gone, then kill the worker, remove
    its scratch directory, and kill the worker's process group, this process included."""
    poller = select.poll()
    # An empty event mask still reports hang-ups and errors, and reads nothing: the job bytes
    # on the parent's pipe are the worker's.
    poller.register(parent_fd, 0)
    poller.register(lifeline_fd, 0)
    while not poller.poll(WATCH_INTERVAL_S * 1000):
        if _parent_of(worker_pid) not in (parent_pid, None):
            break
    try:
        os.kill(worker_pid, signal.SIGKILL)  # first: it must not write there meanwhile
    except ProcessLookupError:
        pass
    if os.path.basename(scratch).startswith(SCRATCH_PREFIX):
        shutil.rmtree(scratch, ignore_errors=True)
    if os.getpgrp() == worker_pid:  # the worker leads its own group: take its children too
        os.killpg(worker_pid, signal.SIGKILL)
    else:
        os.kill(worker_pid, signal.SIGKILL)


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


class _Starter:
    """Starts every worker from one daemon thread that lives as long as the process, because the
    kernel sends a worker its parent-death signal when the thread that started it ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._requests: queue.SimpleQueue[
            tuple[Callable[[], subprocess.Popen[bytes]], Future[subprocess.Popen[bytes]]]
        ] = queue.SimpleQueue()
        # A forked child has none of the parent's threads: it starts its own on first use.
        os.register_at_fork(after_in_child=self._forget)

    def start(self, launch: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        """Run `launch` on the starter thread and return the process it started."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="kope-worker-starter", daemon=True
                )
                self._thread.start()
        started: Future[subprocess.Popen[bytes]] = Future()
        self._requests.put((launch, started))
        return started.result()

    def _serve(self) -> None:
        while True:
            launch, started = self._requests.get()
            try:
                started.set_result(launch())
            except BaseException as err:
                started.set_exception(err)

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._thread = None
        self._requests = queue.SimpleQueue()


_STARTER = _Starter()


class Worker:
    """One worker process and its pipes."""

    def __init__(self, preload: str | None, extra_env: Mapping[str, str] | None = None):
        parent_read, child_write = os.pipe()
        child_read, parent_write = os.pipe()
        self.stderr = tempfile.TemporaryFile()
        # The worker runs kernels an agent wrote: it starts in a scratch directory of its own,
        # with no secrets in its environment.
        self.scratch = tempfile.TemporaryDirectory(
            prefix=SCRATCH_PREFIX, ignore_cleanup_errors=True
        )
        env = {**worker_environment(os.environ), **(extra_env or {})}
        env[SCRATCH_VARIABLE] = self.scratch.name
        argv = [sys.executable, "-m", "kope.targets.worker", str(child_read), str(child_write)]
        argv.append(str(os.getpid()))
        if preload:
            argv.append(preload)
        try:
            # Its own process group in the parent's session (see the module docstring).
            self.proc = _STARTER.start(
                lambda: subprocess.Popen(
                    argv,
                    pass_fds=(child_read, child_write),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=self.stderr,
                    env=env,
                    cwd=self.scratch.name,
                    process_group=0,
                )
            )
        except BaseException:
            for fd in (parent_read, parent_write):
                os.close(fd)
            self.stderr.close()
            self.scratch.cleanup()
            raise
        finally:
            os.close(child_read)
            os.close(child_write)
        self.read_fd, self.write_fd = parent_read, parent_write
        self.ready = False
        self.killed = False  # a killed worker serves no job, even if not yet reaped

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
                    # Waiting for another job's timing to end is no fault of this job: the
                    # wait does not count against its limit, which starts again after it.
                    if value == QUEUED:
                        deadline = time.monotonic() + QUEUE_WAIT_S
                    elif phase == QUEUED:
                        deadline = time.monotonic() + timeout_s
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
        except BaseException:
            # Interrupted (KeyboardInterrupt): the job may still run and answer a later call.
            self.kill()
            raise

    def _death_note(self) -> str:
        try:
            code: int | None = self.proc.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        if code is None:
            reason = f"worker did not exit within {KILL_WAIT_S:g} s of SIGKILL"
        elif code < 0:
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
        return not self.killed and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the worker's process group (what its job started, its watchdog) and reap the
        worker, waiting at most `KILL_WAIT_S`."""
        # Only while the worker is unreaped is the group's number surely still its own; after
        # a reaped worker, the watchdog has taken the group down.
        if self.proc.returncode is not None:
            return
        self.killed = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            log.warning(
                "worker %d is not gone %g s after SIGKILL; not waiting for it",
                self.proc.pid,
                KILL_WAIT_S,
            )

    def ask_to_exit(self) -> None:
        """Ask an idle worker to exit once it reads the request (`close` waits for it)."""
        if self.alive:
            try:
                _send(self.write_fd, None)
            except OSError:
                pass

    def close(self, deadline: float | None = None) -> None:
        """Wait until `deadline` (monotonic) for the worker to exit, kill it if it has not, and
        release its pipes."""
        if deadline is not None and self.proc.returncode is None:
            try:
                self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.stderr.close()
        self.scratch.cleanup()


# Environment variables a worker never sees: credentials of any service (an LLM endpoint's
# key above all). A kernel that reads its environment finds nothing worth sending.
_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")


def worker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a worker starts with: the caller's, less secrets and `KOPE_LOG`."""
    return {
        name: value
        for name, value in environ.items()
        if name != "KOPE_LOG" and not any(word in name.upper() for word in _SECRET_WORDS)
    }


# A worker running code an agent wrote (a Triton kernel, its launcher) may not grow past this
# share of the machine's memory: a kernel that allocates without bound takes down its
# worker, not the machine.
MEMORY_SHARE = 0.75
# Nor write files larger than this (a kernel has no business writing any).
FILE_LIMIT_BYTES = 1 << 30


def limit_resources() -> None:
    """Bound this worker's memory and file writes, and drop core dumps (lowering a limit is
    always permitted)."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return
    for limit, value in (
        (resource.RLIMIT_AS, int(pages * size * MEMORY_SHARE)),
        (resource.RLIMIT_FSIZE, FILE_LIMIT_BYTES),
        (resource.RLIMIT_CORE, 0),
    ):
        soft, hard = resource.getrlimit(limit)
        wanted = value if hard == resource.RLIM_INFINITY else min(value, hard)
        if soft == resource.RLIM_INFINITY or soft > wanted:
            resource.setrlimit(limit, (wanted, hard))


class WorkerPool:
    """A persistent pool of isolated workers; dead or hung workers are replaced."""

    def __init__(
        self, size: int = 1, preload: str | None = None, env: Mapping[str, str] | None = None
    ):
        self.size = max(1, size)
        self.preload = preload
        self.env = dict(env or {})  # set in each worker's environment from its start
        self._idle: list[Worker] = []
        self._workers: set[Worker] = set()  # idle and busy
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
            worker = Worker(self.preload, self.env)
        except BaseException:
            with self._cond:
                self._started -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._workers.add(worker)
        return worker

    def _release(self, worker: Worker) -> None:
        with self._cond:
            if worker.alive and not self._closed:
                self._idle.append(worker)
            else:
                worker.close()
                self._workers.discard(worker)
                self._started -= 1
            self._cond.notify()

    def close(self) -> None:
        """Stop every worker: idle ones are asked to exit and killed after `CLOSE_GRACE_S`,
        busy ones are killed at once (their calls end as crashes)."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            busy = [w for w in self._workers if w not in idle]
            self._workers.difference_update(idle)
            self._cond.notify_all()
        for worker in busy:
            worker.kill()  # its pipes are its caller's to close (`_release`)
        for worker in idle:
            worker.ask_to_exit()
        deadline = time.monotonic() + CLOSE_GRACE_S
        for worker in idle:
            worker.close(deadline)


def main(argv: list[str]) -> None:
    """The worker: `argv` is the pipes' fds, the parent's pid, and optionally a module to import."""
    read_fd, write_fd, parent_pid = int(argv[1]), int(argv[2]), int(argv[3])
    _die_with_parent(parent_pid)
    watchdog = _start_watchdog(read_fd, parent_pid)
    if len(argv) > 4:
        import_module(argv[4])  # warm the imports the jobs need before reporting ready
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _serve(read_fd, write_fd)
    # Held, not waited for: the watchdog sees this process go and ends itself.
    log.debug("worker done; watchdog %d follows", watchdog.pid)


if __name__ == "__main__":
    if sys.argv[1:2] == ["watch"]:
        worker_pid, parent_pid, parent_fd, lifeline_fd = (int(arg) for arg in sys.argv[2:6])
        watch(worker_pid, parent_pid, parent_fd, lifeline_fd, scratch=sys.argv[6])
    else:
        main(sys.argv)
