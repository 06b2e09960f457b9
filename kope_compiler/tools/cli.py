"""The `kope` command line."""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kope.core.errors import KopeError
from kope.core.options import KERNEL_POLICIES, Options, check_options
from kope.frontend.report import PASS_RATE
from kope.memory.standing import winner
from kope.targets import target_class
from kope.vocabulary.arguments import int_list, positive
from kope.vocabulary.registry import target_names

DEFAULT_MODEL = "transformer_block"
ABLATION_BUDGET = 4  # small on purpose: the ablation measures how fast memory gets there


def _default(name: str) -> Any:
    """The default of option `name`: every CLI default is read from `Options`."""
    return Options.default(name)


_OPTION_HELP = {
    "target": "hardware target",
    "store": "experience store directory",
    "workers": "isolated worker processes that verify and time candidates (kope precompile "
    "also optimizes that many operators at once)",
    "timeout_s": "limit in seconds for building, verifying and timing one candidate",
    "agent": "heuristic (offline) or llm (an OpenAI-compatible endpoint)",
    "budget": "attempts per operator",
    "prior": "the heuristic agent's hand-written ranking of candidates: static (it breaks ties "
    "where the experience store has no evidence) or flat (none: experience alone)",
}


def _add_option(parser: argparse.ArgumentParser, name: str, help: str | None = None) -> None:
    """`--name` for the `Options` field `name`: its type and default read from `Options`, its
    help ending with the default, so the command line and torch.compile cannot drift apart."""
    default = _default(name)
    if name == "store":
        shown = "$KOPE_HOME or ~/.cache/kope"  # None: resolved when the store opens
    else:
        shown = f"{default:g}" if isinstance(default, float) else str(default)
    flag, text = "--" + name.replace("_", "-"), f"{help or _OPTION_HELP[name]} (default: {shown})"
    if isinstance(default, (int, float)):
        parser.add_argument(flag, type=type(default), default=default, help=text)
    else:
        parser.add_argument(flag, default=default, help=text)


def _add_cuda_arch(parser: argparse.ArgumentParser) -> None:
    from kope.targets.device_compile import ARCH_VARIABLE, ARCHITECTURES, DEFAULT_ARCHITECTURES

    parser.add_argument(
        "--cuda-arch",
        type=_architectures,
        metavar="LIST",
        help="GPU architectures each verified --target cuda kernel is compiled for by Triton's "
        f"compiler, without the device: comma-separated, of {', '.join(ARCHITECTURES)}, or "
        f"none (default: ${ARCH_VARIABLE}, else {','.join(DEFAULT_ARCHITECTURES)})",
    )


def _architectures(text: str) -> str:
    """`--cuda-arch`, checked; `main` hands it to the CUDA target through its variable."""
    from kope.targets.device_compile import parse_architectures

    try:
        return ",".join(parse_architectures(text)) or "none"
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _estimate_text(op: dict[str, Any]) -> str:
    """An untimed operator's timing cell: its best roofline estimate, where one was made."""
    estimate = op.get("estimate_us")
    return "untimed" if estimate is None else f"untimed, est {estimate:.3g} µs"


def _add_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        nargs="?",
        default=DEFAULT_MODEL,
        help="file.py (defining Model, get_inputs and, if Model takes arguments, "
        "get_init_inputs), module:factory "
        "(returning (model, inputs)), or an example: mlp, cnn, transformer_block, "
        f"encoder_layer, odd_shapes (default: {DEFAULT_MODEL})",
    )


def _import_command(args: argparse.Namespace) -> int:
    from kope.frontend.compiler import target_for
    from kope.tools.models import load_model

    _check_output(args.output)
    model, inputs = load_model(args.model)
    if args.torch_mlir:
        text = _torch_mlir_import(model, inputs, args.model)
        if text is None:
            return 1
        return _write(text, args.output)
    options = Options.parse({"target": args.target})
    target = target_for(options.target, options.workers, options.timeout_s)
    if args.tasks:
        return _import_tasks(model, inputs, target, args)
    from kope.frontend.model_module import model_module

    written = model_module(model, inputs, target)
    _write(written.text, args.output)
    print(
        f"kope import: {args.model} as one module: @main calls {len(written.tasks)} distinct "
        f"Tasks (keyed as the backend keys them) and {written.glue} glue functions, with "
        f"{written.constants} weight constants",
        file=sys.stderr,
    )
    return 0


