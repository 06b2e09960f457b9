"""The `kope` command line as a newcomer meets it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

MODEL_FILE = """
import torch

class Model(torch.nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = torch.nn.Linear(features, 3)

    def forward(self, x):
        return torch.softmax(self.linear(x), dim=-1)

def get_inputs():
    return [torch.randn(5, 4)]

def get_init_inputs():
    return [4]
"""


def kope(*args: str, store: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["kope", *args, "--store", str(store)] if args and args[0] == "compile" else ["kope", *args],
        capture_output=True, text=True, timeout=600,
    )


def test_help() -> None:
    proc = subprocess.run(["kope", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "compile" in proc.stdout
    proc = subprocess.run(["kope", "compile", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "--kernels" in proc.stdout


@pytest.mark.parametrize("spec", ["mlp", "kope.zoo:odd_shapes"])
def test_compile_builtin_and_factory(spec: str, tmp_path: Path) -> None:
    proc = kope("compile", spec, "--kernels", "reference", "--repeat", "3", store=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "JIT share of compute operators that ran: 100%" in proc.stdout
    assert "max |kope - eager|" in proc.stdout


def test_compile_model_file(tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    path.write_text(MODEL_FILE)
    proc = kope("compile", str(path), "--repeat", "3", store=tmp_path / "store")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "aten._softmax" in proc.stdout


def test_broken_model_file_names_the_file_and_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("import torch\nclass Model(torch.nn.Module:\n    pass\n")
    proc = kope("compile", str(path), store=tmp_path)
    assert proc.returncode == 2
    assert str(path) in proc.stderr and "SyntaxError" in proc.stderr


def test_model_file_missing_the_convention(tmp_path: Path) -> None:
    path = tmp_path / "partial.py"
    path.write_text("class Model: pass\n")
    proc = kope("compile", str(path), store=tmp_path)
    assert proc.returncode == 2
    assert "does not define get_inputs, get_init_inputs" in proc.stderr


def test_unknown_model_lists_the_examples(tmp_path: Path) -> None:
    proc = kope("compile", "resnet9000", store=tmp_path)
    assert proc.returncode == 2 and "mlp" in proc.stderr and "module:factory" in proc.stderr
