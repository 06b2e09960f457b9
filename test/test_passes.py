"""KOPE's passes and pipelines from Python: registry, parsing, keys, repro files, kope-opt."""

from __future__ import annotations

import math
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch_mlir import ir

from kope.frontend.partition import partition
from kope.passes import pass_class, pass_names
from kope.passes.keys import canonicalize_module_text
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
    assert [str(e) for e in elements] == [
        "kope-outline-operators",
        "canonicalize",
        "func.func(cse)",
    ]
    assert (
        pipeline_text(elements)
        == "builtin.module(kope-outline-operators,canonicalize,func.func(cse))"
    )


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "kope-nonesuch",
            "unknown KOPE pass 'kope-nonesuch'; KOPE passes are: " + ", ".join(pass_names()),
        ),
        ("kope-outline-operators{color=red}", "has no option 'color'; its options are: target"),
        ("kope-outline-operators{target}", "not of the form key=value"),
        (
            "kope-apply-kernels{target=tpu}",
            "option target='tpu' is not a known target; known targets: ascend, cpu, cuda",
        ),
        ("func.func(cse,kope-outline-operators)", "put 'kope-outline-operators' at the top level"),
    ],
)
def test_pipeline_errors_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(PipelineError, match=re.escape(message)):
        parse_pipeline(text)


