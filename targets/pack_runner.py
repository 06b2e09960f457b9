"""Run a kernel pack where the device is: verify each Triton kernel, time it, write results.

A machine with a GPU or an NPU often has another Python and torch than KOPE's, and no
torch-mlir. `kope export --target cuda|ascend -o PACK` writes what such a machine needs: the
Triton kernels of a store, each task's eager call, the inputs of one verification trial and
the outputs the reference lowering computed from them on KOPE's machine, the tolerance to
compare with, and this runner with the two modules it loads (`triton_sandbox`, `specs`). It
needs only the standard library, torch and triton:

    python PACK/runner.py PACK [--results FILE] [--timeout-s S]

Kernels run one after another in a child process (a crash, a hang or an error is that
kernel's recorded failure, and the next kernel gets a new child) with the screen and
sandbox KOPE builds with. Per kernel: outputs poisoned with NaN,
compared against the stored reference outputs and against eager on the device; then, on a
device, eager and the kernel timed alternately by `triton.testing.do_bench` (L2 flushed
between calls; the median, with the method named in the results). Without a device it runs
kernels under Triton's interpreter and times nothing. The results file goes back to KOPE:
`kope memory import-results FILE` records every figure in the experience graph.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

RESULTS_VERSION = 1
# do_bench's own repetition budget (milliseconds of calls per figure), and rounds of it
# alternating eager and the kernel: the figure is the median over rounds.
BENCH_MS = 100
ROUNDS = 3


def _sibling(name: str) -> ModuleType:
    """A module shipped beside this file, loaded by path (no package needed)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def device_of(target: str) -> tuple[str, str]:
    """(the torch device kernels run on here, its name); the host when interpreting."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "cpu", "interpreter"
    if target == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return "cuda", f"{props.name}|sm{props.major}{props.minor}|cuda-{torch.version.cuda}"
    if target == "ascend":
        try:
            import torch_npu  # noqa: F401  (registers torch.npu)
        except ImportError:
            pass
    npu = getattr(torch, "npu", None)
    if target == "ascend" and npu is not None and npu.is_available():
        return "npu", str(npu.get_device_name(0))
    return "cpu", "interpreter"


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "npu":
        torch.npu.synchronize()  # type: ignore[attr-defined]


def _mismatch(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> str | None:
    """Why `got` is not `want` within the tolerance (NaN never passes), or None."""
    got, want = got.detach().cpu(), want.detach().cpu()
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if got.dtype.is_floating_point:
        g, w = got.double(), want.double()
        bad = ~torch.isclose(g, w, rtol=rtol, atol=atol) | g.isnan()
        bad &= ~(w.isnan() & g.isnan())
    else:
        bad = got != want
    if bad.any():
        first = tuple(int(i) for i in bad.nonzero()[0])
        return (
            f"{int(bad.sum())} of {bad.numel()} elements beyond the tolerance "
            f"(rtol {rtol:g}, atol {atol:g}), "
            f"first at {list(first)}: got {got[first].item()}, expected {want[first].item()}"
        )
    return None


def run_one(pack: Path, manifest: dict[str, Any], index: int) -> dict[str, Any]:
    """Verify and time kernel `index` of the pack; runs in the child process (`serve`)."""
    entry = manifest["kernels"][index]
    task = manifest["tasks"][entry["task"]]
    sandbox, specs = _sibling("triton_sandbox"), _sibling("specs")
    device, _ = device_of(manifest["target"])
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    data = torch.load(pack / task["data"], weights_only=True)
    inputs = [t.to(device) for t in data["inputs"]]
    result: dict[str, Any] = {"kernel": entry["digest"], "task": entry["task"]}
    # The kernel's source file (`load_launcher`), removed when this kernel is done.
    scratch = tempfile.TemporaryDirectory(prefix="kope-pack-", ignore_cleanup_errors=True)
    try:
        launch = sandbox.load_launcher((pack / entry["path"]).read_text(), Path(scratch.name))
    except sandbox.KernelRefused as err:
        return {**result, "verdict": "compile_error", "error": str(err)}
    outputs = [
        torch.full(shape, math.nan, dtype=getattr(torch, dtype), device=device)
        if dtype.startswith(("float", "bfloat"))
        else torch.zeros(shape, dtype=getattr(torch, dtype), device=device)
        for shape, dtype in task["outputs"]
    ]
    launch(*inputs, *outputs)
    _synchronize(device)
    eager = specs.eager_from_json(task["eager"]) if task.get("eager") else None
    oracles = [("the reference lowering's outputs", data["expected"])]
    if eager is not None:
        oracles.append(("eager on the device", eager(inputs)))
    for name, expected in oracles:
        for position, (got, want) in enumerate(zip(outputs, expected, strict=True)):
            rtol, atol = task["tolerances"][position]
            wrong = _mismatch(got, want, rtol, atol)
            if wrong:
                return {
                    **result,
                    "verdict": "mismatch",
                    "error": f"output {position} vs {name}: {wrong}",
                }
    result.update(verdict="verified", oracle=" and ".join(n for n, _ in oracles))
    if device == "cpu" or eager is None:
        return {
            **result,
            "method": "untimed (Triton's interpreter)" if device == "cpu" else "untimed",
        }
    import triton.testing

    # Triton-Ascend times NPU kernels with its own `do_bench_npu`; community triton, CUDA's.
    do_bench = getattr(triton.testing, "do_bench_npu", None) if device == "npu" else None
    do_bench = do_bench or triton.testing.do_bench

    kernel_call = lambda: launch(*inputs, *outputs)  # noqa: E731
    eager_call = eager.bind(inputs)  # written out once, as the worker times it
    kernel_ms, eager_ms = [], []
    for _ in range(ROUNDS):  # alternate, so drift falls on both alike
        eager_ms.append(float(do_bench(eager_call, rep=BENCH_MS, return_mode="median")))
        kernel_ms.append(float(do_bench(kernel_call, rep=BENCH_MS, return_mode="median")))
    kernel_us, eager_us = sorted(kernel_ms)[ROUNDS // 2] * 1e3, sorted(eager_ms)[ROUNDS // 2] * 1e3
    spread = (max(kernel_ms) - min(kernel_ms)) / max(min(kernel_ms), 1e-9)
    return {
        **result,
        "kernel_us": kernel_us,
        "eager_us": eager_us,
        "rounds": ROUNDS,
        "spread": spread,
        "method": f"triton.testing.{do_bench.__name__} median, L2 flushed, {ROUNDS} rounds "
        "alternating with eager",
    }


class _Child:
    """The child process kernels run in, one after another (`serve`): it pays for starting
    Python, importing torch and triton and making the device's context once, not per
    kernel. A kernel that crashes it, hangs or raises costs only a new child."""

    def __init__(self, pack: Path, env: dict[str, str]):
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), str(pack), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env,
        )
        self.buffer = b""

    def run(self, index: int, timeout_s: float) -> dict[str, Any]:
        """Kernel `index`'s result; raises TimeoutError, or EOFError when the child died."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{index}\n".encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while True:
            line, found, rest = self.buffer.partition(b"\n")
            if found:
                self.buffer = rest
                if line.startswith(b"{"):
                    result: dict[str, Any] = json.loads(line)
                    return result
                continue
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError
            self.buffer += chunk

    def tail(self) -> str:
        self.stderr.seek(0)
        lines = self.stderr.read().decode(errors="replace").strip().splitlines()
        return " | ".join(lines[-3:])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.stderr.close()


