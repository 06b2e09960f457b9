"""Precompiling on a Ray cluster: each distinct operator is a Ray task on some node, and all
experience comes back to the driver's one store.

The driver stays the store's single writer. It sends each task what the loop reads there —
the store's records at dispatch (the operator's own earlier attempts, to resume; everyone
else's, for retrieval and transfer), put once into Ray's object store and shared — and the
task runs the unchanged loop (`kope.tuner.optimize.optimize_task`) on a scratch copy of them on
its node. Every event the loop emits (a task seen, an attempt evaluated, a choice made)
streams back through a Ray queue as it happens and is recorded by the driver's `Recorder`,
so a lost node loses only what was in flight, and the store's durability rules hold as on
one machine.

- **Keys.** A task keys its operator by the target key of the node it runs on: a node with
  other hardware than the driver's records under its own key, never mixed in.
- **Devices.** A task of a Triton target asks for one of its devices (Ray's `GPU`, the `NPU`
  resource of Ascend hosts) when the cluster has any (`device_request`), else it verifies
  under the interpreter on a CPU node.
- **Threads.** Ray sets `OMP_NUM_THREADS` to a task's CPU request; a task requests the
  threads it measures with (`threads`, default 1) and sets torch's and OpenMP's counts to
  them, so each figure claims the threads it ran with. On a node, candidates of several
  tasks may build and verify at once, but timings take the node's timing lock
  (`kope.targets.evaluation`), so two timings never share cores.
- **Faults.** A task whose worker or node dies is dispatched again (at most `RETRIES`
  times) with the store as it is then, so the rerun resumes from what came back; nothing
  acknowledged is lost. Ctrl-C cancels the cluster's tasks and shuts down a cluster KOPE
  started.
- **Secrets.** An LLM agent's key reaches tasks through Ray's runtime environment
  (`env_vars`), never a file or the store.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kope.core.errors import KopeError
from kope.core.task import Task
from kope.memory.schema import AttemptRecord, TaskRecord
from kope.memory.store import ExperienceStore
from kope.targets import target_class
from kope.tuner.optimize import Budget, TaskSummary
from kope.vocabulary.events import Event, TaskSeen
from kope.vocabulary.registry import TARGETS

log = logging.getLogger("kope.cluster")

# Dispatches of one operator after the first, when its worker or node dies.
RETRIES = 2
# Environment variables forwarded to tasks: the LLM agent's endpoint, model and key.
# What a task on another node needs from this process's environment: the LLM endpoint, and
# the GPU architectures CUDA kernels are compiled for (`kope.targets.device_compile`).
FORWARDED_ENV = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "KOPE_LLM_MODEL",
    "KOPE_LLM_API_KEY",
    "KOPE_CUDA_ARCH",
)
CLUSTER_CHOICES = "ray (a local cluster KOPE starts), ray://HOST:PORT, or auto (RAY_ADDRESS)"


class ClusterError(KopeError):
    """The cluster cannot be reached or used."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ClusterError(
            "--cluster needs Ray, which is an optional extra: pip install 'kope[ray]'"
        ) from None
    return ray


