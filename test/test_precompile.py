"""`kope precompile` and inline optimization from torch.compile."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch

import kope
from kope.memory.store import ExperienceStore

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

REPORT_KEYS = {"key", "op", "winner", "verified", "attempts", "eager_us", "reference_us",
               "best_us", "speedup_vs_eager", "speedup_vs_reference"}
SUMMARY_KEYS = {"operators", "pass_rate", "geomean_speedup_vs_eager",
                "geomean_speedup_vs_reference", "tokens"}


def _precompile(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["kope", "precompile", *args], capture_output=True, text=True, timeout=900)


def test_precompile_reports_and_resumes(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    store, report = tmp_path / "store", tmp_path / "report.json"
    args = [str(model), "--target", "cpu", "--agent", "heuristic", "--budget", "2",
            "--store", str(store), "--report", str(report)]
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
    attempts = ExperienceStore(store).stats()["attempts"]
    second = _precompile(*args)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "already optimized" in second.stderr
    assert ExperienceStore(store).stats()["attempts"] == attempts  # nothing redone


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
        compiled = torch.compile(f, backend="kope",
                                 options={"store": str(store), "optimize": True, "budget": 2})
        torch.testing.assert_close(compiled(x), f(x))
    attempts = [a for t in ExperienceStore(store).tasks() for a in ExperienceStore(store).attempts(t.key)]
    assert any(a.source == "agent" for a in attempts)
    assert kope.report().tasks and kope.report().tasks[0].kernel in ("eager", "reference", "agent")
