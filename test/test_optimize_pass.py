"""`kope-optimize`: the agent inside a pipeline, on a model imported whole.

`kope import` writes an MLP as one linalg module cut as the backend cuts it; `kope-opt`
optimizes each Task (the heuristic agent, verified against the Task's own body and timed
against it and eager), applies the winners and lowers to LLVM; the ExecutionEngine runs the
result, which matches eager; and the backend over the same store runs the same kernels.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch_mlir import ir

from kope.memory.standing import winner
from kope.memory.store import ExperienceStore
from kope.passes import pass_class
from kope.targets.jit import JitKernel
from kope.tools.optimize_pass import OptimizeOperators
from kope.vocabulary.evidence import SOURCE_AGENT
from kope.vocabulary.specs import TensorSpec

FACTORY = """
import torch

def mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32)
    ).eval()
    return model, (torch.randn(16, 64),)
"""


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc


def _factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`FACTORY` as module `models` in `tmp_path`, importable by `kope` subprocesses too; its
    `mlp` factory."""
    (tmp_path / "models.py").write_text(FACTORY)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    sys.path.insert(0, str(tmp_path))
    try:
        from models import mlp  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    return mlp


def keyed_functions(text: str) -> dict[str, str]:
    """Each keyed function's `func.func` line (its attributes), by its key."""
    return {
        match.group(1): line
        for line in text.splitlines()
        if line.lstrip().startswith("func.func")
        and (match := re.search(r'kope\.key = "(\w+)"', line))
    }


def applied_attempts(functions: dict[str, str]) -> dict[str, str]:
    """The attempt whose kernel `kope-apply-kernels` put in, by key, for the keyed functions
    whose body it replaced."""
    applied = {}
    for key, line in functions.items():
        if 'kope.kernel = "agent"' in line:
            attempt = re.search(r'kope\.attempt = "([^"]+)"', line)
            assert attempt is not None, line
            applied[key] = attempt.group(1)
    return applied


def test_kope_optimize_is_found_by_name_and_lives_in_the_driver() -> None:
    assert pass_class("kope-optimize") is OptimizeOperators
    assert OptimizeOperators.__module__ == "kope.tools.optimize_pass"


