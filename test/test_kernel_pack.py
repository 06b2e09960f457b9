"""A kernel pack: verified Triton kernels exported from a store, run by the runner in an
environment without KOPE (torch and triton alone), and its results recorded back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kope.agents import make_agent
from kope.frontend.partition import partition
from kope.memory.store import ExperienceStore
from kope.targets import get_target
from kope.testing import Reply, ScriptedOpenAIServer
from kope.tools.kernel_pack import export_pack, import_results
from kope.tuner.optimize import Budget, optimize_task
from kope.vocabulary.evidence import VERIFIED

pytest.importorskip("triton")

SOFTMAX = (Path(__file__).parent / "test_triton_target.py").read_text()
SOFTMAX = SOFTMAX.split('SOFTMAX = """\\\n', 1)[1].split('"""', 1)[0]
WRONG = SOFTMAX.replace("e / tl.sum(e, axis=0)", "e")
# The runner runs where KOPE is not installed: these imports fail in its process.
NO_KOPE = (
    "import sys, runpy\n"
    "for name in ('kope', 'torch_mlir', 'rustworkx', 'openai'):\n"
    "    sys.modules[name] = None\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


@pytest.mark.parametrize("name", ["cuda", "ascend"])
def test_a_pack_runs_without_kope_and_its_results_come_back(name: str, tmp_path: Path) -> None:
    target = get_target(name, workers=1, timeout_s=30.0)
    graph = make_fx(lambda x: torch.softmax(x, -1), tracing_mode="fake")(torch.randn(8, 37))
    task = partition(graph, target).tasks[0]
    store = ExperienceStore(tmp_path / "store")
    answers = [Reply(content=f"Decision: rows\n```python\n{k}```\n") for k in (SOFTMAX, WRONG)]
    with ScriptedOpenAIServer(answers) as server:
        agent = make_agent("llm", base_url=server.base_url, model="scripted", max_retries=0)
        optimize_task(task, target, store, agent, Budget(attempts=2))
        agent.close()
    target.close()

    pack = tmp_path / "pack"
    summary = export_pack(store, name, pack)
    assert (summary.tasks, summary.kernels, summary.skipped) == (1, 1, [])  # the wrong one stays
    assert summary.bytes < 1 << 20
    # The runner, in a process where KOPE, torch-mlir, rustworkx and openai cannot be imported.
    shim = tmp_path / "no_kope.py"
    shim.write_text(NO_KOPE)
    done = subprocess.run(
        [sys.executable, str(shim), str(pack / "runner.py"), str(pack), "--timeout-s", "120"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no timed kernels (device: interpreter)" in done.stdout
    results = json.loads((pack / "results.json").read_text())
    assert [r["verdict"] for r in results["results"]] == [VERIFIED]
    assert "reference lowering" in results["results"][0]["oracle"]
    assert "eager on the device" in results["results"][0]["oracle"]

    recorded = import_results(store, pack / "results.json")
    assert len(recorded) == 1 and recorded[0].verdict == VERIFIED
    assert recorded[0].latency_us is None  # the interpreter times nothing
    first = next(a for a in store.attempts(task.key) if a.source == "agent")
    assert recorded[0].transferred_from == first.id
    # The device's record carries the interpreted attempt's configuration, for the cost model
    # of that device (an LLM's kernel has none; the heuristic agent's carry theirs).
    assert recorded[0].config == first.config


def _softmax_pack(tmp_path: Path) -> Path:
    """A CUDA pack of one softmax kernel (tmp_path/pack), from a store it was verified into."""
    target = get_target("cuda", workers=1, timeout_s=30.0)
    graph = make_fx(lambda x: torch.softmax(x, -1), tracing_mode="fake")(torch.randn(8, 37))
    task = partition(graph, target).tasks[0]
    store = ExperienceStore(tmp_path / "store")
    with ScriptedOpenAIServer([Reply(content=f"```python\n{SOFTMAX}```\n")]) as server:
        agent = make_agent("llm", base_url=server.base_url, model="scripted", max_retries=0)
        optimize_task(task, target, store, agent, Budget(attempts=1))
        agent.close()
    target.close()
    pack = tmp_path / "pack"
    export_pack(store, "cuda", pack)
    return pack


def test_a_pack_catches_a_kernel_that_is_wrong_on_the_device(tmp_path: Path) -> None:
    """The runner compares with the stored reference outputs itself: a kernel swapped for a
    wrong one after export is a mismatch there."""
    pack = _softmax_pack(tmp_path)
    kernel = next((pack / "kernels").iterdir())
    kernel.write_text(WRONG)
    done = subprocess.run(
        [sys.executable, str(pack / "runner.py"), str(pack)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((pack / "results.json").read_text())["results"][0]
    assert result["verdict"] == "mismatch" and "reference lowering" in result["error"]


def test_a_kernel_that_hangs_or_raises_costs_only_its_own_result(tmp_path: Path) -> None:
    """The runner's kernels share a child process; one that hangs is killed at its limit and
    one that raises ends its child, and the kernels after each still run, in a new child."""
    pack = _softmax_pack(tmp_path)
    manifest = json.loads((pack / "manifest.json").read_text())
    (good,) = manifest["kernels"]
    shape = "    rows, cols = in0.shape\n"
    hang = SOFTMAX.replace(shape, shape + "    while True:\n        rows = rows + 0\n")
    raises = SOFTMAX.replace(shape, "    rows, cols = in0.shape[5]\n")
    for name, text in (("hang", hang), ("raises", raises)):
        (pack / f"kernels/{name}.py").write_text(text)
    bad = [{**good, "digest": name, "path": f"kernels/{name}.py"} for name in ("hang", "raises")]
    manifest["kernels"] = [bad[0], good, bad[1], good]
    (pack / "manifest.json").write_text(json.dumps(manifest))
    done = subprocess.run(
        [sys.executable, str(pack / "runner.py"), str(pack), "--timeout-s", "30"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((pack / "results.json").read_text())["results"]
    assert [r["verdict"] for r in results] == ["timeout", VERIFIED, "runtime_error", VERIFIED]
    assert "IndexError" in results[2]["error"]
