"""The external-suite harnesses (`benchmarks/opinfo.py`, `benchmarks/torch_mlir_e2e.py`): a
small fixed OpInfo sample through KOPE, how a parent records children that die or hang, the
e2e harness on a miniature torch-mlir checkout, and its message when there is none.

The full runs are benchmarks (their docstrings give the commands)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _load_opinfo() -> types.ModuleType:
    # By path, not by putting benchmarks/ on sys.path, where its scripts' names would shadow
    # modules for the rest of the session.
    spec = importlib.util.spec_from_file_location("opinfo", BENCHMARKS / "opinfo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["opinfo"] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


opinfo = _load_opinfo()

# Simple elementwise, reduction and row operators, and `scatter`, whose torch-mlir import kills
# the process that runs it (KOPE isolates that import: the answer must still be right).
FIXED_OPS = ["add", "mul", "nn.functional.relu", "sum", "softmax", "scatter"]
ACCEPTED = {opinfo.RIGHT, opinfo.EAGER_FAILS}

FIXED_SAMPLE = """
from dataclasses import asdict

import opinfo
from opinfo import child_main  # the children's entry, called as this module's


def check_all(names, announce):
    return [asdict(opinfo.check_operator(n, "reference", limit_samples=1)) for n in names]
"""


def test_a_fixed_opinfo_sample_is_right_and_runs_on_kope_kernels(tmp_path: Path) -> None:
    # One child for the six operators (the harness runs one per operator): one KOPE lowering
    # worker started instead of six.
    (tmp_path / "fixed_sample.py").write_text(FIXED_SAMPLE)
    child = opinfo.Child("fixed_sample", "check_all", timeout_s=600, path=tmp_path)
    events, ended, stderr = opinfo.run_child(child, {"names": FIXED_OPS})
    assert ended == "ok", stderr
    (done,) = [e for e in events if e["event"] == "done"]
    items = {item["name"]: item for item in done["value"]}
    assert sorted(items) == sorted(FIXED_OPS)
    for name, item in items.items():
        assert item["dtype"] == "float32", name
        assert len(item["samples"]) == 1, name
        (sample,) = item["samples"]
        assert sample["outcome"] in ACCEPTED, (name, sample["detail"], sample["error"])
    assert items["scatter"]["samples"][0]["outcome"] == opinfo.RIGHT
    on_kope = [n for n, item in items.items() if item["samples"][0]["kope_ops"]]
    assert on_kope, "no operator of the fixed sample ran on a KOPE kernel"


FAKE_CHILD = """
import json, os, signal, time

def emit(event):
    print({prefix!r} + json.dumps(event), flush=True)

# What each sample does: answer, die in KOPE's part, hang there, die in eager's, raise.
PLAN = ["right", "segv", "hang", "segv-in-eager", "raise", "right"]

def child_main(request_json):
    request = json.loads(request_json)
    for index in range(request.get("start", 0), request["limit_samples"]):
        what = PLAN[index]
        phase = "eager" if what == "segv-in-eager" else "kope"
        emit({{"event": "phase", "index": index, "phase": phase, "inputs": "x"}})
        if what.startswith("segv"):
            os.kill(os.getpid(), signal.SIGSEGV)
        if what == "hang":
            time.sleep(600)
        if what == "raise":
            raise RuntimeError("the check itself failed")
        emit({{"event": "sample", "result": {{"index": index, "outcome": "right"}}}})
    emit({{"event": "done", "dtype": "float32", "label": ""}})
