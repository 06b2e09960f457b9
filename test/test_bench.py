"""`kope bench`: the figures of a suite run and of its ablations, and the arms' fairness."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kope.agents.base import Feedback, ProposalRequest
from kope.memory.store import ExperienceStore
from kope.targets.cpu import CpuTarget
from kope.testing import Reply, ScriptedOpenAIServer
from kope.tools.bench import BenchConfig, run_bench, summarize
from kope.tools.cli import main
from kope.tools.precompile import trace_tasks
from kope.tools.suite import load_suite
from kope.tuner.optimize import task_view

RELU = '''"""relu on a small matrix."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(16, 40)]


def get_init_inputs():
    return []
'''


def _row(arm: str, seed: int, key: str, trajectory, *, winner="agent", speedup=None, verified=True):
    return {
        "arm": arm,
        "seed": seed,
        "name": key,
        "key": key,
        "label": key,
        "winner": winner,
        "verified": verified,
        "attempts": len(trajectory),
        "speedup_vs_eager": speedup,
        "speedup_vs_reference": speedup,
        "trajectory": trajectory,
        "tokens_in": 100,
        "tokens_out": 10,
        "store": "",
    }


def test_figures_follow_their_definitions() -> None:
    rows = [
        # op a: memory_on reaches 90% of the best (2.0) at attempt 1, memory_off at attempt 3
        _row("memory_on", 0, "a", [1.9, 2.0], speedup=2.0),
        _row("memory_off", 0, "a", [None, 1.0, 1.85], speedup=1.85),
        # op b: memory_off never reaches 90% of memory_on's 1.5: counted as budget + 1
        _row("memory_on", 0, "b", [1.5], speedup=1.5),
        _row("memory_off", 0, "b", [1.1, 1.1, 1.1], speedup=1.1),
        # op c: nothing verified anywhere: out of attempts_to_90, eager runs (1.0)
        _row("memory_on", 0, "c", [None], winner="eager", speedup=1.0, verified=False),
        _row("memory_off", 0, "c", [None], winner="eager", speedup=1.0, verified=False),
    ]
    config = BenchConfig(CpuTarget(), budget=3, seeds=[0], ablate="memory")
    report = summarize(rows, config, {("memory_on", 0): 5.0, ("memory_off", 0): 7.0})
    on, off = report["arms"]["memory_on"], report["arms"]["memory_off"]
    assert on["pass_rate"] == pytest.approx(2 / 3) and off["pass_rate"] == pytest.approx(2 / 3)
    assert on["geomean_speedup_vs_eager"] == pytest.approx((2.0 * 1.5 * 1.0) ** (1 / 3))
    assert on["fast_1.0"] == pytest.approx(2 / 3)  # c runs eager: not faster
    assert on["fast_1.2"] == pytest.approx(2 / 3) and off["fast_1.2"] == pytest.approx(1 / 3)
    assert on["attempts_to_90"] == pytest.approx(1.0)
    assert off["attempts_to_90"] == pytest.approx((3 + 4) / 2)
    assert on["prompt_tokens"] == 300 and on["tokens"] == 330
    assert off["wall_s"] == 7.0 and report["ablate"] == "memory"
    assert on["attempts"] == pytest.approx(4 / 3) and off["attempts"] == pytest.approx(7 / 3)


def test_memory_ablation_on_a_suite_directory(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "001_relu_small.py").write_text(RELU)
    (suite / "002_relu_wide.py").write_text(RELU.replace("16, 40", "24, 64"))
    report_path = tmp_path / "report.json"
    argv = ["bench", "--suite", str(suite), "--ablate", "memory", "--budget", "1"]
    argv += ["--seeds", "0", "--store", str(tmp_path / "stores"), "--report", str(report_path)]
    assert main([*argv, "--checkpoint", "1"]) == 0
    report = json.loads(report_path.read_text())
    assert report["complete"] is True  # rewritten after each operator; whole at the end
    assert set(report["arms"]) == {"memory_on", "memory_off"}
    assert report["checkpoint"] == 1
    for figures in report["arms"].values():
        for metric in ("pass_rate", "geomean_speedup_vs_eager", "fast_1.0", "fast_1.2"):
            assert figures[metric] is not None
        assert figures["geomean_after_checkpoint"] is not None
    rows = report["operators"]
    assert [(r["name"], r["arm"]) for r in rows] == [
        ("001_relu_small", "memory_on"),
        ("001_relu_small", "memory_off"),
        ("002_relu_wide", "memory_off"),  # the order alternates operator by operator
        ("002_relu_wide", "memory_on"),
    ]
    on = {r["store"] for r in rows if r["arm"] == "memory_on"}
    off = {r["store"] for r in rows if r["arm"] == "memory_off"}
    assert len(on) == 1 and len(off) == 2  # one store through the suite; an empty one per op
    assert all(len(r["trajectory"]) == r["attempts"] == 1 for r in rows)
    # The arms' winners were re-timed together wherever one of them runs a kernel.
    assert all(
        r["retimed"]
        == (
            r["winner"] != "eager"
            or any(o["winner"] != "eager" for o in rows if o["name"] == r["name"])
        )
        for r in rows
    )
    assert all("speedup_vs_eager_own_run" in r for r in rows if r["retimed"])


def test_passive_context_replays_every_attempt() -> None:
    task = trace_tasks(torch.nn.ReLU(), (torch.randn(4, 8),), CpuTarget())[0]
    view = task_view(task, CpuTarget())
    history = [
        Feedback(f"a{i}", f"try {i}", None, "verified", None, 1.0, 1.0, 1.0, 1.0, f"KERNEL-{i}")
        for i in range(6)
    ]
    request = ProposalRequest(view, [], "ACMI-CONTEXT", history, 3, 0)
    with ScriptedOpenAIServer([Reply()]) as server:
        from kope.agents import make_agent

        acmi = make_agent("llm", base_url=server.base_url, model="m")
        passive = make_agent("llm", base_url=server.base_url, model="m", context="passive")
        acmi_prompt = acmi.messages(request)[1]["content"]
        passive_prompt = passive.messages(request)[1]["content"]
    assert "ACMI-CONTEXT" in acmi_prompt and "ACMI-CONTEXT" not in passive_prompt
    assert "KERNEL-0" not in acmi_prompt and "try 1" not in acmi_prompt  # a window of 4
    assert all(f"KERNEL-{i}" in passive_prompt and f"try {i}" in passive_prompt for i in range(6))


def test_context_ablation_counts_the_endpoints_tokens(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "001_relu.py").write_text(RELU)
    (task,) = trace_tasks(*load_suite(suite)["001_relu"](), CpuTarget())
    answer = f"Decision: the reference loops\n```mlir\n{task.payload}\n```\n"
    with ScriptedOpenAIServer([Reply(content=answer, prompt_tokens=None)]) as server:
        config = BenchConfig(
            CpuTarget(),
            budget=3,
            ablate="context",
            agent="llm",
            agent_config={"base_url": server.base_url, "model": "scripted"},
            progress=False,
        )
        report = run_bench(load_suite(suite), config, tmp_path / "stores")
        sent = [r["messages"] for r in server.requests]
    from kope.memory.tokens import default_counter

    count = default_counter().count
    used = [sum(count(m["content"]) for m in messages) for messages in sent]
    acmi, passive = report["arms"]["context_acmi"], report["arms"]["context_passive"]
    assert acmi["pass_rate"] == passive["pass_rate"] == 1.0
    # The endpoint's usage, counted from what was sent (the arms ran in this order).
    assert len(used) == 6
    assert acmi["prompt_tokens"] == sum(used[:3]) and passive["prompt_tokens"] == sum(used[3:])
    # Passive context grows by every replayed kernel; ACMI's stays within its budget.
    kernel = count(task.payload)
    assert used[5] - used[3] >= 2 * kernel
    assert sent[5][1]["content"].count("Attempt 2:") == 1


LGAMMA = RELU.replace("torch.relu(x)", "torch.lgamma(x)")


def test_a_broken_file_and_one_kope_cannot_compile_do_not_spoil_the_suite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file with a syntax error stopped the whole bench with no table; a file none of whose
    operators KOPE compiles fell out of every denominator (pass rate 100% of what was left)."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "001_relu.py").write_text(RELU)
    (suite / "002_broken.py").write_text("import torch\nclass Model(:\n")
    (suite / "003_lgamma.py").write_text(LGAMMA)
    report_path = tmp_path / "report.json"
    argv = ["bench", "--suite", str(suite), "--budget", "1", "--report", str(report_path)]
    assert main([*argv, "--store", str(tmp_path / "stores")]) == 1  # the figures stand
    out = capsys.readouterr().out
    assert "not run: 002_broken" in out and "SyntaxError" in out
    report = json.loads(report_path.read_text())
    assert set(report["broken"]) == {"002_broken"}
    names = [r["name"] for r in report["operators"]]
    assert "001_relu" in names and "003_lgamma" in names
    eager_row = next(r for r in report["operators"] if r["name"] == "003_lgamma")
    assert eager_row["winner"] == "eager" and not eager_row["verified"]
    relu_verified = next(r for r in report["operators"] if r["name"] == "001_relu")["verified"]
    assert report["arms"]["default"]["pass_rate"] == pytest.approx(relu_verified / 2)


def test_disturbed_figures_decide_neither_the_best_so_far_nor_the_arms_comparison(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A figure the machine's load disturbed (537x for a 14x kernel) set the best either arm
    found; a disturbed joint re-timing (632x) replaced a clean figure in the report."""
    from types import SimpleNamespace

    from kope.tools import bench
    from kope.vocabulary.evidence import TIMING_CLEAN, TIMING_CONTAMINATED, Timing

    attempts = [
        SimpleNamespace(verdict="verified", speedup_vs_eager=2.0, timing_quality=TIMING_CLEAN),
        SimpleNamespace(verdict="verified", speedup_vs_eager=537.0, timing_quality="contaminated"),
        SimpleNamespace(verdict="verified", speedup_vs_eager=2.5, timing_quality=TIMING_CLEAN),
    ]
    assert bench._trajectory(attempts) == [2.0, 2.0, 2.5]

    def disturbed(task: object, target: object, kernels: dict[str, object]) -> dict[str, Timing]:
        names = ["eager", *kernels]
        return {
            n: Timing(1.0 if n != "eager" else 632.0, 0.1, 5, 1, 15, 1, quality=TIMING_CONTAMINATED)
            for n in names
        }

    monkeypatch.setattr(bench, "time_against_eager", disturbed)
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "001_relu.py").write_text(RELU)
    config = BenchConfig(CpuTarget(), budget=1, seeds=[0], ablate="memory", progress=False)
    report = run_bench(load_suite(suite), config, tmp_path / "stores")
    for row in report["operators"]:
        if row["retimed"]:
            assert row["retimed_quality"] == TIMING_CONTAMINATED
            assert row["speedup_vs_eager"] == row["speedup_vs_eager_own_run"] < 100


def test_a_joint_re_timing_puts_identical_kernels_alike_against_eager_and_the_reference() -> None:
    """Both arms ran the same kernel; against the reference lowering they read 1.82x and 1.10x,
    each arm's own run. One clean joint round now gives both one figure over eager, and one
    over the reference through the arms' common reference/eager ratio."""
    from kope.tools import bench
    from kope.vocabulary.evidence import TIMING_CLEAN, TIMING_CONTAMINATED, Timing

    def rows() -> dict[str, dict[str, object] | None]:
        return {
            "a": {"speedup_vs_eager": 2.0, "speedup_vs_reference": 1.82, "reference_us": 4.0,
                  "eager_us": 2.0},
            "b": {"speedup_vs_eager": 1.5, "speedup_vs_reference": 1.10, "reference_us": 9.0,
                  "eager_us": 2.0},
        }  # fmt: skip

    def timing(us: float, quality: str = TIMING_CLEAN) -> Timing:
        return Timing(us, 0.01, 15, 1, 15, 15, quality=quality)

    clean = rows()
    bench._apply_retiming(clean, {"eager": timing(2.0), "a": timing(1.0), "b": timing(1.0)}, True)
    a, b = clean["a"], clean["b"]
    assert a is not None and b is not None
    assert a["speedup_vs_eager"] == b["speedup_vs_eager"] == 2.0
    assert a["speedup_vs_reference"] == b["speedup_vs_reference"] == pytest.approx(2.0 * 3.0)
    assert a["speedup_vs_reference_own_run"] == 1.82
    disturbed = rows()
    bench._apply_retiming(
        disturbed, {"eager": timing(632.0, TIMING_CONTAMINATED), "a": timing(1.0)}, False
    )
    assert disturbed["a"] == {**rows()["a"], "speedup_vs_eager_own_run": 2.0,
                              "speedup_vs_reference_own_run": 1.82,
                              "retimed_quality": TIMING_CONTAMINATED}  # fmt: skip


def test_the_checkpoint_kernel_is_the_best_of_the_first_attempts_and_timed_with_the_winners() -> (
    None
):
    """An arm's best after K attempts is the fastest clean verified figure among its first K
    (a later, faster one and a disturbed one do not count; none beating eager: eager runs);
    one clean joint round gives it its figure over eager, a disturbed one leaves its own."""
    from types import SimpleNamespace

    from kope.tools import bench
    from kope.vocabulary.evidence import TIMING_CLEAN, TIMING_CONTAMINATED, VERIFIED, Timing

    def attempt(speedup: float, quality: str = TIMING_CLEAN, verdict: str = VERIFIED):
        return SimpleNamespace(speedup_vs_eager=speedup, timing_quality=quality, verdict=verdict)

    first, disturbed, later = attempt(1.3), attempt(9.0, TIMING_CONTAMINATED), attempt(2.0)
    failed = attempt(5.0, verdict="mismatch")
    assert bench._best_after([first, disturbed, failed, later], 3) is first
    assert bench._best_after([attempt(0.8), later], 1) is None  # eager runs after one

    def row() -> dict[str, object]:
        return {"speedup_vs_eager": 1.5, "speedup_vs_eager_after_checkpoint": 1.3}

    def timing(us: float, quality: str = TIMING_CLEAN) -> Timing:
        return Timing(us, 0.01, 15, 1, 15, 15, quality=quality)

    rows = {"warm": row(), "cold": row()}
    at = bench.AFTER_CHECKPOINT
    timings = {"eager": timing(3.0), "warm": timing(1.5), f"warm{at}": timing(2.0)}
    timings |= {"cold": timing(2.0)}  # the cold arm had no kernel beating eager after K
    bench._apply_retiming(rows, timings, True)  # type: ignore[arg-type]
    assert rows["warm"]["speedup_vs_eager_after_checkpoint"] == 1.5
    assert rows["cold"]["speedup_vs_eager_after_checkpoint"] == 1.0
    assert rows["warm"]["speedup_vs_eager"] == 2.0
    kept = {"warm": row()}
    bench._apply_retiming(kept, {"eager": timing(90.0, TIMING_CONTAMINATED)}, False)  # type: ignore[arg-type]
    assert kept["warm"]["speedup_vs_eager_after_checkpoint"] == 1.3


def test_prior_ablation_starts_flat_warm_from_a_copy_of_the_warm_store(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "001_relu_wide.py").write_text(RELU.replace("16, 40", "24, 64"))
    warm = tmp_path / "warm"
    model = tmp_path / "relu.py"
    model.write_text(RELU)
    argv = ["precompile", str(model), "--prior", "flat", "--budget", "1", "--store", str(warm)]
    assert main(argv) == 0
    before = {p.name: p.read_bytes() for p in warm.rglob("*") if p.is_file()}
    report_path = tmp_path / "report.json"
    argv = ["bench", "--suite", str(suite), "--ablate", "prior", "--warm-store", str(warm)]
    argv += ["--budget", "1", "--seeds", "0", "--store", str(tmp_path / "stores")]
    assert main([*argv, "--report", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    assert set(report["arms"]) == {"static", "flat", "flat_warm"}
    assert report["warm_store"] == str(warm)
    rows = {r["arm"]: r for r in report["operators"]}
    warm_keys = {t.key for t in ExperienceStore(warm).tasks()}
    for arm, row in rows.items():
        keys = {t.key for t in ExperienceStore(Path(row["store"])).tasks()}
        # Only flat_warm starts from the warm store; the cold arms from an empty one each.
        assert (warm_keys <= keys) == (arm == "flat_warm"), arm
    # The warm store was only read.
    assert {p.name: p.read_bytes() for p in warm.rglob("*") if p.is_file()} == before
