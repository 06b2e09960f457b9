"""KOPE's passes and pipelines from Python: registry, parsing, keys, repro files, kope-opt."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch_mlir import ir

from kope.partition import partition
from kope.passes import pass_class, pass_names
from kope.passes.pipeline import PipelineError, parse_pipeline, pipeline_text, run_pipeline
from kope.targets import get_target, target_class, target_names


def test_every_registry_key_is_the_class_name() -> None:
    for name in pass_names():
        assert pass_class(name).name == name
    for name in target_names():
        assert target_class(name).name == name


def test_pipeline_mixes_upstream_and_kope_passes() -> None:
    elements = parse_pipeline(
        "builtin.module(kope-outline-operators{target=cpu},canonicalize,func.func(cse))"
    )
    assert [str(e) for e in elements] == ["kope-outline-operators", "canonicalize", "func.func(cse)"]
    assert pipeline_text(elements) == "builtin.module(kope-outline-operators,canonicalize,func.func(cse))"


@pytest.mark.parametrize(
    "text, message",
    [
        ("kope-nonesuch", "unknown KOPE pass 'kope-nonesuch'; KOPE passes are: kope-destination-abi"),
        ("kope-outline-operators{color=red}", "has no option 'color'; its options are: target"),
        ("kope-outline-operators{target}", "not of the form key=value"),
    ],
)
def test_pipeline_errors_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(PipelineError, match=re.escape(message)):
        parse_pipeline(text)


def test_outlined_matmul_has_the_backend_key(tmp_path: Path) -> None:
    """`kope-outline-operators` on a file and the backend's Task agree on a matmul's key."""
    target_key = get_target("cpu").key()
    x, w = torch.randn(4, 16), torch.randn(16, 8)
    task = partition(make_fx(torch.mm, tracing_mode="fake")(x, w), target_key).tasks[0]
    source = tmp_path / "mm.mlir"
    source.write_text(
        "func.func @f(%x: tensor<4x16xf32>, %w: tensor<16x8xf32>) -> tensor<4x8xf32> {\n"
        "  %zero = arith.constant 0.0 : f32\n"
        "  %e = tensor.empty() : tensor<4x8xf32>\n"
        "  %init = linalg.fill ins(%zero : f32) outs(%e : tensor<4x8xf32>) -> tensor<4x8xf32>\n"
        "  %y = linalg.matmul ins(%x, %w : tensor<4x16xf32>, tensor<16x8xf32>)"
        " outs(%init : tensor<4x8xf32>) -> tensor<4x8xf32>\n"
        "  return %y : tensor<4x8xf32>\n"
        "}\n"
    )
    out = subprocess.run(["kope-opt", "--kope-outline-operators", str(source)],
                         capture_output=True, text=True, check=True).stdout
    assert f'kope.key = "{task.key}"' in out


def test_failed_pipeline_writes_a_repro_that_reproduces(kope_home: Path) -> None:
    context = ir.Context()
    module = ir.Module.parse("func.func @other() { return }", context)
    with pytest.raises(PipelineError) as err:
        run_pipeline(module, parse_pipeline("kope-destination-abi"), description="test repro")
    message = str(err.value)
    assert "module has neither @kope_kernel nor a @main" in message
    command = message.split("reproduce with: ", 1)[1].strip()
    repro = Path(shlex.split(command)[-1])
    assert repro.parent == kope_home / "repro" and repro.exists()
    proc = subprocess.run(shlex.split(command), capture_output=True, text=True)
    assert proc.returncode == 1 and "module has neither @kope_kernel" in proc.stderr


def test_kope_opt_reads_stdin_and_writes_output_file(tmp_path: Path) -> None:
    out = tmp_path / "out.mlir"
    proc = subprocess.run(
        ["kope-opt", "--kope-destination-abi", "-o", str(out), "-"],
        input="func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> { return %a : tensor<2xf32> }",
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "func.func @kope_kernel" in out.read_text()


def test_kope_opt_help_lists_every_pass() -> None:
    proc = subprocess.run(["kope-opt", "--help"], capture_output=True, text=True, check=True)
    for name in pass_names():
        assert f"--{name}" in proc.stdout


def test_kope_opt_print_ir_after_all() -> None:
    proc = subprocess.run(
        ["kope-opt", "--mlir-print-ir-after-all", "--kope-destination-abi", "--canonicalize", "-"],
        input="func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> { return %a : tensor<2xf32> }",
        capture_output=True, text=True,
    )
    assert proc.returncode == 0
    assert "IR Dump After" in proc.stderr and "kope-destination-abi" in proc.stderr


def test_verify_diagnostics_reports_a_missing_expectation(tmp_path: Path) -> None:
    source = tmp_path / "t.mlir"
    source.write_text("// expected-error @+1 {{this never happens}}\nfunc.func @f() { return }\n")
    proc = subprocess.run(["kope-opt", "--verify-diagnostics", str(source)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert f"{source}:2: error: expected error \"this never happens\" was not produced" in proc.stderr