def serve(pack: Path) -> None:
    """The child's loop: a kernel index per line in, its result as one JSON line out. A
    kernel that raised may have left the device's context unusable: the child then exits,
    and the parent starts another for the next kernel."""
    manifest = json.loads((pack / "manifest.json").read_text())
    for line in sys.stdin:
        index = int(line)
        try:
            result = run_one(pack, manifest, index)
        except Exception as err:
            entry = manifest["kernels"][index]
            error = f"{type(err).__name__}: {err}".splitlines()[0][:300]
            print(json.dumps({**_failure(entry, "runtime_error", error), "fatal": True}))
            sys.stdout.flush()
            return
        print(json.dumps(result))
        sys.stdout.flush()


def _failure(entry: dict[str, Any], verdict: str, error: str) -> dict[str, Any]:
    return {"kernel": entry["digest"], "task": entry["task"], "verdict": verdict, "error": error}


def run_pack(pack: Path, timeout_s: float) -> dict[str, Any]:
    """Every kernel of the pack, in a child process that a crash, a hang or an error
    replaces (`_Child`); the results file's content."""
    manifest = json.loads((pack / "manifest.json").read_text())
    device, name = device_of(manifest["target"])
    env = dict(os.environ)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    results = []
    child: _Child | None = None
    try:
        for index, entry in enumerate(manifest["kernels"]):
            started = time.perf_counter()
            running = child or _Child(pack, env)
            child = running
            try:
                result = running.run(index, timeout_s)
                keep = not result.pop("fatal", False)
            except TimeoutError:
                result = _failure(entry, "timeout", f"no result within {timeout_s:g} s")
                keep = False
            except EOFError:
                running.proc.wait()
                status = running.proc.returncode
                error = f"the runner's child exited with status {status}: {running.tail()}"
                result = _failure(entry, "runtime_error", error)
                keep = False
            if not keep:
                running.close()
                child = None
            result["wall_s"] = time.perf_counter() - started
            results.append(result)
    finally:
        if child is not None:
            child.close()
    return {
        "version": RESULTS_VERSION,
        "pack": manifest["id"],
        "target": manifest["target"],
        "device": name,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "python": platform.python_version(),
        "results": results,
    }


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