def test_outlined_matmul_has_the_backend_key(tmp_path: Path) -> None:
    """`kope-outline-operators` on a file and the backend's Task agree on a matmul's key."""
    x, w = torch.randn(4, 16), torch.randn(16, 8)
    task = partition(make_fx(torch.mm, tracing_mode="fake")(x, w), get_target("cpu")).tasks[0]
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
    out = subprocess.run(
        ["kope-opt", "--kope-outline-operators", str(source)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
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
        capture_output=True,
        text=True,
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
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0
    assert "IR Dump After" in proc.stderr and "kope-destination-abi" in proc.stderr


def test_verify_diagnostics_reports_a_missing_expectation(tmp_path: Path) -> None:
    source = tmp_path / "t.mlir"
    source.write_text("// expected-error @+1 {{this never happens}}\nfunc.func @f() { return }\n")
    proc = subprocess.run(
        ["kope-opt", "--verify-diagnostics", str(source)], capture_output=True, text=True
    )
    assert proc.returncode == 1
    assert f'{source}:2: error: expected error "this never happens" was not produced' in proc.stderr


def test_options_round_trip_through_pipeline_text() -> None:
    """A store path with spaces survives `str(pass)`, as in the repro command."""
    elements = parse_pipeline("kope-apply-kernels{store='/tmp/a store' target=cpu},cse")
    assert pipeline_text(elements) == "builtin.module(kope-apply-kernels{store='/tmp/a store'},cse)"
    again = parse_pipeline(pipeline_text(elements))
    assert again[0].store == "/tmp/a store"  # type: ignore[union-attr]


def test_kope_opt_help_lists_options_with_defaults_and_help() -> None:
    proc = subprocess.run(["kope-opt", "--help"], capture_output=True, text=True, check=True)
    lines = proc.stdout.splitlines()
    at = lines.index(
        next(line for line in lines if line.strip().startswith("--kope-apply-kernels"))
    )
    assert lines[at + 1].split()[0] == "store=" and "$KOPE_HOME" in lines[at + 1]
    assert lines[at + 2].split()[0] == "target=cpu"


_ABI_INPUT = "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> { return %a : tensor<2xf32> }"


def test_kope_opt_takes_single_dash_options_like_llvm_tools(tmp_path: Path) -> None:
    out = tmp_path / "out.mlir"
    proc = subprocess.run(
        ["kope-opt", "-kope-destination-abi", "-canonicalize", f"-o={out}", "-"],
        input=_ABI_INPUT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "func.func @kope_kernel" in out.read_text()


def test_kope_opt_dump_pass_pipeline_expands_kope_pipelines() -> None:
    proc = subprocess.run(
        ["kope-opt", "--dump-pass-pipeline", "--kope-lower-cpu", "-"],
        input=_ABI_INPUT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    dumped = proc.stderr.splitlines()[0]
    assert dumped.startswith(
        "builtin.module(kope-apply-schedule,kope-expand-powers,kope-expand-log1p-expm1,"
        "kope-emulate-bf16,"
        "kope-destination-abi,inline,"
    )
    assert dumped.endswith(",kope-bool-vector-memory)")
    assert "kope-lower-cpu" not in dumped and "kope-memref-copy-to-linalg" in dumped


def test_kope_opt_allow_unregistered_dialect() -> None:
    text = 'func.func @f() { "mystery.op"() : () -> () \n return }'
    refused = subprocess.run(["kope-opt", "-"], input=text, capture_output=True, text=True)
    assert refused.returncode == 1
    assert (
        "<stdin>:1:30: error: operation being parsed with an unregistered dialect" in refused.stderr
    )
    allowed = subprocess.run(
        ["kope-opt", "--allow-unregistered-dialect", "-"],
        input=text,
        capture_output=True,
        text=True,
    )
    assert allowed.returncode == 0 and '"mystery.op"()' in allowed.stdout


_STALE = (
    "func.func private @stale(%a: tensor<4xf32>) -> tensor<4xf32> attributes "
    '{kope.key = "00"} {\n  return %a : tensor<4xf32>\n}\n'
)


def test_verify_diagnostics_fails_on_an_unexpected_warning(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    source = tmp_path / "t.mlir"
    source.write_text(_STALE)
    store = tmp_path / "store"
    flags = ["--verify-diagnostics", f"--kope-apply-kernels=store={store}", str(source)]
    proc = subprocess.run(["kope-opt", *flags], capture_output=True, text=True)
    assert proc.returncode == 1
    unexpected = "error: unexpected warning: kope-apply-kernels: @stale left untouched"
    assert f"{source}:1:1: {unexpected}" in proc.stderr
    expected = "// expected-warning-re @+1 {{@st{{[a-z]+}} left untouched: its kope.key 00...}}\n"
    source.write_text(expected + _STALE)
    proc = subprocess.run(["kope-opt", *flags], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_pass_warnings_are_logged_outside_kope_opt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Run as a library (no diagnostic handler), a pass's warning goes to the kope.passes log."""
    (tmp_path / "store").mkdir()
    module = ir.Module.parse(_STALE, ir.Context())
    with caplog.at_level("WARNING", logger="kope.passes"):
        run_pipeline(
            module,
            parse_pipeline(f"kope-apply-kernels{{store={tmp_path / 'store'}}}"),
            description="stale key",
        )
    assert any("@stale left untouched" in r.getMessage() for r in caplog.records)


_TWO_FILLS = """
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {{
  {first}
  {second}
  %r = linalg.add ins(%x, %a : tensor<4xf32>, tensor<4xf32>) outs(%b : tensor<4xf32>)
    -> tensor<4xf32>
  return %r : tensor<4xf32>
}}
"""
_FILL_A = (
    "%one = arith.constant 1.0 : f32\n  %ea = tensor.empty() : tensor<4xf32>\n"
    "  %a = linalg.fill ins(%one : f32) outs(%ea : tensor<4xf32>) -> tensor<4xf32>"
)
_FILL_B = (
    "%two = arith.constant {value} : f32\n  %eb = tensor.empty() : tensor<4xf32>\n"
    "  %b = linalg.fill ins(%two : f32) outs(%eb : tensor<4xf32>) -> tensor<4xf32>"
)


def test_canonical_form_ignores_the_order_ops_were_emitted_in() -> None:
    """Producers emit constants and inits in different orders; the key must not see it."""
    b = _FILL_B.format(value="2.0")
    one_way = canonicalize_module_text(_TWO_FILLS.format(first=_FILL_A, second=b))
    other_way = canonicalize_module_text(_TWO_FILLS.format(first=b, second=_FILL_A))
    assert one_way == other_way
    changed = _TWO_FILLS.format(first=_FILL_A, second=_FILL_B.format(value="3.0"))
    assert canonicalize_module_text(changed) != one_way


@pytest.mark.parametrize(
    ("name", "nonpositive"),
    [("softmax", True), ("log_softmax", True), ("softmax_dim0", True), ("sigmoid", False)],
)
def test_an_exp_of_x_less_its_rows_maximum_drops_its_overflow_handling(
    name: str, nonpositive: bool
) -> None:
    """softmax's exp(x - max) is never of a positive number, so its approximation needs no
    overflow handling (the clamp of 2^n to 2^127); sigmoid's exp(-x) is of any sign."""
    from kope.passes.analysis import prepare_payload
    from kope.targets.cpu import CpuTarget

    fn = {
        "softmax": lambda x: torch.softmax(x, -1),
        "log_softmax": lambda x: torch.log_softmax(x, -1),
        "softmax_dim0": lambda x: torch.softmax(x, 0),
        "sigmoid": lambda x: torch.sigmoid(x),
    }[name]
    task = partition(make_fx(fn, tracing_mode="fake")(torch.randn(6, 20)), CpuTarget()).tasks[0]
    prepared = prepare_payload(task.payload, approximate_math=True)
    assert "math.exp" not in prepared
    assert ("arith.minimumf" not in prepared) is nonpositive


def _grids() -> dict[str, torch.Tensor]:
    """Dense grids over each function's range, and the values IEEE treats apart."""
    specials = torch.tensor(
        [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-30, -1e-30, 1e-40, 1e-45, -1.0, -1e-8]
        + [1e-8, 88.7, -88.7, 87.3, -87.4, 88.72, 88.73, -88.0, -88.1, 200.0, -200.0, 3e38]
    )
    wide = torch.linspace(-100, 100, 60_001)
    near0 = torch.logspace(-30, 0, 20_001)
    positive = torch.logspace(-45, 38.5, 60_001)
    return {
        "exp": torch.cat([wide, near0, -near0, specials]),
        "expm1": torch.cat([wide, near0, -near0, specials]),
        "log": torch.cat([positive, wide, specials]),
        "log1p": torch.cat([positive, wide.clamp_min(-1), near0, -near0, specials]),
        "tanh": torch.cat([wide, near0, -near0, specials]),
    }


@pytest.mark.parametrize(
    ("name", "ulps"), [("exp", 2), ("expm1", 3), ("log", 2), ("log1p", 3), ("tanh", 3)]
)
def test_polynomial_math_stays_within_a_few_ulp(name: str, ulps: float) -> None:
    """The polynomial forms against f64, over dense grids of their ranges: within `ulps` of
    every normal result, within the smallest normal below them, and NaN, +-Inf and 0 exactly
    where IEEE has them."""
    from kope.passes.analysis import analyze, prepare_payload
    from kope.spaces.cpu import schedule_space
    from kope.spaces.kernels import kernel_source
    from kope.targets.cpu import CpuTarget
    from kope.vocabulary.kernels import Kernel

    fn = getattr(torch, name)
    grid = _grids()[name]
    target = CpuTarget()
    (task,) = partition(make_fx(fn, tracing_mode="fake")(grid), target).tasks
    prepared = prepare_payload(task.payload, approximate_math=True)
    assert f"math.{name}" not in prepared
    space, _ = schedule_space(analyze(prepare_payload(task.payload)), target.capabilities())
    config = next(c for c, _ in space if c.get("approximate_math"))
    kernel = target.build(task.spec, Kernel(kernel_source(prepared, analyze(prepared), config)))
    got = kernel.bind().call(grid)
    got = (got[0] if isinstance(got, tuple) else got).double()
    eager = fn(grid).double()
    exact = fn(grid.double())
    assert torch.equal(torch.isnan(got), torch.isnan(eager))
    tiny = torch.finfo(torch.float32).tiny
    special = ~torch.isfinite(exact) | (exact == 0) | (exact.abs() >= 2.0**128)
    assert torch.equal(got[special & ~torch.isnan(eager)], eager[special & ~torch.isnan(eager)])
    # Below the normal range: flushed to 0 or subnormal, both within tiny.
    below = exact.abs() < tiny
    assert ((got[below] - exact[below]).abs() < tiny).all()
    normal = torch.isfinite(exact) & (exact.abs() >= tiny) & ~special
    error = (got - exact)[normal].abs() / (exact[normal].abs() * torch.finfo(torch.float32).eps)
    assert error.max().item() <= ulps, (name, error.max().item())