@contextmanager
def connected(spec: str) -> Iterator[Any]:
    """Ray, connected to the cluster `spec` names; a local cluster started here is shut
    down on exit (one KOPE joined is left running)."""
    ray = _ray()
    env = {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}
    runtime_env = {"env_vars": env} if env else None
    if ray.is_initialized():
        yield ray
        return
    if spec == "ray":
        kwargs: dict[str, Any] = {"include_dashboard": False}
    elif spec == "auto" or spec.startswith("ray://"):
        if spec == "auto" and not os.environ.get("RAY_ADDRESS"):
            raise ClusterError("--cluster auto joins RAY_ADDRESS, which is not set")
        kwargs = {"address": spec}
    else:
        raise ClusterError(f"--cluster {spec!r}: use {CLUSTER_CHOICES}")
    try:
        ray.init(runtime_env=runtime_env, log_to_driver=False, **kwargs)
    except Exception as err:  # ray raises ConnectionError, RuntimeError, ValueError, ...
        raise ClusterError(f"cannot start or join the Ray cluster {spec!r}: {err}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


@dataclass(frozen=True)
class Seed:
    """What a task's scratch store starts from: the driver's records and their texts."""

    records: list[Any]
    artifacts: dict[str, str]  # attempt id -> kernel text
    payloads: list[str]  # reference lowerings of the tasks (artifacts named by TaskRecord)


def seed_of(store: ExperienceStore) -> Seed:
    store.refresh()
    records, artifacts, payloads = [], {}, []
    for record in store.iter_records():
        records.append(record)
        if isinstance(record, AttemptRecord) and record.artifact:
            text = store.get_artifact(record.artifact)
            if text is not None:
                artifacts[record.id] = text
        elif isinstance(record, TaskRecord) and record.payload:
            text = store.get_artifact(record.payload)
            if text is not None:
                payloads.append(text)
    return Seed(records, artifacts, payloads)


@dataclass(frozen=True)
class Job:
    """One operator for one Ray task (its fx nodes stay with the driver)."""

    task: Task
    target: str
    timeout_s: float
    agent: str
    agent_config: dict[str, Any]
    budget: Budget
    seed: int
    threads: int


def optimize_remote(job: Job, seed: Seed, queue: Any) -> TaskSummary:
    """Run the loop on one operator on this node; every event goes to `queue` as it happens."""
    import torch

    from kope.agents import make_agent
    from kope.frontend.compiler import target_for
    from kope.memory.recorder import Recorder
    from kope.passes.keys import task_key
    from kope.targets.jit import set_openmp_threads
    from kope.tuner.optimize import optimize_task
    from kope.vocabulary.events import Events

    torch.set_num_threads(job.threads)
    set_openmp_threads(job.threads)
    # One target per Ray worker process, kept for its next tasks: starting a target's
    # isolated worker (torch and torch-mlir imports) costs seconds, once.
    target = target_for(job.target, 1, job.timeout_s)
    # Keyed for this node's hardware: a node unlike the driver's records under its own key.
    task = replace(job.task, key=task_key(job.task.payload, target.key()))
    with tempfile.TemporaryDirectory(prefix="kope-cluster-") as scratch:
        store = ExperienceStore(Path(scratch))
        for text in seed.payloads:
            store.put_artifact(text, sync=False)
        store.add_records(list(seed.records), dict(seed.artifacts))
        agent = make_agent(job.agent, seed=job.seed, **job.agent_config)
        try:
            events = Events(Recorder(store), queue.put)
            return optimize_task(
                task, target, store, agent, job.budget, seed=job.seed, events=events
            )
        finally:
            agent.close()


def run_tasks(
    ray: Any,
    jobs: list[Job],
    store: ExperienceStore,
    on_event: Callable[[Task, Event], None],
    on_done: Callable[[Task, TaskSummary | None, str], None],
) -> None:
    """Dispatch `jobs` over the cluster; events are recorded into `store` (by `on_event`, on
    this thread) as they arrive, and `on_done` hears each operator's summary (None if it
    failed every dispatch, with the reason)."""
    from ray.util.queue import Empty, Queue

    queue = Queue()
    remote = ray.remote(optimize_remote)
    by_key = {job.task.key: job for job in jobs}
    tasks_of_key: dict[str, Task] = {}
    pending: dict[Any, tuple[Job, int]] = {}
    seed_ref = ray.put(seed_of(store))

    devices = device_request(jobs[0].target if jobs else "", ray.cluster_resources())

    def dispatch(job: Job, tries: int, seed: Any) -> None:
        options = {"num_cpus": job.threads, "max_retries": 0, **devices}
        ref = remote.options(**options).remote(job, seed, queue)
        pending[ref] = (job, tries)

    for job in jobs:
        dispatch(job, 0, seed_ref)

    def drain() -> None:
        while True:
            try:
                event = queue.get(block=False)
            except Empty:
                return
            if isinstance(event, TaskSeen):
                job = _job_of(event, by_key, tasks_of_key)
                if job is not None:
                    tasks_of_key[event.key] = job.task
            task = tasks_of_key.get(getattr(event, "task", getattr(event, "key", "")))
            if task is not None:
                on_event(task, event)

    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
            drain()
            for ref in done:
                job, tries = pending.pop(ref)
                try:
                    summary = ray.get(ref)
                except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as err:
                    if tries < RETRIES:
                        log.warning(
                            "%s: its worker died (%s); dispatching it again",
                            job.task.label,
                            type(err).__name__,
                        )
                        time.sleep(0.5)
                        drain()
                        dispatch(job, tries + 1, ray.put(seed_of(store)))
                        continue
                    on_done(job.task, None, f"its worker died {tries + 1} times: {err}")
                    continue
                except ray.exceptions.RayTaskError as err:
                    cause = err.cause if getattr(err, "cause", None) is not None else err
                    if isinstance(cause, KopeError):
                        raise cause from None
                    on_done(job.task, None, f"{type(cause).__name__}: {cause}")
                    continue
                drain()
                on_done(job.task, summary, "")
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    finally:
        drain()
        queue.shutdown()


def device_request(target: str, available: dict[str, float]) -> dict[str, Any]:
    """The device a task of `target` asks Ray for: one of the target's devices when the
    cluster has any (its kernels then run and are timed there), else none (they are verified
    under Triton's interpreter on CPU nodes, untimed)."""
    # The target names its device's Ray resource (`Target.ray_resource`): Ray's own GPU, or
    # one a host declares (`ray start --resources '{"NPU": 8}'`).
    resource = target_class(target).ray_resource if target in TARGETS else None
    if resource is None or available.get(resource, 0) < 1:
        return {}
    return {"num_gpus": 1} if resource == "GPU" else {"resources": {resource: 1}}


def _job_of(event: TaskSeen, by_key: dict[str, Job], found: dict[str, Task]) -> Job | None:
    """The job a node's TaskSeen belongs to: by key, or by workload when the node keyed the
    operator for other hardware."""
    if event.key in by_key:
        return by_key[event.key]
    return next((j for j in by_key.values() if j.task.workload == event.workload), None)
