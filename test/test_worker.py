"""The worker pool: crashes and hangs of a job are outcomes, and the pool recovers; a worker never
outlives its parent, nor a job its time limit.

The tests that kill a parent start a real one (`PARENT`, a small script that runs one job in a
pool) and kill it while its job hangs; every pid a test learns is killed in a `finally`, so a
failing test leaves nothing running.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kope.targets.worker import Outcome, WorkerPool

HERE = Path(__file__).parent
PR_SET_PDEATHSIG = 1
# How long a dead parent's worker may take to go: the watchdog looks twice a second.
GONE_WITHIN_S = 5.0

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc and uses prctl"
)


# -- jobs (run in the worker: this module is imported there by name) ----------------------------


def echo(payload: Any, phase: Callable[[str], None]) -> Any:
    phase("work")
    return payload * 2


def crash(payload: Any, phase: Callable[[str], None]) -> None:
    phase("crashing")
    os.abort()


def hang(payload: Any, phase: Callable[[str], None]) -> None:
    phase("sleeping")
    time.sleep(600)


def fail(payload: Any, phase: Callable[[str], None]) -> None:
    raise ValueError("bad payload")


def surroundings(payload: Any, phase: Callable[[str], None]) -> tuple[str, list[str]]:
    return os.getcwd(), sorted(os.environ)


def pid(payload: Any, phase: Callable[[str], None]) -> int:
    return os.getpid()


def _announce(path: str, *pids: int) -> None:
    """Write the pids the test must watch (atomically: the test polls for the file), and the
    worker's scratch directory beside them, with a file in it as a Triton kernel leaves."""
    (Path(os.getcwd()) / "kernel.py").write_text("# a kernel's source\n")
    Path(path + ".cwd").write_text(os.getcwd())
    Path(path + ".tmp").write_text(" ".join(map(str, pids)))
    os.replace(path + ".tmp", path)


def spin(path: str, phase: Callable[[str], None]) -> None:
    """Keep a core busy, as a long build does."""
    phase("build")
    _announce(path, os.getpid())
    while True:
        pass


def hang_with_child(path: str, phase: Callable[[str], None]) -> None:
    """Start a child of the worker (as a build may start a compiler), then hang."""
    phase("build")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    _announce(path, os.getpid(), child.pid)
    time.sleep(600)


def hang_holding_gil(path: str, phase: Callable[[str], None]) -> None:
    """Hang in native code that holds the GIL, as MLIR's PassManager.run and the JIT do, with
    the parent-death signal taken away: only a watchdog that needs no GIL can end this."""
    phase("build")
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0)
    _announce(path, os.getpid())
    ctypes.PyDLL(None).sleep(600)  # PyDLL keeps the GIL through the call


# -- helpers ------------------------------------------------------------------------------------

# The parent: a pool of one worker running one job that never ends, called from the main thread
# or from a thread of a pool as `kope precompile --workers N` does; SIGINT as in a terminal.
PARENT = """
import signal, sys
from concurrent.futures import ThreadPoolExecutor
from kope.targets.worker import WorkerPool
signal.signal(signal.SIGINT, signal.default_int_handler)
pool = WorkerPool(1)
job, path, caller = sys.argv[1:]
if caller == "thread":
    with ThreadPoolExecutor(2) as threads:
        threads.submit(pool.call, job, path, 600).result()
else:
    pool.call(job, path, 600)
"""


@pytest.fixture(autouse=True)
def _jobs_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers find this module's jobs as `test_worker:<name>`."""
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)