def _torch_mlir_import(model: Any, inputs: Any, name: str) -> str | None:
    """torch-mlir's own import of the whole model (torch.export, weights as constants)."""
    import torch
    from torch_mlir import fx as torch_mlir_fx

    try:
        with torch.no_grad():
            module = torch_mlir_fx.export_and_import(
                model.eval(), *inputs, output_type="linalg-on-tensors"
            )
    except Exception as err:  # torch.export or the importer refused the model
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        print(
            f"kope import: torch-mlir cannot import {name} whole "
            f"({type(err).__name__}: {first[:300]}); `kope import` without --torch-mlir cuts "
            "it as the backend does",
            file=sys.stderr,
        )
        return None
    return str(module)


def _check_output(path: str | None) -> None:
    """Refuse an output file that cannot be written before the work that would fill it."""
    if not path:
        return
    target = Path(path).expanduser()
    if target.is_dir():
        raise KopeError(f"cannot write {path}: it is a folder (give a file's path)")
    if not target.parent.is_dir():
        raise KopeError(f"cannot write {path}: its folder does not exist (create it first)")
    existed = target.exists()
    try:  # the one sure test: open it as the write will
        with target.open("a"):
            pass
    except OSError as err:
        raise KopeError(f"cannot write {path}: {err.strerror}") from None
    if not existed:
        target.unlink(missing_ok=True)


def _write(text: str, output: str | None) -> int:
    if output:
        try:
            Path(output).write_text(text)
        except OSError as err:
            raise KopeError(f"cannot write {output}: {err.strerror}") from None
    else:
        sys.stdout.write(text)
    return 0


def _import_tasks(model: Any, inputs: Any, target: Any, args: argparse.Namespace) -> int:
    from kope.core.task import tasks_module
    from kope.tools.precompile import trace

    tasks, eager = trace(model.eval(), inputs, target)
    _write(tasks_module(tasks), args.output)
    print(f"kope import: {len(tasks)} distinct Tasks of {args.model}", file=sys.stderr)
    for (_, label, reason), count in sorted(eager.items()):
        print(f"  stays eager: {label} ({count}x): {reason}", file=sys.stderr)
    return 0


def _compile_command(args: argparse.Namespace) -> int:
    import torch

    import kope
    from kope.tools.models import load_model

    options: dict[str, Any] = {
        "kernels": args.kernels,
        "target": args.target,
        "workers": args.workers,
    }
    if args.store:
        options["store"] = args.store
    check_options(options)  # before tracing: torch would hand them over only at the first call
    model, inputs = load_model(args.model)
    kope.reset_report()
    with torch.no_grad():
        compiled = torch.compile(model, backend="kope", options=options)
        start = time.perf_counter()
        got = compiled(*inputs)
        compile_s = time.perf_counter() - start
        want = model(*inputs)
        timings = _interleaved_ms(
            {"eager": lambda: model(*inputs), "kope": lambda: compiled(*inputs)}, args.repeat
        )
        eager_ms, kope_ms = timings["eager"], timings["kope"]
    error = _max_error(got, want)
    report = kope.report()
    print(report.format_table())
    print()
    # A ratio is printed only where it compares what KOPE ran: with no kernel of its own and
    # no thread count it chose, the difference is torch.compile's capture of the graph.
    ran = report.jit_share() > 0 or any(g.whole and g.whole.threads for g in report.graphs)
    ratio = f" ({eager_ms / kope_ms:.2f}x)" if ran else ""
    print(
        f"model {args.model}: first call (compile) {compile_s:.1f} s; "
        f"median of {args.repeat} calls: kope {kope_ms:.3f} ms, eager {eager_ms:.3f} ms"
        f"{ratio}; max |kope - eager| = {error:.3g}"
    )
    if not ran:
        print(
            "  (no KOPE kernel ran, so no speedup is claimed: the difference from eager is "
            "torch.compile's capture of the graph, which skips the model's Python; "
            'backend="eager" gets it too)'
        )
    if not error <= 1e-3 * max(1.0, _max_abs(want)):
        print("error: the compiled model disagrees with eager", file=sys.stderr)
        return 1
    return 0


