"""Shared test set-up: one temporary KOPE_HOME per session, seeded randomness, markers."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path

import pytest

# Set before kope is imported anywhere, so no test touches the user's ~/.cache/kope; removed
# when the session ends (pytest_unconfigure).
_SESSION_HOME = Path(tempfile.mkdtemp(prefix="kope-test-home-"))
os.environ["KOPE_HOME"] = str(_SESSION_HOME)
# A failure to compile a graph raises here; for users it runs the graph as dynamo traced it.
os.environ["KOPE_STRICT"] = "1"

import torch  # noqa: E402


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="also run tests marked slow")


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_SESSION_HOME, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: pass --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seeded() -> None:
    random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def kope_home() -> Path:
    return _SESSION_HOME


@pytest.fixture
def fresh_store(tmp_path: Path) -> Path:
    """An empty store directory for tests that must measure from scratch."""
    return tmp_path / "store"
