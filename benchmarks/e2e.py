"""Whole models: eager vs `torch.compile(backend="kope")` vs inductor, timed in one process.

Six models of realistic small size that KOPE's tests never see: an LLM block (RMSNorm as user
code writes it, SwiGLU), a GPT-2 MLP (GELU-tanh), attention written by hand, an
`nn.TransformerEncoderLayer`, a ResNet basic block and a depthwise-separable conv block.

For each model: with `--precompile N`, `kope precompile` (heuristic agent, budget N) into a
fresh store first; then the first compile (the store as left by precompiling, or empty)
and inductor's compile are timed; a warm compile (a new dynamo cache over the same store) is
timed too; then eager, kope, inductor and `torch.compile(backend="eager")` ("dynamo": what
dynamo's frame and guards cost any backend per call) are timed against each other, interleaved, by
`kope.targets.measure.measure_interleaved` (clean-round rules: a figure whose rounds were
disturbed is marked `~`), each sample ~20 calls of one model (`--sample-ms`: the steady state
of a loop, not the first call after another model's, whose caches are cold), `--repeat`
times in a row: the figure is the median of the runs' medians, and the range of the runs'
ratios (printed `[low-high]`) says how far one process's figure moves. Ratios are eager
time / backend time.

    python benchmarks/e2e.py [--precompile 8] [--no-inductor] [--models a,b] [--sample-ms 20]
                             [--repeat 3] [--json out.json]

Run it on a quiet machine (`../shared/tools/quiet-check.sh`), with nothing else running.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LlmBlock(nn.Module):
    """Pre-norm SwiGLU feed-forward with a residual, as in LLaMA-style blocks."""

    def __init__(self, dim: int = 256, hidden: int = 688):
        super().__init__()
        self.norm = RMSNorm(dim)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Gpt2Mlp(nn.Module):
    def __init__(self, dim: int = 256):
        super().__init__()
        self.fc = nn.Linear(dim, 4 * dim)
        self.proj = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Attention(nn.Module):
    """Multi-head self-attention written out: scores, scale, softmax, weighted sum."""

    def __init__(self, dim: int = 128, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        y = torch.softmax(scores, dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Gpt2DecodeBlock(nn.Module):
    """A GPT-2 block taking one token against a cache of earlier keys and values."""

    def __init__(self, dim: int = 768, heads: int = 12):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        k, v = torch.cat([keys, k], 2), torch.cat([values, v], 2)
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class ResNetBlock(nn.Module):
    def __init__(self, channels: int = 32):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + x)


class DepthwiseSeparable(nn.Module):
    def __init__(self, channels: int = 32, out: int = 64):
        super().__init__()
        self.depthwise = nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.pointwise = nn.Conv2d(channels, out, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn2(self.pointwise(F.relu(self.bn1(self.depthwise(x))))))


# Each timing sample calls one model for about this long (`--sample-ms`).
SAMPLE_MS = 20.0


def _inputs(*shape: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(0)),)


MODELS: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "llm_block": lambda: (LlmBlock(), _inputs(32, 256)),
    "gpt2_mlp": lambda: (Gpt2Mlp(), _inputs(2, 32, 256)),  # batch × sequence × dim
    "attention": lambda: (Attention(), _inputs(2, 64, 128)),
    "encoder_layer": lambda: (
        nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True),
        _inputs(2, 32, 128),
    ),
    "resnet_block": lambda: (ResNetBlock(), _inputs(1, 32, 28, 28)),
    "depthwise_separable": lambda: (DepthwiseSeparable(), _inputs(1, 32, 28, 28)),
}


# Models outside the default set, for `--models`: a stack of convolutions deep enough that
# KOPE computes it channels-last (`kope.frontend.rewrites.channels_last`; one block is not), and
# decoding steps.
EXTRA_MODELS: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "resnet_stage": lambda: (nn.Sequential(ResNetBlock(), ResNetBlock()), _inputs(1, 32, 28, 28)),
    # One token through the LLM block (decoding at batch 1): every product a matrix-vector one;
    # and through a GPT-2-small block with 63 earlier tokens' keys and values.
    "llm_decode": lambda: (LlmBlock(), _inputs(1, 256)),
    "gpt2_decode": lambda: (
        Gpt2DecodeBlock(),
        _inputs(1, 1, 768) + _inputs(1, 12, 63, 64) + _inputs(1, 12, 63, 64),
    ),
}


def _model(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model, inputs = {**MODELS, **EXTRA_MODELS}[name]()
    return model.eval(), inputs


def run(
    name: str,
    store: Path,
    budget: int,
    inductor: bool,
    sample_s: float = SAMPLE_MS / 1e3,
    repeat: int = 1,
) -> dict[str, Any]:
    import kope
    from kope.targets.measure import MeasureConfig

    model, inputs = _model(name)
    row: dict[str, Any] = {"model": name}
    if budget:
        start = time.perf_counter()
        summary = precompile_into(store, model, inputs, budget)
        row["precompile_s"] = time.perf_counter() - start
        row["operators"] = summary["operators"]
        row["agent_wins"] = summary["agent_wins"]
    options = {"store": str(store)}
    with torch.no_grad():
        want = model(*inputs)
        fns: dict[str, Callable[[], Any]] = {"eager": lambda: model(*inputs)}
        torch._dynamo.reset()
        kope.reset_report()
        start = time.perf_counter()
        compiled = torch.compile(model, backend="kope", options=options)
        torch.testing.assert_close(compiled(*inputs), want, rtol=1e-3, atol=1e-3)
        row["kope_compile_s"] = time.perf_counter() - start
        graphs = kope.report().graphs
        row["graphs"] = [
            {
                "compiled": g.whole.compiled if g.whole else bool(any(t.jit for t in g.tasks)),
                "reason": g.whole.reason if g.whole else "",
                "tasks": len(g.tasks),
                "jit": sum(t.jit for t in g.tasks),
                # The whole-graph check's own figure: the compiled graph against the eager
                # graph, both called directly (no dynamo frame around either).
                "graph_speedup": g.whole.speedup if g.whole else None,
                "threads": g.whole.threads if g.whole else None,  # None: the caller's count
            }
            for g in graphs
        ]
        torch._dynamo.reset()
        start = time.perf_counter()
        warm = torch.compile(model, backend="kope", options=options)
        warm(*inputs)
        row["kope_warm_compile_s"] = time.perf_counter() - start
        fns["kope"] = lambda: warm(*inputs)
        # torch.compile with no backend work: what dynamo's frame and guards cost any backend.
        dynamo = torch.compile(model, backend="eager")
        dynamo(*inputs)
        fns["dynamo"] = lambda: dynamo(*inputs)
        if inductor:
            start = time.perf_counter()
            ind = torch.compile(model, backend="inductor")
            torch.testing.assert_close(ind(*inputs), want, rtol=1e-3, atol=1e-3)
            row["inductor_compile_s"] = time.perf_counter() - start
            fns["inductor"] = lambda: ind(*inputs)
        row.update(time_backends(fns, MeasureConfig(sample_s=sample_s), repeat))
    return row


def precompile_into(
    store: Path, model: nn.Module, inputs: tuple[torch.Tensor, ...], budget: int
) -> dict[str, Any]:
    """`kope precompile` of the model into `store` (heuristic agent, CPU); its summary."""
    from kope.frontend.compiler import store_at, target_for
    from kope.tools.precompile import precompile
    from kope.tuner.optimize import Budget

    report = precompile(
        model,
        inputs,
        target=target_for("cpu", 1, 120.0),
        store=store_at(store),
        budget=Budget(attempts=budget),
        progress=False,
    )
    summary: dict[str, Any] = report["summary"]
    return summary


def time_backends(fns: dict[str, Callable[[], Any]], config: Any, repeat: int) -> dict[str, Any]:
    """The backends (`fns`, "eager" among them) timed against each other, interleaved,
    `repeat` times in a row on the caller's threads: per backend the median of the runs'
    medians (`<name>_us`), whether every run was clean, and eager's ratio over it in each run
    (how far the figure moves between runs of one process)."""
    from kope.targets.measure import measure_interleaved

    threads = {n: torch.get_num_threads() for n in fns}
    runs = [measure_interleaved(fns, config, threads) for _ in range(repeat)]
    row: dict[str, Any] = {}
    for n in fns:
        row[f"{n}_us"] = statistics.median(r[n].median_us for r in runs)
        row[f"{n}_clean"] = all(r[n].clean for r in runs)
        row[f"{n}_ratios"] = [r["eager"].median_us / r[n].median_us for r in runs]
    return row


def model_parser(doc: str, default_budget: int = 8) -> argparse.ArgumentParser:
    """The arguments every whole-model benchmark here takes: the precompile budget, the store
    and whether inductor is timed too."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--precompile",
        type=int,
        default=default_budget,
        help=f"agent budget (0: none; default {default_budget})",
    )
    parser.add_argument("--no-inductor", action="store_true", help="skip the inductor column")
    parser.add_argument("--store", help="experience store (default: a fresh temporary one)")
    return parser