def test_an_imported_model_is_optimized_applied_lowered_and_runs_as_the_backend_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One road from model to kernel: `kope import` cuts the MLP as the backend does, `kope-opt`
    alone optimizes, applies and lowers it, the ExecutionEngine runs it, and the backend over
    the same store compiles the same keys and chooses the same kernels."""
    import kope
    from kope.targets.cpu import CpuTarget
    from kope.tools.precompile import trace_tasks

    mlp = _factory(tmp_path, monkeypatch)
    model, (x,) = mlp()
    source = tmp_path / "mlp.mlir"
    proc = run("kope", "import", "models:mlp", "-o", str(source))
    text = source.read_text()
    assert "func.func @main(%arg0: tensor<16x64xf32>) -> tensor<16x32xf32>" in text
    backend_keys = [task.key for task in trace_tasks(model, (x,), CpuTarget())]
    assert f"{len(backend_keys)} distinct Tasks" in proc.stderr
    assert re.findall(r'kope\.key = "(\w+)"', text) == backend_keys

    store = tmp_path / "store"
    pipeline = (
        f"builtin.module(kope-outline-operators,kope-optimize{{budget=2 store={store}}},"
        f"kope-apply-kernels{{store={store}}})"
    )
    optimized = run("kope-opt", f"--pass-pipeline={pipeline}", str(source)).stdout
    assert "kope_op_" not in optimized  # outlining leaves the backend's cut as it is
    functions = keyed_functions(optimized)
    assert list(functions) == backend_keys
    assert all("speedup_vs_eager = " in line for line in functions.values())
    applied = applied_attempts(functions)
    recorded = ExperienceStore(store)
    attempts = [a for key in backend_keys for a in recorded.attempts(key)]
    assert all(a.eager_us is not None for a in attempts)  # timed against eager, as the backend
    assert any(a.source == SOURCE_AGENT for a in attempts)

    # A second run over the same store makes no new attempt.
    again = run("kope-opt", f"--pass-pipeline={pipeline}", str(source)).stdout
    assert applied_attempts(keyed_functions(again)) == applied
    recorded.refresh()
    assert sum(len(recorded.attempts(key)) for key in backend_keys) == len(attempts)

    # Lowered whole by kope-opt and JIT-compiled, @main computes what eager does.
    lowered = tmp_path / "mlp.llvm.mlir"
    lower = pipeline.removesuffix(")") + ",kope-lower-cpu)"
    run("kope-opt", f"--pass-pipeline={lower}", str(source), "-o", str(lowered))
    module = ir.Module.parse(lowered.read_text(), ir.Context())
    jit = JitKernel(module, [TensorSpec.of(x)], [TensorSpec((16, 32), "float32")])
    with torch.no_grad():
        for inputs in (x, torch.randn(16, 64)):
            torch.testing.assert_close(jit(inputs)[0], model(inputs), rtol=1e-4, atol=1e-5)

    # The backend over the same store: the same keys, and where the pipeline's choice rests on
    # clean figures, the same kernel (a choice on disturbed figures is re-measured at compile).
    kope.reset_report()
    before = {key: len(recorded.attempts(key)) for key in backend_keys}
    with torch.no_grad():
        compiled = torch.compile(model, backend="kope", options={"store": str(store)})
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    chosen = {t.key: t.attempt for graph in kope.report().graphs for t in graph.tasks}
    assert list(chosen) == backend_keys
    recorded.refresh()
    for key in backend_keys:
        standing = winner(recorded.attempts(key))
        if standing.clean:
            pinned = standing.pinned.id if standing.pinned is not None else None
            assert chosen[key] == pinned, key
            # A choice the compile re-measured (the pipeline's figures were disturbed, as
            # on a busy machine) rests on the new figures, not on what the pipeline applied.
            if key in applied and len(recorded.attempts(key)) == before[key]:
                assert applied[key] == pinned, key


def test_the_backends_own_partition_goes_through_kope_opt_with_eager_timed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kope import --tasks` writes the Tasks the backend makes, keyed as it keys them, with
    their ATen calls: `kope-optimize` times them against eager, and what it pins is what
    `torch.compile(backend="kope")` then runs, by the same keys."""
    import kope
    from kope.targets.cpu import CpuTarget
    from kope.tools.precompile import trace_tasks

    mlp = _factory(tmp_path, monkeypatch)
    source = tmp_path / "tasks.mlir"
    proc = run("kope", "import", "models:mlp", "--tasks", "-o", str(source))
    model, inputs = mlp()
    backend_keys = [task.key for task in trace_tasks(model, inputs, CpuTarget())]
    text = source.read_text()
    assert re.findall(r'kope\.key = "(\w+)"', text) == backend_keys
    assert text.count("kope.eager = ") == len(backend_keys) and "Tasks" in proc.stderr

    store = tmp_path / "store"
    pipeline = (
        f"builtin.module(kope-optimize{{budget=2 store={store}}},"
        f"kope-apply-kernels{{store={store}}})"
    )
    optimized = run("kope-opt", f"--pass-pipeline={pipeline}", str(source)).stdout
    assert optimized.count("speedup_vs_eager = ") == len(backend_keys)
    recorded = ExperienceStore(store)
    assert {t.key for t in recorded.tasks()} == set(backend_keys)
    assert all(
        a.eager_us is not None for key in backend_keys for a in recorded.attempts(key)
    )  # each timed against eager, as on the backend's road

    kope.reset_report()
    with torch.no_grad():
        compiled = torch.compile(model, backend="kope", options={"store": str(store)})
        torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)
    assert [t.key for graph in kope.report().graphs for t in graph.tasks] == backend_keys