def gone(process: int) -> bool:
    """True once `process` has exited; a zombie that no reaper has collected runs nothing."""
    try:
        stat = Path(f"/proc/{process}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def still_running(pids: list[int], within_s: float) -> list[int]:
    """The `pids` that have not exited `within_s` seconds from now."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and not all(gone(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if not gone(p)]


def announced(path: Path, within_s: float = 60.0) -> list[int]:
    """The pids a job wrote to `path`."""
    deadline = time.monotonic() + within_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"the job wrote no pids to {path} within {within_s:g} s")
        time.sleep(0.05)
    return [int(p) for p in path.read_text().split()]


@pytest.fixture
def reaper() -> Iterator[list[int]]:
    """Pids to SIGKILL at the end of the test, whatever happened."""
    pids: list[int] = []
    yield pids
    for process in pids:
        if not gone(process):
            try:
                os.kill(process, signal.SIGKILL)
            except ProcessLookupError:
                pass


# -- tests --------------------------------------------------------------------------------------


def test_workers_start_in_a_scratch_directory_without_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kernels an agent wrote run in the worker: it sees no credentials, and its working
    directory is its own, removed with it."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-for-workers")
    monkeypatch.setenv("SOME_SERVICE_TOKEN", "t")
    pool = WorkerPool(1)
    outcome = pool.call("test_worker:surroundings", None, 120)
    pool.close()
    assert outcome.ok, outcome.detail
    cwd, names = outcome.value
    assert "OPENAI_API_KEY" not in names and "SOME_SERVICE_TOKEN" not in names
    assert "PATH" in names
    assert Path(cwd).name.startswith("kope-worker-") and cwd != os.getcwd()
    assert not Path(cwd).exists()


def test_pool_survives_crash_hang_and_error() -> None:
    pool = WorkerPool(1)
    try:
        here = "test_worker"
        assert pool.call(f"{here}:echo", 21, 60).value == 42
        crashed = pool.call(f"{here}:crash", None, 60)
        assert crashed.failure == "crash" and crashed.phase == "crashing"
        assert "SIGABRT" in crashed.detail
        start = time.monotonic()
        hung = pool.call(f"{here}:hang", None, 1.0)
        assert hung.failure == "timeout" and hung.phase == "sleeping"
        assert time.monotonic() - start < 30
        failed = pool.call(f"{here}:fail", None, 60)
        assert failed.failure == "error" and "bad payload" in failed.detail
        assert pool.call(f"{here}:echo", 1, 60).value == 2
    finally:
        pool.close()


# A parent whose pool threads wait for their jobs does not exit on SIGINT (ThreadPoolExecutor
# joins them), so SIGINT is sent to a parent calling from its main thread.
@pytest.mark.parametrize(
    ("job", "how", "caller"),
    [
        ("spin", signal.SIGKILL, "thread"),
        ("spin", signal.SIGTERM, "thread"),
        ("spin", signal.SIGINT, "main"),
        ("hang_with_child", signal.SIGKILL, "thread"),
        ("hang_holding_gil", signal.SIGKILL, "thread"),
    ],
)
def test_worker_dies_with_its_parent(
    job: str, how: signal.Signals, caller: str, tmp_path: Path, reaper: list[int]
) -> None:
    pids = tmp_path / "pids"
    argv = [sys.executable, "-c", PARENT, f"test_worker:{job}", str(pids), caller]
    parent = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
    reaper.append(parent.pid)
    try:
        workers = announced(pids)
        reaper.extend(workers)
        scratch = Path(Path(f"{pids}.cwd").read_text())
        assert scratch.name.startswith("kope-worker-") and (scratch / "kernel.py").exists()
        parent.send_signal(how)
        parent.wait(timeout=30)
        assert still_running(workers, GONE_WITHIN_S) == []
        # Removed by the watchdog where the parent could not (SIGKILL, or a Ray worker shut
        # down): a day of tests had left 118 of them in /tmp.
        deadline = time.monotonic() + GONE_WITHIN_S
        while scratch.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not scratch.exists()
    finally:
        parent.kill()
        parent.wait()


def test_timed_out_job_has_its_worker_killed_and_replaced(
    tmp_path: Path, reaper: list[int]
) -> None:
    pool = WorkerPool(1)
    try:
        pids = tmp_path / "pids"
        start = time.monotonic()
        late = pool.call("test_worker:hang_with_child", str(pids), 3.0)
        workers = announced(pids, within_s=0)
        reaper.extend(workers)
        assert late.failure == "timeout" and late.phase == "build"
        assert time.monotonic() - start < 20  # killed, not waited for
        assert still_running(workers, GONE_WITHIN_S) == []
        assert pool.call("test_worker:pid", None, 60).value not in workers
    finally:
        pool.close()


def test_close_kills_a_busy_worker(tmp_path: Path, reaper: list[int]) -> None:
    pool = WorkerPool(1)
    outcomes: list[Outcome] = []
    pids = tmp_path / "pids"
    busy = threading.Thread(
        target=lambda: outcomes.append(pool.call("test_worker:spin", str(pids), 600)), daemon=True
    )
    busy.start()
    try:
        workers = announced(pids)
        reaper.extend(workers)
        pool.close()
        assert still_running(workers, GONE_WITHIN_S) == []
        busy.join(timeout=10)
        assert not busy.is_alive() and outcomes[0].failure == "crash"
    finally:
        pool.close()
        busy.join(timeout=10)


def test_worker_outlives_the_thread_that_started_it() -> None:
    """The parent-death signal fires when the *thread* that started a worker ends: a worker
    first used from a short-lived thread must still serve the next job."""
    pool = WorkerPool(1)
    try:
        first: list[int] = []
        starter = threading.Thread(
            target=lambda: first.append(pool.call("test_worker:pid", None, 60).value)
        )
        starter.start()
        starter.join()
        time.sleep(0.5)  # time for a parent-death signal to land
        again = pool.call("test_worker:pid", None, 60)
        assert again.ok and again.value == first[0]
    finally:
        pool.close()


def test_worker_shares_the_parents_session_and_cpu_share() -> None:
    """A worker in a session of its own gets an autogroup of its own, which Linux schedules as
    an equal of every other session: `nice 19` neighbours in the user's session then starved
    its timings. It leads its own process group (a kill takes its children; Ctrl-C does not
    reach it) inside the parent's session."""
    pool = WorkerPool(1)
    try:
        pid = pool.call("test_worker:pid", None, 60).value
        assert os.getsid(pid) == os.getsid(0)
        assert os.getpgid(pid) == pid != os.getpgid(0)
        autogroup = Path(f"/proc/{pid}/autogroup")
        # Kernels built without autogroup show the file empty; then there is nothing to share.
        if autogroup.exists():
            assert autogroup.read_text() == Path("/proc/self/autogroup").read_text()
    finally:
        pool.close()
