"""`kope precompile` and inline optimization from torch.compile."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest
import torch

import kope
from kope.frontend.report import shorten
from kope.memory.schema import AttemptRecord
from kope.memory.store import ExperienceStore
from kope.tools.cli import format_report
from kope.tools.precompile import Progress, repro_commands
from kope.vocabulary.evidence import SOURCE_AGENT, SOURCE_GRAPH

MODEL = """
import torch

class Model(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(n, n) / n)

    def forward(self, x):
        return torch.softmax(x @ self.w, dim=-1)

def get_inputs():
    return [torch.randn(16, 32)]

def get_init_inputs():
    return [32]
"""

REPORT_KEYS = {
    "key",
    "op",
    "winner",
    "verified",
    "attempts",
    "eager_us",
    "reference_us",
    "best_us",
    "speedup_vs_eager",
    "speedup_vs_reference",
    "timing_quality",
    "clean_rounds",
    "rounds",
}
SUMMARY_KEYS = {
    "operators",
    "pass_rate",
    "geomean_speedup_vs_eager",
    "geomean_speedup_vs_reference",
    "tokens",
}


def _precompile(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["kope", "precompile", *args], capture_output=True, text=True, timeout=900
    )


def _agent_attempts(store: Path) -> int:
    """How many of the agent's proposals `store` holds (confirmations aside)."""
    opened = ExperienceStore(store)
    return sum(
        1
        for t in opened.tasks()
        for a in opened.attempts(t.key)
        if a.source == SOURCE_AGENT and a.confirms is None
    )


def _graph_attempts(store: Path) -> list[AttemptRecord]:
    """The whole-graph decisions recorded in `store`."""
    opened = ExperienceStore(store)
    return [a for t in opened.tasks() for a in opened.attempts(t.key) if a.source == SOURCE_GRAPH]


