"""The worker pool: crashes and hangs of a job are outcomes, and the pool recovers."""

from __future__ import annotations

import os
import time

from kope.targets.worker import WorkerPool


def echo(payload, phase):
    phase("work")
    return payload * 2


def crash(payload, phase):
    phase("crashing")
    os.abort()


def hang(payload, phase):
    phase("sleeping")
    time.sleep(600)


def fail(payload, phase):
    raise ValueError("bad payload")


def test_pool_survives_crash_hang_and_error(monkeypatch) -> None:
    here_dir = os.path.dirname(__file__)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here_dir, os.environ.get("PYTHONPATH", "")]))
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