def _interleaved_ms(fns: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """Median wall time of each callable, called in turn so that noise falls on all alike."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(values) for name, values in samples.items()}


def _flat(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat(v)]
    return []


def _max_error(got: Any, want: Any) -> float:
    """The largest |got - want|: NaN where eager has NaN, and an infinity equal to eager's,
    agree (0); a NaN or infinity where eager has another value is an infinite error."""
    pairs = list(zip(_flat(got), _flat(want), strict=True))
    return max((_error(g.double(), w.double()) for g, w in pairs if g.numel()), default=0.0)


def _error(got: Any, want: Any) -> float:
    import torch

    agree = (got.isnan() & want.isnan()) | (got == want)  # equal infinities included
    difference = torch.where(agree, 0.0, (got - want).abs()).nan_to_num(nan=float("inf"))
    return float(difference.max())


def _max_abs(value: Any) -> float:
    """The largest finite magnitude (NaN and infinities set no scale for the error)."""
    tensors = [t.double() for t in _flat(value) if t.numel()]
    finite = [t[t.isfinite()] for t in tensors]
    return max((float(t.abs().max()) for t in finite if t.numel()), default=0.0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kope",
        description="KOPE: a PyTorch compiler backend that verifies, times and remembers the "
        "fastest kernel of every operator. Use it from Python as "
        "torch.compile(model, backend='kope').",
    )
    parser.add_argument("--log", choices=["debug", "info", "warning"], help="log level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    compile_p = sub.add_parser(
        "compile",
        help="compile a model with backend='kope', run it, and show each operator's kernel",
        description="Compile MODEL with torch.compile(backend='kope'), check it against eager, "
        "and print, per operator, the kernel it runs and its latency against eager.",
    )
    _add_model(compile_p)
    compile_p.add_argument(
        "--kernels",
        choices=KERNEL_POLICIES,
        default=_default("kernels"),
        help="auto: fastest verified kernel; reference: the reference "
        "lowering wherever it verifies; eager: ATen only "
        f"(default: {_default('kernels')})",
    )
    for name in ("target", "store", "workers"):
        _add_option(compile_p, name)
    compile_p.add_argument(
        "--repeat",
        type=positive(int),
        default=100,
        help="calls timed for the end-to-end comparison (default: 100)",
    )
    compile_p.set_defaults(run=_compile_command)
    import_p = sub.add_parser(
        "import",
        help="write a model as one linalg-on-tensors MLIR module, for kope-opt",
        description="Trace MODEL as torch.compile(backend='kope') does and write it as one "
        "linalg-on-tensors module: each of the backend's Tasks a function with the backend's "
        "kope.key, its label and its ATen call; views and operators the backend leaves to ATen "
        "glue functions (kope.glue); @main calling them, weights as constants. The input of "
        "`kope-opt --pass-pipeline='builtin.module(kope-outline-operators,kope-optimize{store=S},"
        "kope-apply-kernels{store=S},kope-lower-cpu)'`, which then optimizes, applies and "
        "lowers exactly the kernels torch.compile(backend='kope') looks up.",
    )
    _add_model(import_p)
    import_p.add_argument("-o", "--output", help="the file to write (default: standard output)")
    form = import_p.add_mutually_exclusive_group()
    form.add_argument(
        "--tasks",
        action="store_true",
        help="write only the distinct Tasks, without @main (a model with graph breaks, or "
        "with operators that run only in ATen, has them too)",
    )
    form.add_argument(
        "--torch-mlir",
        action="store_true",
        help="write torch-mlir's own import of the whole model instead (torch.export, one "
        "function): IR as other tools make it, which kope-outline-operators cuts per linalg "
        "operator, not as the backend does",
    )
    _add_option(import_p, "target")
    import_p.set_defaults(run=_import_command)
    _add_precompile(sub)
    _add_bench(sub)
    _add_export(sub)
    from kope.memory.cli import add_commands

    memory_sub = add_commands(sub)
    _add_memory_remeasure(memory_sub)
    _add_memory_import_results(memory_sub)
    return parser


def _add_export(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="write a kernel pack: a store's verified Triton kernels, to run where the device is",
        description="Write the verified Triton kernels of the store's tasks on TARGET, with "
        "each task's eager call, one trial's inputs, the reference lowering's outputs for "
        "them, and a runner that needs only torch and triton: `python PACK/runner.py PACK` "
        "on the device's machine verifies and times each kernel and writes PACK/results.json, "
        "which `kope memory import-results` records.",
    )
    p.add_argument(
        "--target",
        required=True,
        choices=target_names(),
        help="the device's target (one that builds Triton kernels)",
    )
    p.add_argument("-o", "--output", required=True, help="the pack's folder")
    p.add_argument(
        "--per-task",
        type=positive(int),
        metavar="N",
        help="at most N kernels per task, the best roofline estimates first, so that a short "
        "device run times the likeliest winners (default: every kernel that compiles)",
    )
    _add_cuda_arch(p)
    _add_option(p, "store")
    p.set_defaults(run=_export_command)


def _export_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kope.frontend.compiler import store_at
    from kope.tools.kernel_pack import export_pack
    from kope.vocabulary.home import kope_home

    store = store_at(Path(args.store) if args.store else kope_home())
    summary = export_pack(store, args.target, Path(args.output), per_task=args.per_task)
    for label, why in summary.skipped:
        print(f"{label}: left out ({why})")
    if not summary.kernels:
        print(f"wrote no kernel to {summary.path}: every task with one was left out (above)")
        return 1
    print(
        f"wrote {summary.kernels} kernels of {summary.tasks} tasks to {summary.path} "
        f"({summary.bytes / 2**20:.1f} MiB); run `python {summary.path}/runner.py "
        f"{summary.path}` where the device is"
    )
    return 0


def _add_memory_import_results(memory_sub: Any) -> None:
    from kope.memory.cli import store_command

    p = store_command(
        memory_sub,
        "import-results",
        "record a kernel pack runner's results (per kernel: verdict, eager and kernel figures "
        "on the device) as attempts of each task under the device's target key; a kernel "
        "measured again by a later run confirms its first figure",
        _memory_import_results_command,
    )
    p.add_argument("results", help="the runner's results file (PACK/results.json)")
    p.add_argument("--pack", help="the pack's folder (default: the results file's folder)")


def _memory_import_results_command(args: argparse.Namespace, store: Any) -> int:
    from pathlib import Path

    from kope.memory.cli import MemoryCommandError
    from kope.tools.kernel_pack import PackError, import_results

    try:
        recorded = import_results(store, Path(args.results), Path(args.pack) if args.pack else None)
    except PackError as err:
        raise MemoryCommandError(str(err)) from None
    timed = sum(1 for a in recorded if a.latency_us is not None)
    print(f"recorded {len(recorded)} attempts ({timed} timed on the device) in {store.root}")
    return 0


def _add_memory_remeasure(memory_sub: Any) -> None:
    from kope.memory.cli import store_command

    p = store_command(
        memory_sub,
        "remeasure",
        "re-time the stored choices of tasks against eager now (a new confirmation replaces "
        "each stale figure); only tasks of this target key (this hardware and these KOPE, "
        "torch and torch-mlir versions) whose records hold their eager call can be rebuilt "
        "from the store: re-time others with `kope precompile MODEL --remeasure` (and tasks of "
        "an older version are re-validated when a compile meets them)",
        _memory_remeasure_command,
    )
    p.add_argument("keys", nargs="*", metavar="KEY", help="task keys or prefixes (default: all)")
    for name in ("target", "timeout_s"):
        _add_option(p, name)


def _memory_remeasure_command(args: argparse.Namespace, store: Any) -> int:
    from kope.frontend.compiler import target_for
    from kope.frontend.report import speedup_text
    from kope.memory.cli import resolve_key
    from kope.tools.eager_json import task_from_record
    from kope.tuner.measuring import remeasure, threads_now
    from kope.vocabulary.evidence import SOURCE_REFERENCE

    target = target_for(args.target, 1, args.timeout_s)
    keys = [resolve_key(store, k) for k in args.keys] or [t.key for t in store.tasks()]
    skipped = 0
    for key in keys:
        record = store.task(key)
        assert record is not None
        reference = next(
            (a for a in reversed(store.attempts(key)) if a.source == SOURCE_REFERENCE), None
        )
        # Tasks keep their reference lowering; older records have it only as an attempt's.
        artifact = record.payload or (reference.artifact if reference else None)
        payload = store.get_artifact(artifact) if artifact else None
        task = task_from_record(record, payload) if payload is not None else None
        why = (
            "measured under another target key"
            if record.target_key != target.key()
            else "its record holds no eager call or reference lowering"
            if task is None
            else ""
        )
        if task is None or why:
            skipped += 1
            print(f"{record.label}: not re-measured ({why})")
            continue
        new = remeasure(task, target, store)
        best = winner(store.attempts(key), threads_now()).best
        kernel = best.source if best is not None else "eager"
        quality = new[-1].timing_quality if new else "unknown"
        speed = ""
        if best is not None and best.speedup_vs_eager:
            speed = f" {speedup_text(best.speedup_vs_eager, best.timing_quality)} eager"
        print(f"{record.label}: {kernel}{speed} ({len(new)} new attempts, {quality})")
    print(f"re-measured {len(keys) - skipped} of {len(keys)} tasks in {store.root}")
    return 0


def _add_precompile(sub: Any) -> None:
    p = sub.add_parser(
        "precompile",
        help="optimize each distinct operator of a model offline (agent + verification + memory)",
        description="Trace MODEL as the backend does, let the agent optimize each distinct "
        "operator (every candidate built, verified against the reference lowering and timed in "
        "an isolated worker), record everything in the experience store, and write a report. "
        "Re-running resumes: operators whose budget is spent are not redone (on a quiet "
        "machine, proposals whose timing other work disturbed are timed again). The summary's "
        f"pass rate is {PASS_RATE}. A pipeline that fails is listed with the kope-opt command "
        "that reproduces it.",
    )
    _add_model(p)
    for name in ("target", "agent", "budget", "prior"):
        _add_option(p, name)
    p.add_argument("--wall-s", type=positive(float), help="wall-clock limit per operator, seconds")
    p.add_argument("--tokens", type=positive(int), help="LLM token limit per operator")
    p.add_argument("--report", help="write the JSON report here")
    _add_option(p, "store")
    _add_option(p, "workers")
    p.add_argument("--seed", type=int, default=0, help="seed of the agent (default: 0)")
    _add_option(p, "timeout_s")
    _add_cuda_arch(p)
    p.add_argument("--llm-base-url", help="OpenAI-compatible endpoint (default: $OPENAI_BASE_URL)")
    p.add_argument("--llm-model", help="model name (default: $KOPE_LLM_MODEL)")
    p.add_argument(
        "--remeasure",
        action="store_true",
        help="first re-time each operator's stored choice against eager now (a new "
        "confirmation replaces a figure measured under load or by an older KOPE)",
    )
    p.add_argument(
        "--cluster",
        metavar="SPEC",
        help="fan the operators out over a Ray cluster: ray (a local cluster KOPE starts and "
        "stops), ray://HOST:PORT, or auto (join $RAY_ADDRESS); needs pip install 'kope[ray]'",
    )
    p.add_argument(
        "--task-threads",
        type=positive(int),
        help="with --cluster: threads each operator's task requests and measures with "
        "(default: this process's torch thread count)",
    )
    p.set_defaults(run=_precompile_command)


def _add_bench(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="a suite of operators through kope precompile, and the ablations (paper-style tables)",
        description="Run a suite of operators through kope precompile in a fixed order on one "
        "store per seed and print the paper-style table: pass rate, geomean speedup vs eager "
        "and vs the reference lowering, fast_1.0 and fast_1.2, tokens, attempts to 90% of "
        "the best kernel, wall time. The suite is a directory of files each defining Model, "
        "get_inputs and get_init_inputs (--suite DIR; benchmarks/suite in the repository), or "
        "a built-in one: 'suite' (kope.suite.OPSET) or 'ablation' (kope.suite.SEQUENCE with "
        "--ablate memory). --ablate runs arms side by side at identical inputs and budgets "
        "(memory: one store through the suite vs an empty store per operator; context: ACMI "
        "vs every earlier attempt replayed in the prompt, for --agent llm; prior: the static "
        "prior and the flat prior, each from an empty store per operator, against the flat "
        "prior starting from a copy of --warm-store and carried through the suite), each "
        "operator's arms back to back and their winners re-timed together in one round. "
        "--warm-store DIR starts every arm that carries a store through the suite from a copy "
        "of DIR (DIR is only read). "
        f"Pass rate is {PASS_RATE}.",
    )
    p.add_argument(
        "what",
        nargs="?",
        choices=["suite", "ablation"],
        help="a built-in suite instead of --suite: suite (kope.suite.OPSET), ablation "
        "(kope.suite.SEQUENCE, --ablate memory)",
    )
    p.add_argument("--suite", metavar="DIR", help="a directory of suite files (Model, get_inputs)")
    p.add_argument(
        "--ablate", choices=["memory", "context", "prior"], help="arms side by side (see above)"
    )
    p.add_argument(
        "--warm-store",
        metavar="DIR",
        help="an experience store each store-carrying arm starts from a copy of (only read; "
        "required by --ablate prior)",
    )
    for name in ("target", "agent", "prior"):
        _add_option(p, name)
    p.add_argument(
        "--budget",
        type=positive(int),
        help=f"attempts per operator (default: {_default('budget')}; with --ablate "
        f"{ABLATION_BUDGET})",
    )
    p.add_argument(
        "--seeds", type=int_list, help="comma-separated seeds (default: 0; with --ablate 0,1,2)"
    )
    p.add_argument(
        "--checkpoint",
        type=positive(int),
        metavar="K",
        help="also re-time each arm's best kernel after its first K attempts, in one "
        "interleaved round with the winners (a warm store after budget/4 attempts against a "
        "cold search's final, from one measurement)",
    )
    p.add_argument(
        "--ops",
        help="only these suite operators, comma-separated, in the suite's order (default: all)",
    )
    p.add_argument(
        "--flat-prior",
        dest="prior",
        action="store_const",
        const="flat",
        default=_default("prior"),
        help="the same as --prior flat",
    )
    p.add_argument(
        "--store",
        metavar="DIR",
        help="where the arms' stores are kept (default: a fresh temporary directory)",
    )
    p.add_argument(
        "--report",
        help="write the JSON report here (rewritten after every operator, so a run cut short "
        "keeps its figures, marked complete: false)",
    )
    p.add_argument(
        "--plot",
        metavar="DIR",
        help="write plots here (PNG and SVG; needs pip install 'kope[bench]')",
    )
    p.add_argument("--llm-base-url", help="OpenAI-compatible endpoint (default: $OPENAI_BASE_URL)")
    p.add_argument("--llm-model", help="model name (default: $KOPE_LLM_MODEL)")
    p.add_argument(
        "--cluster",
        metavar="SPEC",
        help="run each operator's precompile on a Ray cluster (as `kope precompile "
        "--cluster`: ray, ray://HOST:PORT or auto)",
    )
    _add_option(p, "timeout_s")
    p.set_defaults(run=_bench_command)


def _bench_command(args: argparse.Namespace) -> int:
    from contextlib import nullcontext
    from pathlib import Path

    from kope.frontend.compiler import target_for
    from kope.tools import bench
    from kope.tools.suite import OPSET, SEQUENCE, load_suite

    if args.suite and args.what:
        raise KopeError(f"give either --suite DIR or the built-in {args.what!r} suite, not both")
    if args.suite:
        suite, name = load_suite(args.suite), str(args.suite)
    elif args.what == "ablation":
        suite, name = SEQUENCE, "kope.suite.SEQUENCE"
    else:
        suite, name = OPSET, "kope.suite.OPSET"
    ablate = args.ablate or ("memory" if args.what == "ablation" else None)
    if args.ops:
        wanted = args.ops.split(",")
        unknown = [n for n in wanted if n not in suite]
        if unknown:
            raise KopeError(
                f"--ops names {', '.join(unknown)}, not in the suite {name}; it has "
                f"{', '.join(suite)}"
            )
        suite = {n: f for n, f in suite.items() if n in wanted}  # the suite's fixed order
    check_options(
        {
            "target": args.target,
            "agent": args.agent,
            "timeout_s": args.timeout_s,
            # The prior ablation sets each arm's prior itself.
            "prior": _default("prior") if ablate == "prior" else args.prior,
        }
    )
    _check_output(args.report)
    if args.plot:
        from kope.tools.plots import require_matplotlib

        require_matplotlib()
        if Path(args.plot).expanduser().exists() and not Path(args.plot).expanduser().is_dir():
            raise KopeError(f"--plot {args.plot} is a file: give a folder for the plots")
    if ablate == "context" and args.agent != "llm":
        raise KopeError(
            "--ablate context compares what the LLM agent is sent under ACMI and passive "
            "context; the heuristic agent reads no prompt: add --agent llm"
        )
    if ablate == "prior" and args.agent != "heuristic":
        raise KopeError(
            "--ablate prior compares the heuristic agent's priors; the llm agent has none: "
            "use --agent heuristic"
        )
    if ablate == "prior" and not args.warm_store:
        raise KopeError(
            "--ablate prior needs --warm-store DIR: its flat_warm arm starts from a copy of that "
            "store (gather one with kope precompile FILE --prior flat --store DIR)"
        )
    warm_store = _warm_store(args.warm_store) if args.warm_store else None
    agent_config: dict[str, Any] = {"prior": args.prior}
    if args.agent == "llm":
        agent_config.update(base_url=args.llm_base_url, model=args.llm_model)
    seeds = args.seeds or ([0, 1, 2] if ablate else [0])
    budget = args.budget or (ABLATION_BUDGET if ablate else _default("budget"))  # None: default
    config = bench.BenchConfig(
        target_for(args.target, 1, args.timeout_s),
        budget,
        seeds=seeds,
        ablate=ablate,
        agent=args.agent,
        agent_config=agent_config,
        cluster=args.cluster,
        report_path=Path(args.report) if args.report else None,
        warm_store=warm_store,
        checkpoint=args.checkpoint,
    )
    work = Path(args.store) if args.store else bench.scratch_dir("kope-bench-")
    if args.store and any(work.glob("*-seed*")):
        print(
            f"note: {work} holds stores of an earlier bench; operators already optimized there "
            "resume rather than start fresh, so the arms no longer start from empty stores "
            "(give an empty folder for a fresh run)",
            file=sys.stderr,
        )
    if args.cluster:
        from kope.tools.cluster import connected

        cluster: Any = connected(args.cluster)  # one cluster for the whole suite
    else:
        cluster = nullcontext()
    with cluster:
        result = bench.run_bench(suite, config, work, name)
    print(bench.format_bench(result))
    if args.report:
        bench.write_json(result, Path(args.report))
    failed = 1 if result["broken"] else 0  # the figures stand, without those entries
    if args.plot:
        from kope.memory.store import ExperienceStore
        from kope.tools.plots import plot_report

        deepest = max(result["operators"], key=lambda r: r["attempts"], default=None)
        store = ExperienceStore(Path(deepest["store"])) if deepest and deepest["store"] else None
        for path in plot_report(result, Path(args.plot), store):
            print(f"plot: {path}")
    print(f"stores: {work}")
    return failed


def _warm_store(given: str) -> Path:
    """`--warm-store DIR`, checked to hold an experience store before any arm runs."""
    from kope.memory.merge import MergeError, check_sources

    try:
        (path,) = check_sources([Path(given)], None)
    except MergeError as err:
        raise KopeError(f"--warm-store: {err}") from None
    return path


def _precompile_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kope.frontend.compiler import store_at, target_for
    from kope.frontend.report import counted
    from kope.tools.models import load_model
    from kope.tools.precompile import Interrupted, precompile, write_report
    from kope.tuner.optimize import Budget
    from kope.vocabulary.home import kope_home

    # The same checks and messages as the backend's options, before the model is traced.
    check_options(
        {
            "target": args.target,
            "agent": args.agent,
            "budget": args.budget,
            "prior": args.prior,
            "workers": args.workers,
            "timeout_s": args.timeout_s,
        }
    )
    _check_output(args.report)
    model, inputs = load_model(args.model)
    store = store_at(Path(args.store) if args.store else kope_home())
    target = target_for(args.target, max(1, args.workers), args.timeout_s)
    agent_config: dict[str, Any] = {"prior": args.prior}
    if args.agent == "llm":
        agent_config.update(base_url=args.llm_base_url, model=args.llm_model)
    budget = Budget(attempts=args.budget, wall_s=args.wall_s, tokens=args.tokens)
    try:
        report = precompile(
            model,
            inputs,
            target=target,
            store=store,
            agent_name=args.agent,
            agent_config=agent_config,
            budget=budget,
            workers=args.workers,
            seed=args.seed,
            remeasure=args.remeasure,
            cluster=args.cluster,
            task_threads=args.task_threads,
        )
    except Interrupted as stop:
        if args.report:
            write_report(stop.report, Path(args.report))
        print(format_report(stop.report))
        done = len(stop.report["operators"])
        print(
            f"kope: interrupted after {counted(done, 'operator')}; every attempt made is in the "
            "store, and running the command again resumes from it",
            file=sys.stderr,
        )
        return 130
    if args.report:
        write_report(report, Path(args.report))
    print(format_report(report))
    return 0


def format_report(report: dict[str, Any]) -> str:
    """The report as a table: per operator winner, speedups and attempts; then the summary."""
    from kope.frontend.report import counted, shorten, table_lines, timing_text
    from kope.frontend.report import speedup_text as _x

    rows = [("operator", "winner", "vs eager", "vs reference", "timing", "attempts", "verdicts")]
    s = report["summary"]
    timed = s.get("timed", True)
    for op in report["operators"]:
        verdicts = " ".join(f"{k}:{v}" for k, v in op["verdicts"].items())
        quality = op.get("timing_quality", "unknown")
        rows.append(
            (
                shorten(op["label"], 58),
                op["winner"],
                _x(op["speedup_vs_eager"], quality),
                _x(op["speedup_vs_reference"], quality),
                timing_text(op) if timed else _estimate_text(op),
                str(op["attempts"]),
                verdicts,
            )
        )
    lines = table_lines(rows)
    if not timed:
        lines.append(
            f"untimed: the {s['target']} target has no device here, so its kernels were verified "
            "under Triton's interpreter and nothing was timed; `kope export --target "
            f"{s['target']} -o PACK` takes them to the device "
            f"({target_class(s['target']).check_script})"
        )
        if any(op.get("estimate_us") is not None for op in report["operators"]):
            lines.append(
                "est: the best kernel's roofline estimate on the GPUs it was compiled for, from "
                "its registers, shared memory and grid: an estimate, not a timing; a kernel "
                "Triton's compiler refuses counts as compile_error"
            )
    elif any(op.get("timing_quality") != "clean" for op in report["operators"]):
        lines.append(
            "~: a figure that is not clean (measured under load, or before KOPE judged timings); "
            "it pins no kernel until `kope precompile --remeasure` times it cleanly"
        )
    rate = "-" if s["pass_rate"] is None else f"{s['pass_rate']:.0%}"
    # What sped up comes first: a pass rate of 100% beside no winning agent kernel is no
    # success, and read first it looked like one.
    lines.append(
        f"{s['operators']} operators; agent wins {s['agent_wins']}; geomean speedup "
        f"{_x(s['geomean_speedup_vs_eager'])} vs eager, "
        f"{_x(s['geomean_speedup_vs_reference'])} vs reference; pass rate {rate} ({PASS_RATE}); "
        f"tokens {s['tokens']}; {s['wall_s']:.0f} s"
    )
    if s["operators"] and not s["agent_wins"]:
        lines.append(
            "no agent kernel won: each operator runs its reference lowering or eager ATen, "
            "whichever was faster"
        )
    if timed:
        lines.append(
            "timing: 'clean 15/35' is a figure from 15 rounds that no other work disturbed, "
            "of 35 run (disturbed ones are run again), enough to trust; 'contaminated' is not"
        )
        lines.append(
            "speedups are of each operator alone against its own eager call; whether its kernel "
            "pays inside the model is decided by the whole-graph check (below, for each graph "
            "of the model), and `kope compile` and `kope.report()` say what runs"
        )
    for index, graph in enumerate(report.get("graphs", [])):
        runs = "the compiled graph runs" if graph["compiled"] else "eager's graph runs"
        if graph["clean"] and graph["speedup_vs_eager"]:
            runs += f" (the compiled graph timed {graph['speedup_vs_eager']:.2f}x eager's)"
        elif not graph["clean"]:
            # A disturbed figure is no speedup: it is not printed as one.
            runs += " (timed on a busy machine: the next `kope precompile` times it again)"
        lines.append(f"graph {index}: {runs}; recorded for every later process: {graph['reason']}")
    eager = report.get("eager", [])
    if eager:
        lines.append(f"{counted(len(eager), 'compute operator')} run eagerly, not optimized:")
        lines += [
            f"  {e.get('label', e['op'])} ({counted(e['sites'], 'site')}): "
            f"{shorten(e['reason'], 120)}"
            for e in eager
        ]
    failed = [(op["label"], cmd) for op in report["operators"] for cmd in op.get("repro", [])]
    if failed:
        lines.append(f"{counted(len(failed), 'pipeline failure')}; each reproduces with kope-opt:")
        lines += [f"  {shorten(label, 58)}: {cmd}" for label, cmd in failed]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.log:
        logging.basicConfig(format="[%(name)s] %(levelname)s: %(message)s")
        logging.getLogger("kope").setLevel(args.log.upper())
    from kope.targets.device_compile import ARCH_VARIABLE, configured_architectures

    if getattr(args, "cuda_arch", None):
        os.environ[ARCH_VARIABLE] = args.cuda_arch  # read by the CUDA target, here and in Ray
    try:
        configured_architectures()
    except ValueError as err:  # a bad KOPE_CUDA_ARCH: said once, plainly, before any work
        print(f"kope: error: {err}", file=sys.stderr)
        return 2
    try:
        code: int = args.run(args)
        return code
    except KeyboardInterrupt:
        # Every attempt is durable once made: a rerun resumes where this one stopped.
        print(
            "kope: interrupted; what was recorded is kept, and running the command again "
            "resumes from it",
            file=sys.stderr,
        )
        return 130
    except BrokenPipeError:  # `kope memory stats | head`: the reader has what it wanted
        sys.stderr.close()  # nothing more can be said; keep Python from complaining at exit
        return 0
    except Exception as err:
        meant = _meant_for_the_user(err)
        if meant is None:
            raise
        print(f"kope: error: {meant}", file=sys.stderr)
        return 2


def _meant_for_the_user(err: BaseException) -> BaseException | None:
    """The `KopeError` (or store error) `err` is or wraps: torch.compile hands a backend's
    errors on inside its own (`BackendCompilerFailed`), traceback and all."""
    from kope.memory.store import StoreError

    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, (KopeError, StoreError)):
            return seen
        inner = getattr(seen, "inner_exception", None)
        seen = inner if isinstance(inner, BaseException) else seen.__cause__
    return None


if __name__ == "__main__":
    sys.exit(main())