"""


def test_children_that_die_or_hang_are_recorded_and_the_next_sample_goes_on(
    tmp_path: Path,
) -> None:
    (tmp_path / "fake_child.py").write_text(FAKE_CHILD.format(prefix=opinfo.EVENT_PREFIX))
    child = opinfo.Child("fake_child", "unused", timeout_s=5, path=tmp_path)
    item = opinfo.run_item(child, "fake", "reference", {"limit_samples": 6})
    outcomes = [(s.index, s.outcome) for s in item.samples]
    assert outcomes == [
        (0, opinfo.RIGHT),
        (1, opinfo.DIED),
        (2, opinfo.TIMEOUT),
        (3, opinfo.EAGER_FAILS),  # eager's crash is not KOPE's
        (4, opinfo.DIED),
        (5, opinfo.RIGHT),
    ]
    assert "SIGSEGV" in item.samples[1].detail
    assert "exit code 1" in item.samples[4].detail
    assert "the check itself failed" in item.samples[4].detail
    assert item.outcome == opinfo.DIED  # an item is as bad as its worst sample
    summary = opinfo.summarize([item])["reference"]
    assert summary["samples"][opinfo.DIED] == 2 and summary["samples"][opinfo.RIGHT] == 2


def test_comparison_is_nan_aware_and_strict_on_dtype_and_shape() -> None:
    nan = torch.tensor([1.0, float("nan")])
    assert opinfo.mismatch(nan.clone(), nan) is None
    assert opinfo.mismatch((nan + 1e-6, 3), (nan, 3)) is None  # within float32's tolerance
    assert opinfo.mismatch(nan + 1.0, nan) is not None
    assert opinfo.mismatch(nan.double(), nan) is not None
    assert opinfo.mismatch(nan[:1], nan) is not None
    assert opinfo.mismatch(torch.tensor([1, 2]), torch.tensor([1, 3])) is not None
    assert opinfo.mismatch((nan,), [nan]) is not None  # structure


def run_e2e(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / "torch_mlir_e2e.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_e2e_harness_without_a_checkout_says_what_to_pass(tmp_path: Path) -> None:
    for args in ([], ["--torch-mlir", str(tmp_path)]):
        proc = run_e2e(*args)
        assert proc.returncode == 2, proc.stderr
        assert "--torch-mlir" in proc.stderr and "Traceback" not in proc.stderr
        assert "llvm/torch-mlir" in proc.stderr


# A miniature torch-mlir checkout, laid out as the real one, with the parts of its e2e framework
# the harness uses: a registry, TestUtils, register_all_tests() and an xfail set.
MINI_CHECKOUT = {
    "projects/pt1/python/torch_mlir_e2e_test/__init__.py": "",
    "projects/pt1/python/torch_mlir_e2e_test/framework.py": """
        from typing import Any, Callable, NamedTuple

        import torch

        class TestUtils:
            def __init__(self):
                torch.manual_seed(0)

            def rand(self, *sizes):
                return torch.rand(sizes)

        class Test(NamedTuple):
            unique_name: str
            program_factory: Callable[[], Any]
            program_invoker: Callable[[Any, TestUtils], None]
            timeout_seconds: int
    """,
    "projects/pt1/python/torch_mlir_e2e_test/registry.py": """
        from .framework import Test

        GLOBAL_TEST_REGISTRY = []

        def register_test_case(module_factory, timeout_seconds=120):
            def decorator(f):
                GLOBAL_TEST_REGISTRY.append(Test(f.__name__, module_factory, f, timeout_seconds))
                return f
            return decorator
    """,
    "projects/pt1/python/torch_mlir_e2e_test/test_suite/__init__.py": """
        from torch_mlir._version import torch_version_for_comparison, version

        def register_all_tests():
            from . import basic
            from . import vision
    """,
    "projects/pt1/python/torch_mlir_e2e_test/test_suite/basic.py": """
        import torch

        from torch_mlir_e2e_test.registry import register_test_case

        class ReluModule(torch.nn.Module):
            def forward(self, x):
                return torch.relu(x) * 2.0

        @register_test_case(module_factory=lambda: ReluModule())
        def ReluModule_basic(module, tu):
            module.forward(tu.rand(3, 4) - 0.5)

        class NoiseModule(torch.nn.Module):
            def forward(self, x):
                return x + torch.rand_like(x)

        @register_test_case(module_factory=lambda: NoiseModule())
        def NoiseModule_basic(module, tu):
            module.forward(tu.rand(3, 4))
    """,
    "projects/pt1/python/torch_mlir_e2e_test/test_suite/vision.py": """
        import a_module_this_machine_lacks

        from torch_mlir_e2e_test.registry import register_test_case

        @register_test_case(module_factory=lambda: None)
        def VisionModule_basic(module, tu):
            module.forward(tu.rand(1, 3, 8, 8))
    """,
    "projects/pt1/e2e_testing/xfail_sets.py": """
        FX_IMPORTER_XFAIL_SET = {"VisionModule_basic"}
    """,
}


def test_the_e2e_harness_on_a_miniature_checkout(tmp_path: Path) -> None:
    root = tmp_path / "torch-mlir"
    for name, text in MINI_CHECKOUT.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    out = tmp_path / "report.json"
    proc = run_e2e("--torch-mlir", str(root), "--kernels", "reference", "--report", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    items = {item["name"]: item for item in report["items"]}
    assert items["ReluModule_basic"]["outcome"] == opinfo.RIGHT
    assert items["ReluModule_basic"]["ran_kope"]
    assert items["NoiseModule_basic"]["outcome"] == opinfo.EAGER_FAILS  # random
    vision = items["VisionModule_basic"]
    assert vision["outcome"] == opinfo.NOT_LOADABLE and vision["label"] == "xfail"
    assert "a_module_this_machine_lacks" in vision["samples"][0]["detail"]
    summary = report["summary"]["reference"]
    assert summary["right"] == 1 and summary["right_on_kope"] == 1
    assert "1 of 1 right ones ran one" in proc.stdout


def test_operators_are_chosen_by_name_variant_or_seeded_sample() -> None:
    names = ["add", "softmax", "softmax.with_dtype", "sum"]
    assert opinfo.choose(names, ["softmax", "add"], None, 0) == [
        "softmax",
        "softmax.with_dtype",
        "add",
    ]
    assert opinfo.choose(names, ["softmax.with_dtype"], None, 0) == ["softmax.with_dtype"]
    assert opinfo.choose(names, None, 2, 7) == opinfo.choose(names, None, 2, 7)
    assert len(opinfo.choose(names, None, 2, 7)) == 2
    with pytest.raises(SystemExit, match="unknown: nope"):
        opinfo.choose(names, ["nope"], None, 0)


@pytest.mark.parametrize("draws", [False, True])
def test_a_differing_answer_where_eager_draws_random_numbers_is_not_called_wrong(
    draws: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch-mlir's UniformNoCorrelationModule returns whether the correlation of its uniform
    # draws is below 0.001: eager's two runs agree on that most of the time, another
    # generator's draw may not. Eager's two runs agree here, KOPE's answer differs.
    verdicts = iter([None, "values differ"])
    monkeypatch.setattr(opinfo, "mismatch", lambda *args: next(verdicts, None))

    def run(wrap: opinfo.Wrap) -> torch.Tensor:
        if draws:
            torch.rand(3)
        return wrap(lambda x: x * 2)(torch.ones(3))

    result = opinfo.check_once(run, "eager")
    if draws:
        assert result.outcome == opinfo.EAGER_FAILS
        assert "draws random numbers (aten.rand)" in result.detail
    else:
        assert result.outcome == opinfo.WRONG


def test_random_draws_are_named_by_their_operator() -> None:
    with opinfo.RandomDraws() as draws:
        torch.ones(2).add(1).softmax(0)
    assert not draws.ops
    with opinfo.RandomDraws() as draws:
        torch.nn.functional.dropout(torch.ones(4), 0.5, training=True)
        torch.randn(2)
    assert draws.ops >= {"aten.randn"}
