"""The `kope` command line as a newcomer meets it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kope.frontend.report import GraphReport, Report, TaskReport

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
        ["kope", *args, "--store", str(store)]
        if args and args[0] == "compile"
        else ["kope", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_help() -> None:
    proc = subprocess.run(["kope", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "compile" in proc.stdout
    proc = subprocess.run(["kope", "compile", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "--kernels" in proc.stdout


@pytest.mark.parametrize("spec", ["mlp", "kope.tools.zoo:odd_shapes"])
def test_compile_builtin_and_factory(spec: str, tmp_path: Path) -> None:
    proc = kope("compile", spec, "--kernels", "reference", "--repeat", "3", store=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "JIT share of compute operators that ran: 100%" in proc.stdout
    assert "max |kope - eager|" in proc.stdout
    assert "no KOPE kernel ran" not in proc.stdout
    headline = next(line for line in proc.stdout.splitlines() if line.startswith("model "))
    assert "x); max |kope - eager|" in headline  # the kernels ran: the ratio is KOPE's


def test_compile_says_when_no_kope_kernel_ran(tmp_path: Path) -> None:
    """A speedup with eager's kernels is dynamo's, and the summary must not let it pass as
    KOPE's."""
    proc = kope("compile", "mlp", "--kernels", "eager", "--repeat", "3", store=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no KOPE kernel ran, so no speedup is claimed" in proc.stdout
    headline = next(line for line in proc.stdout.splitlines() if line.startswith("model mlp:"))
    assert "x)" not in headline  # no ratio beside eager's own kernels


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
    assert "does not define get_inputs" in proc.stderr


def test_unknown_model_lists_the_examples(tmp_path: Path) -> None:
    proc = kope("compile", "resnet9000", store=tmp_path)
    assert proc.returncode == 2 and "mlp" in proc.stderr and "module:factory" in proc.stderr


def test_help_lists_every_memory_subcommand() -> None:
    from kope.memory.cli import SUBCOMMANDS

    out = subprocess.run(["kope", "--help"], capture_output=True, text=True).stdout
    memory = subprocess.run(["kope", "memory", "--help"], capture_output=True, text=True).stdout
    for name in SUBCOMMANDS:
        assert name in out.split("memory", 1)[1], name
        assert name in memory, name
    assert {"compact", "tasks"} <= set(SUBCOMMANDS)


def test_bad_option_fails_before_the_model_is_loaded(tmp_path: Path) -> None:
    sentinel = tmp_path / "loaded"
    path = tmp_path / "model.py"
    path.write_text(f"open({str(sentinel)!r}, 'w').close()\n" + MODEL_FILE)
    proc = kope("compile", str(path), "--workers", "0", store=tmp_path / "store")
    assert proc.returncode == 2 and "workers=0" in proc.stderr
    assert not sentinel.exists()


def _task(
    key: str, kernel: str, calls: int, quality: str = "clean", reason: str = "why", **kw: float
) -> TaskReport:
    return TaskReport(
        label=f"aten.op({key})",
        key=key,
        op="aten.op",
        kernel=kernel,
        reason=reason,
        calls=calls,
        quality=quality,
        **kw,
    )


def test_table_has_one_row_per_operator_and_shows_what_ran() -> None:
    graph = GraphReport(
        tasks=[
            _task("a", "agent", 3, eager_us=20.0, kernel_us=10.0),
            _task("a", "agent", 4, eager_us=20.0, kernel_us=10.0),
            # kernel_us: the reference's
            _task("b", "eager", 0, eager_us=8.0, kernel_us=400.0, reason="it did not pay " * 30),
        ]
    )
    lines = Report(
        graphs=[graph, GraphReport(tasks=[_task("a", "agent", 1, eager_us=20.0, kernel_us=10.0)])]
    ).format_table()
    rows = lines.splitlines()
    header = rows[0].split()
    assert header[header.index("sites") + 1] == "calls"
    assert max(map(len, rows)) <= 120  # reasons go under their rows, wrapped
    body = {r.split()[0]: r.split() for r in rows[2:] if r.startswith("aten.")}
    assert set(body) == {"aten.op(a)", "aten.op(b)"}
    notes = [r for r in rows[2:] if not r.startswith(("aten.", "4 tasks"))]
    assert notes and all(r.startswith("    ") for r in notes)
    assert len(notes) == 1 + 3 and notes[-1].endswith(" …")  # "why", then 3 lines at most
    assert body["aten.op(a)"][1:8] == ["agent", "10.0", "20.0", "2.00x", "clean", "3", "8"]
    assert body["aten.op(b)"][1:8] == ["eager", "8.0", "8.0", "1.00x", "clean", "1", "-"]
    # A figure that is not clean is no speedup: it is not printed as one.
    dirty = _task("c", "agent", 1, quality="contaminated", eager_us=20.0, kernel_us=10.0)
    table = Report(graphs=[GraphReport(tasks=[dirty])]).format_table()
    assert "not clean" in table and "contaminated" in table and "2.00x" not in table
    assert "400.0" not in lines
    assert rows[-1].startswith("4 tasks (2 distinct)")


def test_what_a_newcomer_leaves_out_or_gets_wrong_is_said_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`get_init_inputs` may be left out when Model takes nothing; a factory is found in the
    current directory, as `python -m` finds it; a model that fails eagerly on its own inputs
    says so before any compiler runs (it was a 180-line fake-tensor traceback)."""
    from kope.core.errors import ModelLoadError
    from kope.tools.models import load_model

    plain = tmp_path / "plain.py"
    plain.write_text(
        "import torch\nModel = torch.nn.Tanh\ndef get_inputs():\n    return [torch.randn(5)]\n"
    )
    model, inputs = load_model(str(plain))
    assert model(*inputs).shape == (5,)
    (tmp_path / "kope_test_factory.py").write_text(
        "import torch\ndef make():\n    return torch.nn.ReLU(), (torch.randn(3),)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert isinstance(load_model("kope_test_factory:make")[0], torch.nn.ReLU)
    wrong = tmp_path / "wrong.py"
    wrong.write_text(MODEL_FILE.replace("return [4]", "return [16]"))
    with pytest.raises(ModelLoadError, match="fails in eager PyTorch on its example inputs"):
        load_model(str(wrong))


def test_memory_commands_on_a_store_that_is_not_there_say_so(tmp_path: Path) -> None:
    from kope.tools.cli import main

    missing = tmp_path / "typo_store"
    assert main(["memory", "stats", "--store", str(missing)]) == 2
    assert not missing.exists()  # nor is an empty one made


def test_a_newcomers_mistakes_in_model_files_name_the_fix(tmp_path: Path) -> None:
    """A tensor from get_inputs() was split into as many arguments as it has rows, and a
    Model that takes arguments without get_init_inputs said only 'missing 1 required
    positional argument'."""
    from kope.core.errors import ModelLoadError
    from kope.tools.models import load_model

    one_tensor = tmp_path / "one_tensor.py"
    one_tensor.write_text(
        MODEL_FILE.replace("return [torch.randn(5, 4)]", "return torch.randn(5, 4)")
    )
    with pytest.raises(ModelLoadError, match=r"must return a list .* not a Tensor: return \[x\]"):
        load_model(str(one_tensor))
    no_init = tmp_path / "no_init.py"
    no_init.write_text(MODEL_FILE.split("def get_init_inputs")[0])
    with pytest.raises(ModelLoadError, match="define get_init_inputs"):
        load_model(str(no_init))


@pytest.mark.parametrize(
    "args, says",
    [
        (["compile", "--repeat", "0"], "argument --repeat: must be above 0, not 0"),
        (["precompile", "--wall-s", "-1"], "argument --wall-s: must be above 0"),
        (["bench", "--budget", "0"], "argument --budget: must be above 0, not 0"),
        (["bench", "--seeds", "a,b"], "'a,b' is not a comma-separated list of whole numbers"),
        (["memory", "context", "k", "--budget", "-5"], "argument --budget: must be above 0"),
    ],
)
def test_bad_numbers_are_refused_before_any_work(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from kope.tools.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_a_store_that_cannot_serve_is_an_error_that_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store path that is a file raised FileExistsError (and inside torch.compile ran the
    graph eagerly as 'a KOPE bug'); a store that cannot be written failed deep in a write."""
    from kope.core.errors import KopeError
    from kope.memory.store import ExperienceStore, StoreError
    from kope.tools.cli import main

    a_file = tmp_path / "store_file"
    a_file.write_text("not a store")
    assert main(["precompile", "mlp", "--budget", "1", "--store", str(a_file)]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    compiled = torch.compile(model, backend="kope", options={"store": str(a_file)})
    with pytest.raises(Exception) as raised, torch.no_grad():
        compiled(torch.randn(2, 4))
    assert "is a file, not a directory" in str(raised.value)
    assert isinstance(raised.value, KopeError) or isinstance(
        getattr(raised.value, "inner_exception", None), KopeError
    )
    store = ExperienceStore(tmp_path / "read_only")
    store.root.chmod(0o555)
    try:
        if not os.access(store.root, os.W_OK):  # root may write anywhere
            with pytest.raises(StoreError, match="is not writable"):
                store.put_artifact("text")
    finally:
        store.root.chmod(0o755)


def test_output_paths_and_input_files_that_cannot_serve_are_said_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kope.passes.opt import main as kope_opt
    from kope.tools.cli import main

    missing = tmp_path / "no_such_folder" / "out.mlir"
    assert main(["import", "mlp", "-o", str(missing)]) == 2
    assert "its folder does not exist" in capsys.readouterr().err
    # A report path that is a folder, or a plot folder that is a file: said before any work.
    assert main(["bench", "suite", "--budget", "1", "--report", str(tmp_path)]) == 2
    assert "it is a folder" in capsys.readouterr().err
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    assert main(["bench", "suite", "--budget", "1", "--plot", str(a_file)]) == 2
    assert "is a file: give a folder" in capsys.readouterr().err
    assert main(["bench", "suite", "--agent", "llm", "--flat-prior"]) == 2
    assert "the llm agent has no hand-written prior" in capsys.readouterr().err
    assert main(["bench", "suite", "--ablate", "prior"]) == 2
    assert "--ablate prior needs --warm-store DIR" in capsys.readouterr().err
    assert main(["bench", "suite", "--ablate", "prior", "--warm-store", str(tmp_path)]) == 2
    assert "is not an experience store" in capsys.readouterr().err
    binary = tmp_path / "binary.mlir"
    binary.write_bytes(b"\xff\xfe\x00junk")
    assert kope_opt(["--kope-outline-operators", str(binary)]) == 1
    assert "is not MLIR text" in capsys.readouterr().err
    assert kope_opt(["--pass-pipeline=builtin.module(kope-outline-operators", str(binary)]) != 0
    assert "unbalanced parentheses" in capsys.readouterr().err


def test_outputs_with_nan_where_eager_has_nan_agree(tmp_path: Path) -> None:
    """A fully masked row's softmax is NaN in eager and in KOPE alike; `kope compile` said the
    model disagreed with eager (max |kope - eager| = nan) and exited 1."""
    from kope.tools.cli import _max_error

    nan, inf = float("nan"), float("inf")
    eager = torch.tensor([1.0, nan, inf, -inf])
    assert _max_error(eager.clone(), eager) == 0.0
    assert _max_error(torch.tensor([1.0, 2.0, inf, -inf]), eager) == inf  # a number for NaN
    assert _max_error(torch.tensor([1.5, nan, inf, -inf]), eager) == 0.5
    model = tmp_path / "masked.py"
    model.write_text(
        "import torch\n"
        "class Model(torch.nn.Module):\n"
        "    def forward(self, s, mask):\n"
        "        return s.masked_fill(~mask, float('-inf')).softmax(-1)\n"
        "def get_inputs():\n"
        "    mask = torch.ones(2, 4, dtype=torch.bool)\n"
        "    mask[1] = False\n"
        "    return [torch.randn(2, 4), mask]\n"
    )
    from kope.tools.cli import main

    argv = ["compile", str(model), "--repeat", "3", "--store", str(tmp_path / "store")]
    assert main(argv) == 0


def test_a_kernel_pack_with_nothing_to_carry_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An export from a store without Triton kernels wrote an empty pack and said to run it
    on the device."""
    from kope.tools.cli import main

    store, pack = tmp_path / "store", tmp_path / "pack"
    assert main(["precompile", "mlp", "--budget", "1", "--store", str(store)]) == 0
    capsys.readouterr()
    assert main(["export", "--target", "cuda", "-o", str(pack), "--store", str(store)]) == 2
    err = capsys.readouterr().err
    assert "holds no verified Triton kernel for target 'cuda'" in err
    assert "kope precompile MODEL --target cuda" in err
    assert not pack.exists()


def test_a_backend_error_inside_torch_compile_reaches_the_command_line_as_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """torch.compile wraps a backend's errors in BackendCompilerFailed: `kope compile
    --target cuda` printed dynamo's whole traceback around KOPE's one line."""
    from kope.core.errors import KopeError
    from kope.tools.cli import _meant_for_the_user

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    compiled = torch.compile(model, backend="kope", options={"target": "cuda"})
    with pytest.raises(Exception) as raised, torch.no_grad():
        compiled(torch.randn(2, 4))
    if torch.cuda.is_available():
        pytest.skip("this machine can run the cuda target")
    meant = _meant_for_the_user(raised.value)
    assert isinstance(meant, KopeError) and "cannot run a compiled model here" in str(meant)
    assert _meant_for_the_user(RuntimeError("a bug")) is None


def test_an_interrupted_precompile_reports_what_it_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C during the second operator: the report holds the first, marked incomplete, and
    the command says that a rerun resumes (it printed a KeyboardInterrupt traceback and wrote
    no report)."""
    import json

    import kope.tools.precompile as precompile
    from kope.tools.cli import main

    optimized: list[str] = []

    def optimize(task, target, store, agent, budget, seed=0, events=None, quiet=None):
        optimized.append(task.key)
        if len(optimized) > 1:
            raise KeyboardInterrupt
        return precompile.summarize(task, store, stopped="optimized")

    monkeypatch.setattr(precompile, "optimize_task", optimize)
    report = tmp_path / "report.json"
    store = tmp_path / "store"
    args = ["precompile", "mlp", "--budget", "1", "--store", str(store), "--report", str(report)]
    assert main(args) == 130
    written = json.loads(report.read_text())
    assert written["complete"] is False and len(written["operators"]) == 1
    assert "running the command again resumes" in capsys.readouterr().err


def test_import_tasks_names_what_stays_eager_with_its_shapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two places of one operator KOPE cannot take, at two shapes, were listed as two identical
    lines (no shapes)."""
    from kope.tools.cli import main

    model = tmp_path / "two_lgammas.py"
    model.write_text(
        "import torch\n"
        "class Model(torch.nn.Module):\n"
        "    def forward(self, x, y):\n"
        "        return torch.lgamma(x).sum() + torch.lgamma(y).sum()\n"
        "def get_inputs():\n"
        "    return [torch.rand(4, 8) + 1, torch.rand(3) + 1]\n"
    )
    assert main(["import", str(model), "--tasks", "-o", str(tmp_path / "tasks.mlir")]) == 0
    err = capsys.readouterr().err
    assert "stays eager: aten.lgamma(4x8xf32)" in err and "stays eager: aten.lgamma(3xf32)" in err
