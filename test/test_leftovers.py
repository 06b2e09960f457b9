"""The test suites leave nothing behind: pytest's KOPE_HOME and lit's output are per run and
removed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(argv: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TMPDIR": str(tmp)}
    env.pop("KOPE_LIT_KEEP", None)
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_pytest_session_removes_its_kope_home(tmp_path: Path) -> None:
    run = _run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "test/test_options.py::test_defaults",
        ],
        tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
    assert not list(tmp_path.glob("kope-test-home-*"))


@pytest.mark.skipif(shutil.which("lit") is None, reason="lit is not installed")
def test_a_lit_run_writes_into_a_folder_of_its_own_and_removes_it(tmp_path: Path) -> None:
    run = _run(["lit", "-q", "test/lit/parse-error.mlir"], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert not list(tmp_path.iterdir())
