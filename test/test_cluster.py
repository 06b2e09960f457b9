"""`kope precompile --cluster`: operators fan out over a local Ray cluster the test starts;
the driver records every attempt that streams back, once, and a killed worker's operator is
dispatched again and resumes."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from kope.memory.store import ExperienceStore
from kope.targets import get_target
from kope.tools.precompile import precompile
from kope.tuner.optimize import Budget, is_proposal

ray = pytest.importorskip("ray")
pytest.importorskip("triton")


class Mixed(torch.nn.Module):
    """Operators of different families, so that no operator's experience steers another's
    search: run in parallel or in turn, each sees the same store."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(24)
        self.linear = torch.nn.Linear(24, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The linear between the row ops keeps them three Tasks (norm + softmax would fuse).
        return torch.softmax(self.linear(self.norm(x)), -1)


@pytest.fixture(scope="module")
def cluster() -> Any:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _run(store: ExperienceStore, cluster: str | None, budget: int = 3) -> dict[str, Any]:
    # Interpreted: no timing noise. A limit that a loaded machine does not reach (beside a
    # load on every core, candidates ran past 120 s and the two runs' verdicts differed).
    target = get_target("cuda", workers=1, timeout_s=900.0)
    torch.manual_seed(0)
    model = Mixed().eval()
    report = precompile(
        model,
        (torch.randn(4, 24),),
        target=target,
        store=store,
        budget=Budget(attempts=budget),
        progress=False,
        cluster=cluster,
        task_threads=1,
    )
    target.close()
    return report


def _proposals(store: ExperienceStore) -> dict[str, list[tuple[str, str]]]:
    return {
        t.label: [(a.decision, a.verdict) for a in store.attempts(t.key) if is_proposal(a)]
        for t in store.tasks()
    }


@pytest.fixture(autouse=True)
def _no_device_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """What is compared is the search, not the GPU compiler's work (each kernel compiled for
    two architectures doubles a loaded machine's wall time); the cluster forwards this."""
    monkeypatch.setenv("KOPE_CUDA_ARCH", "none")


def test_the_cluster_gives_what_one_machine_gives(cluster: Any, tmp_path: Path) -> None:
    alone = ExperienceStore(tmp_path / "alone")
    _run(alone, None)
    spread = ExperienceStore(tmp_path / "cluster")
    report = _run(spread, "ray")
    assert _proposals(spread) == _proposals(alone)
    ids = [a.id for t in spread.tasks() for a in spread.attempts(t.key)]
    assert len(ids) == len(set(ids))
    assert all(_proposals(spread).values()) and len(_proposals(spread)) == 3
    assert {r["winner"] for r in report["operators"]} == {"eager"}


def _busy_tasks() -> list[int]:
    """Ray workers running an operator (Ray titles them after the task's function)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if cmdline.startswith("ray::optimize_remote"):
            found.append(int(entry.name))
    return found


def test_a_killed_worker_loses_nothing_acknowledged(cluster: Any, tmp_path: Path) -> None:
    """The killed operator is dispatched again with what came back, and resumes: the run ends
    with the proposals of an undisturbed run, each recorded once."""
    alone = ExperienceStore(tmp_path / "alone")
    _run(alone, None)
    store = ExperienceStore(tmp_path / "store")
    killed: list[int] = []
    done = threading.Event()

    def kill_one_mid_run() -> None:
        # Until the run ends, not for a fixed time: on a loaded machine the first attempt
        # came back after more than two minutes.
        while not done.is_set() and not killed:
            store.refresh()
            # Once some attempt has come back, kill a worker that is still optimizing.
            if any(is_proposal(a) for t in store.tasks() for a in store.attempts(t.key)):
                for pid in _busy_tasks():
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    break
            time.sleep(0.05)

    killer = threading.Thread(target=kill_one_mid_run)
    killer.start()
    try:
        report = _run(store, "ray", budget=3)
    finally:
        done.set()
        killer.join()
    assert killed, "no worker was running an operator to kill"
    assert _proposals(store) == _proposals(alone)
    ids = [a.id for t in store.tasks() for a in store.attempts(t.key)]
    assert len(ids) == len(set(ids))
    assert len(report["operators"]) == 3


def test_without_ray_the_flag_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from kope.tools.cluster import ClusterError, connected

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ClusterError, match=r"pip install 'kope\[ray\]'"):
        with connected("ray"):
            pass


def test_triton_tasks_ask_for_a_device_only_where_the_cluster_has_one() -> None:
    from kope.tools.cluster import device_request

    assert device_request("cuda", {"CPU": 16.0, "GPU": 8.0}) == {"num_gpus": 1}
    assert device_request("ascend", {"CPU": 16.0, "NPU": 8.0}) == {"resources": {"NPU": 1}}
    assert device_request("cuda", {"CPU": 2.0}) == {}  # interpreted on CPU nodes
    assert device_request("cpu", {"CPU": 2.0, "GPU": 1.0}) == {}