def test_precompile_reports_and_resumes(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    store, report = tmp_path / "store", tmp_path / "report.json"
    args = [
        str(model),
        "--target",
        "cpu",
        "--agent",
        "heuristic",
        "--budget",
        "2",
        "--store",
        str(store),
        "--report",
        str(report),
    ]
    first = _precompile(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    data = json.loads(report.read_text())
    assert len(data["operators"]) == 2  # the matmul and the softmax
    for row in data["operators"]:
        assert REPORT_KEYS <= set(row)
        assert row["winner"] in ("eager", "reference", "agent")
        assert 1 <= row["attempts"] <= 2
    assert SUMMARY_KEYS <= set(data["summary"])
    assert data["summary"]["operators"] == 2 and data["summary"]["tokens"] == 0
    assert "pass rate" in first.stdout
    # The model's graph is decided too, and recorded, clean or not (this machine may be busy).
    (graph,) = data["graphs"]
    assert "graph 0: " in first.stdout
    graphs = _graph_attempts(store)
    assert len(graphs) == 1 and graphs[0].config is not None
    assert graphs[0].config["unsure"] == (not graph["clean"])
    attempts = ExperienceStore(store).stats()["attempts"]
    proposals = _agent_attempts(store)
    second = _precompile(*args)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "already optimized" in second.stderr
    for proc in (first, second):  # stderr is a pipe here: plain lines, no terminal control
        assert "\x1b" not in proc.stderr and "\r" not in proc.stderr
    # Nothing redone (compiling the model may confirm a figure a busy machine disturbed), but
    # a graph decision the machine disturbed, which is timed again.
    assert _agent_attempts(store) == proposals
    assert len(_graph_attempts(store)) == (1 if graph["clean"] else 2)

    # --remeasure re-times every operator's stored choice: new records, each with its quality
    # (clean or contaminated: this machine may be busy, so the test does not ask which).
    third = _precompile(*args, "--remeasure")
    assert third.returncode == 0, third.stderr[-3000:]
    again = ExperienceStore(store)
    assert again.stats()["attempts"] > attempts
    for row in json.loads(report.read_text())["operators"]:
        assert row["timing_quality"] in ("clean", "contaminated", "unknown")
        assert 0 <= row["clean_rounds"] <= row["rounds"]
        latest = again.attempts(row["key"])[-1]
        assert latest.timing_quality in ("clean", "contaminated", "unknown")
        assert latest.confirms is not None or latest.source in ("reference", "eager")


def test_precompile_names_a_broken_model_file(tmp_path: Path) -> None:
    model = tmp_path / "broken.py"
    model.write_text("def get_inputs(:\n")
    proc = _precompile(str(model), "--store", str(tmp_path / "s"))
    assert proc.returncode == 2
    assert str(model) in proc.stderr and "SyntaxError" in proc.stderr


def test_precompile_rejects_unknown_agent(tmp_path: Path) -> None:
    proc = _precompile("mlp", "--agent", "oracle", "--store", str(tmp_path))
    assert proc.returncode == 2 and "heuristic, llm" in proc.stderr


def test_torch_compile_optimizes_unseen_operators_inline(tmp_path: Path) -> None:
    def f(x):
        return torch.tanh(x * 3) * x

    x = torch.randn(32, 64)
    store = tmp_path / "store"
    kope.reset_report()
    with torch.no_grad():
        compiled = torch.compile(
            f, backend="kope", options={"store": str(store), "optimize": True, "budget": 2}
        )
        torch.testing.assert_close(compiled(x), f(x))
    attempts = [
        a for t in ExperienceStore(store).tasks() for a in ExperienceStore(store).attempts(t.key)
    ]
    assert any(a.source == "agent" for a in attempts)
    assert kope.report().tasks and kope.report().tasks[0].kernel in ("eager", "reference", "agent")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


LABEL = "aten.addmm(f32[128], f32[16x64], f32[64x128], beta=1, alpha=1, more=[1, 2, 3, 4])"


def test_progress_on_a_pipe_is_plain_lines() -> None:
    stream = io.StringIO()
    bar = Progress(2, stream=stream)
    bar.update(LABEL, "attempt 1/2: 1.10x")
    bar.finish(LABEL, "agent 1.10x eager")
    bar.finish("aten.relu(f32[4])", "already optimized")
    bar.close()
    text = stream.getvalue()
    assert "\x1b" not in text and "\r" not in text  # no terminal control in a log
    lines = text.splitlines()
    assert lines[1] == "[2/2] aten.relu(f32[4]): already optimized"
    shown = lines[0].split("] ", 1)[1].split(": agent", 1)[0]
    assert shown.endswith("…") and LABEL.startswith(shown[:-1])
    assert shown[:-1].endswith(("]", "(", "1")), shown  # cut after a whole argument


def test_progress_on_a_terminal_uses_a_bar_and_still_reports_each_operator() -> None:
    stream = _Terminal()
    bar = Progress(1, stream=stream)
    bar.update(LABEL, "attempt 1/2")
    bar.finish(LABEL, "eager 1.00x eager")
    bar.close()
    assert "eager 1.00x eager" in stream.getvalue()


def test_disabled_progress_writes_nothing() -> None:
    stream = io.StringIO()
    bar = Progress(1, stream=stream, enabled=False)
    bar.finish(LABEL, "done")
    bar.close()
    assert stream.getvalue() == ""


@pytest.mark.parametrize("width", [12, 20, 30, 45, 60])
def test_labels_are_cut_at_an_argument_boundary(width: int) -> None:
    short = shorten(LABEL, width)
    assert len(short) <= width and short.endswith("…")
    kept = short[:-1]
    assert LABEL.startswith(kept)
    assert LABEL[len(kept)] in ",( " or kept.endswith("("), short


def test_failed_pipelines_reach_the_report_with_their_command() -> None:
    command = "kope-opt --pass-pipeline='builtin.module(kope-lower-cpu)' /s/repro/lower-x.mlir"
    error = f"lower aten.mm failed:\nkernel.mlir:3:5: error: boom\nreproduce with: {command}"
    attempts = [
        AttemptRecord(task="k", source="agent", verdict="compile_error", error=error),
        AttemptRecord(task="k", source="agent", verdict="compile_error", error=error),
        AttemptRecord(task="k", source="agent", verdict="mismatch", error="max abs err 1"),
    ]
    assert repro_commands(attempts) == [command]
    report = {
        "operators": [
            {
                "label": "aten.mm(f32[4x4], f32[4x4])",
                "winner": "eager",
                "speedup_vs_eager": 1.0,
                "speedup_vs_reference": None,
                "attempts": 3,
                "verdicts": {"compile_error": 2},
                "repro": [command],
            }
        ],
        "summary": {
            "operators": 1,
            "pass_rate": 0.0,
            "geomean_speedup_vs_eager": 1.0,
            "geomean_speedup_vs_reference": None,
            "agent_wins": 0,
            "tokens": 0,
            "wall_s": 1.0,
        },
    }
    text = format_report(report)
    assert command in text
    assert "pass rate 0% (the share of operators with at least one verified agent kernel)" in text
    # What sped up is said before the pass rate, and no winner is said in words.
    assert text.index("agent wins 0") < text.index("pass rate")
    assert "no agent kernel won" in text


def test_precompile_optimizes_a_fast_paths_parts() -> None:
    """A model whose only compute operator is a fused fast path: its decomposition's
    operators are what precompile optimizes (so that the backend can choose between the fast
    path whole and its parts from evidence), and the fast path is listed as run eagerly by
    default, with the reason."""
    from kope.frontend.compiler import target_for
    from kope.tools.precompile import trace
    from kope.tools.zoo import ZOO

    model, inputs = ZOO["encoder_layer"]()
    tasks, eager = trace(model, inputs, target_for("cpu", 1, 60.0))
    ops = {t.op for t in tasks}
    # The residual add and layer norm fused, the linear and its relu (kope.frontend.partition).
    assert {"aten.addmm.default", "aten.add.Tensor+aten.layer_norm.default"} <= ops
    assert "aten.addmm.default+aten.relu.default" in ops
    # Its attention runs as one kernel (kope.frontend.rewrites).
    assert "aten.bmm.default" not in ops
    ((op, label, reason),) = eager
    assert op == "aten._transformer_encoder_layer_fwd.default"
    assert label.startswith("aten._transformer_encoder_layer_fwd(2x16x64xf32")  # its shapes
    assert "fused eager fast path" in reason and "kope precompile optimizes them" in reason


def test_an_operator_another_process_is_optimizing_is_waited_for(tmp_path) -> None:
    """Two precompiles into one store made the same proposals side by side (an operator got 4
    agent attempts at budget 2). While another process holds an operator's lock, precompile
    waits for it, records nothing meanwhile, and then optimizes (or finds the work done)."""
    import threading

    from kope.memory.store import ExperienceStore
    from kope.targets.cpu import CpuTarget
    from kope.tools.precompile import precompile, trace_tasks
    from kope.tuner.optimize import Budget

    model, inputs = torch.nn.ReLU(), (torch.randn(32, 64),)
    (task,) = trace_tasks(model, inputs, CpuTarget())
    store = ExperienceStore(tmp_path / "store")
    other = ExperienceStore(tmp_path / "store").task_lock(task.key)  # another process's
    other.acquire()
    done: list[dict] = []
    run = threading.Thread(
        target=lambda: done.append(
            precompile(
                model,
                inputs,
                target=CpuTarget(),
                store=store,
                budget=Budget(attempts=1),
                progress=False,
            )
        )
    )
    run.start()
    run.join(timeout=10.0)  # unlocked, it records its first attempts in about 2 s
    store.refresh()
    assert run.is_alive() and not store.attempts(task.key), "it did not wait"
    other.release()
    run.join(timeout=300)
    assert done and done[0]["complete"] and store.attempts(task.key)