def store_and_header(args: argparse.Namespace, prefix: str) -> Path:
    """The store `model_parser`'s arguments name (else a fresh temporary one), after printing
    what the figures below were measured with."""
    store = Path(args.store or tempfile.mkdtemp(prefix=prefix))
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}, store {store}, "
        f"precompile budget {args.precompile}"
    )
    return store


def main(
    default_models: dict[str, Any] = MODELS, doc: str | None = __doc__, default_budget: int = 8
) -> None:
    """The command line; `benchmarks/unseen_models.py` runs it over its own models."""
    parser = model_parser(doc or "", default_budget)
    others = [m for m in {**MODELS, **EXTRA_MODELS} if m not in default_models]
    parser.add_argument(
        "--models",
        default=",".join(default_models),
        help=f"comma-separated (default: {', '.join(default_models)}; also: {', '.join(others)})",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="time each model's backends against each other this many times in a row; the "
        "figure is the median of the runs' medians, and the range of the runs' ratios is "
        "printed beside it (default 3)",
    )
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument(
        "--sample-ms",
        type=float,
        default=SAMPLE_MS,
        help="each timing sample calls one model for about this long (default 20 ms: about "
        "20 calls of these models, so a sample is the steady state of calling one model in a "
        "loop; at 2 ms, the whole-graph check's, a sample is 2 calls, the first with caches "
        "the other models left cold, which costs the compiled models' Python most)",
    )
    args = parser.parse_args()
    store = store_and_header(args, "kope-e2e-")
    rows = []
    for name in args.models.split(","):
        rows.append(
            run(
                name,
                store,
                args.precompile,
                not args.no_inductor,
                args.sample_ms / 1e3,
                args.repeat,
            )
        )
        r = rows[-1]
        mark = {n: "" if r.get(f"{n}_clean") else "~" for n in ("kope", "inductor")}

        def spread(n: str, r: dict[str, Any] = r) -> str:
            low, high = min(r[f"{n}_ratios"]), max(r[f"{n}_ratios"])
            return f" [{low:.2f}-{high:.2f}]" if len(r[f"{n}_ratios"]) > 1 else ""

        ind = (
            f"inductor {r['inductor_us']:8.1f} µs {mark['inductor']}"
            f"{r['eager_us'] / r['inductor_us']:.2f}x{spread('inductor')}"
            if "inductor_us" in r
            else ""
        )
        print(
            f"{name:<20} eager {r['eager_us']:8.1f} µs  dynamo {r['dynamo_us']:8.1f} µs  "
            f"kope {r['kope_us']:8.1f} µs {mark['kope']}{r['eager_us'] / r['kope_us']:.2f}x"
            f"{spread('kope')} ({r['dynamo_us'] / r['kope_us']:.2f}x dynamo's)  {ind}  "
            f"graphs {r['graphs']}"
        )
    kope_ratios = [r["eager_us"] / r["kope_us"] for r in rows]
    over_dynamo = [r["dynamo_us"] / r["kope_us"] for r in rows]
    print(
        f"geomean kope/eager {math.prod(kope_ratios) ** (1 / len(rows)):.2f}x, "
        f"kope/dynamo {math.prod(over_dynamo) ** (1 / len(rows)):.2f}x",
        end="",
    )
    if all("inductor_us" in r for r in rows):
        ratios = [r["eager_us"] / r["inductor_us"] for r in rows]
        print(f", inductor/eager {math.prod(ratios) ** (1 / len(rows)):.2f}x")
    else:
        print()
    for r in rows:
        times = ", ".join(
            f"{k.removesuffix('_s')} {v:.1f} s" for k, v in r.items() if k.endswith("_s")
        )
        print(f"{r['model']:<20} {times}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