def table(pack: Path, results: dict[str, Any]) -> str:
    """Per operator: verdict, eager and kernel figures, speedup; the geomean last."""
    manifest = json.loads((pack / "manifest.json").read_text())
    best: dict[str, dict[str, Any]] = {}
    for result in results["results"]:
        if result.get("verdict") != "verified" or "kernel_us" not in result:
            best.setdefault(result["task"], result)
            continue
        held = best.get(result["task"])
        if held is None or "kernel_us" not in held or result["kernel_us"] < held["kernel_us"]:
            best[result["task"]] = result
    lines = [f"{'operator':60} {'verdict':14} {'eager us':>10} {'kernel us':>10} {'speedup':>8}"]
    speedups = []
    for key, result in best.items():
        label = manifest["tasks"][key]["label"][:60]
        if "kernel_us" in result:
            speedup = result["eager_us"] / result["kernel_us"]
            speedups.append(speedup)
            figures = f"{result['eager_us']:10.1f} {result['kernel_us']:10.1f} {speedup:7.2f}x"
        else:
            figures = f"{'-':>10} {'-':>10} {'-':>8}"
        lines.append(f"{label:60} {result['verdict']:14} {figures}")
    if speedups:
        geomean = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
        lines.append(f"geomean speedup over eager: {geomean:.2f}x over {len(speedups)} operators")
    else:
        lines.append(f"no timed kernels (device: {results['device']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pack", type=Path, help="the kernel pack's folder")
    parser.add_argument(
        "--results", type=Path, help="where to write results (default PACK/results.json)"
    )
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per kernel")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.pack)
        return 0
    results = run_pack(args.pack, args.timeout_s)
    out = args.results or args.pack / "results.json"
    out.write_text(json.dumps(results, indent=1))
    print(table(args.pack, results))
    print(f"results: {out} (record them with `kope memory import-results {out}`)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
