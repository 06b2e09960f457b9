"""Where the microseconds of a 12-operator graph go, KOPE against eager.

The graph: 12 elementwise ops on a 64x64 tensor (`dispatch_overhead.chain`), compiled with
`kernels="reference"` and `fuse=False`, so that every op runs its own JIT kernel. Timed in one
process, interleaved (`kope.targets.measure.measure_interleaved`), each part on the inputs one
run of the graph gives it:

- eager: the model called directly, and per op;
- dynamo's frame: `torch.compile(backend="kope")` against the compiled graph called directly;
- the compiled graph's own code between kernels: the graph against the sum of its calls;
- per kernel call, peeled one layer at a time: the graph node's wrapper (`KernelCall`), the
  kernel's Python entry (contiguity checks, output allocation: `JitKernel.__call__`), filling
  the memref descriptors (`JitKernel.run`), and the call into the JIT-ed code itself (ctypes
  and the kernel's compute); beside it, a ctypes call of a C function that does nothing of
  note (`labs`), which bounds ctypes' own share.

    python benchmarks/dispatch_breakdown.py [--ops 12] [--json out.json]

Run it on a quiet machine (`../shared/tools/quiet-check.sh`), with nothing else running.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
import dispatch_overhead  # noqa: E402  (the chain lives there)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ops", type=int, default=12, help="elementwise ops in the graph")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()

    import kope
    from kope.frontend.compiler import KernelCall
    from kope.targets.measure import measure_interleaved

    dispatch_overhead.CHAIN = args.ops
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    store = tempfile.mkdtemp(prefix="kope-breakdown-")
    options = {"store": store, "kernels": "reference", "fuse": False}
    graphs: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        from kope.frontend.backend import kope_backend

        compiled = kope_backend(gm, example_inputs, options)
        owner = getattr(compiled, "__self__", None)
        if isinstance(owner, torch.fx.GraphModule):
            graphs.append(owner)
        return compiled

    with torch.no_grad():
        torch._dynamo.reset()
        kope.reset_report()
        model = torch.compile(dispatch_overhead.chain, backend=keep)
        torch.testing.assert_close(model(x), dispatch_overhead.chain(x))
        (graph,) = graphs
        calls = [n.target for n in graph.graph.nodes if isinstance(n.target, KernelCall)]
        if len(calls) != args.ops:
            raise SystemExit(f"expected {args.ops} kernel calls, the graph has {len(calls)}")
        seen: dict[int, tuple[torch.Tensor, ...]] = {}
        for call in calls:
            call.kernel = _recording(call.kernel, seen, id(call))
        graph(x)
        for call in calls:
            call.kernel = call.kernel.__wrapped__  # type: ignore[attr-defined]

        # One kernel call, peeled: all calls of the chain are alike (64x64 in, 64x64 out).
        call = calls[len(calls) // 2]
        kernel = call.kernel
        inputs = seen[id(call)]
        outs = list(kernel(*inputs))
        fn, packed = kernel._fn, kernel._packed  # type: ignore[attr-defined]
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        labs = libc.labs
        labs.argtypes, labs.restype = [ctypes.c_long], ctypes.c_long

        fns: dict[str, Callable[[], Any]] = {
            "eager": lambda: dispatch_overhead.chain(x),
            "kope (torch.compile)": lambda: model(x),
            "compiled graph": lambda: graph(x),
            "all kernel calls": lambda: [c(*seen[id(c)]) for c in calls],
            "KernelCall": lambda: call(*inputs),
            "JitKernel.__call__": lambda: kernel(*inputs),
            "JitKernel.run": lambda: kernel.run(inputs, outs),  # type: ignore[attr-defined]
            "empty list comprehension": lambda: [c for c in calls],
        }
        timed = measure_interleaved(fns, threads={n: torch.get_num_threads() for n in fns})
        # The JIT-ed code alone, in a run of its own: the descriptors it reads must point at
        # live tensors, and every other call above re-points them at outputs it then frees.
        kernel.run(list(inputs), outs)  # type: ignore[attr-defined]
        alone: dict[str, Callable[[], Any]] = {
            "JIT-ed code (ctypes)": lambda: fn(packed),
            "ctypes call of labs": lambda: labs(1),
        }
        timed.update(
            measure_interleaved(alone, threads={n: torch.get_num_threads() for n in alone})
        )
    us = {name: t.median_us for name, t in timed.items()}
    clean = all(t.clean for t in timed.values())
    n = args.ops
    # "all kernel calls" carries a list comprehension over the calls: take its cost out.
    kernel_calls = us["all kernel calls"] - us["empty list comprehension"]
    rows = [
        ("eager, per op", us["eager"] / n),
        ("kope, per op (torch.compile, everything)", us["kope (torch.compile)"] / n),
        (
            "  dynamo's frame and guards (per graph)",
            us["kope (torch.compile)"] - us["compiled graph"],
        ),
        (
            "  the compiled graph's code between kernels, per op",
            (us["compiled graph"] - kernel_calls) / n,
        ),
        ("  one kernel call, all of it", us["KernelCall"]),
        ("    the graph node's wrapper (KernelCall)", us["KernelCall"] - us["JitKernel.__call__"]),
        (
            "    contiguity checks and output allocation",
            us["JitKernel.__call__"] - us["JitKernel.run"],
        ),
        ("    memref descriptors filled", us["JitKernel.run"] - us["JIT-ed code (ctypes)"]),
        ("    the call into the JIT-ed code (ctypes + compute)", us["JIT-ed code (ctypes)"]),
        ("      of which a ctypes call costs at least", us["ctypes call of labs"]),
    ]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; a chain of {n} "
        f"elementwise ops on 64x64, each its own JIT kernel{'' if clean else ' (~: not clean)'}"
    )
    width = max(len(r[0]) for r in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value:8.2f} µs")
    per_op = (us["kope (torch.compile)"] - us["eager"]) / n
    print(f"KOPE adds {per_op:.2f} µs per op over eager (dynamo's frame included)")
    if args.json:
        figures = {"us": us, "rows": dict(rows), "clean": clean, "ops": n}
        Path(args.json).write_text(json.dumps(figures, indent=2))


def _recording(
    kernel: Callable[..., Any], seen: dict[int, tuple[torch.Tensor, ...]], key: int
) -> Callable[..., Any]:
    def run(*inputs: torch.Tensor) -> Any:
        seen[key] = inputs
        return kernel(*inputs)

    run.__wrapped__ = kernel  # type: ignore[attr-defined]
    return run


if __name__ == "__main__":
    main()
