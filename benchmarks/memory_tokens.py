"""How far the offline token estimate is from the real o200k tokenizer on KOPE's prompts.

Corpus: the reference lowerings (linalg MLIR) of a set of operators as KOPE imports them,
transform-dialect schedules (the lit suite's and a block-packed matmul schedule of the kind
the heuristic agent writes), and ACMI contexts rendered from a store whose kernels are those
payloads, at several budgets; the estimator's constants were fitted on these. Held out from
the fit: the lit tests, the fault kernels and the README. Prints, per kind and overall, the signed error of
`EstimatingCounter` against `BpeCounter` (o200k_base via bpe-openai, offline).

    pip install bpe-openai
    python benchmarks/memory_tokens.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kope.frontend.partition import partition
from kope.memory.retrieval import retrieve
from kope.memory.schema import AttemptRecord, TaskRecord
from kope.memory.store import ExperienceStore
from kope.memory.tokens import BpeCounter, EstimatingCounter
from kope.targets.cpu import CpuTarget

ROOT = Path(__file__).resolve().parent.parent

BLOCK_PACK_SCHEDULE = """module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %func = transform.structured.match ops{["func.func"]} in %root : (!transform.any_op) -> !transform.any_op
    %packed = transform.apply_registered_pass "linalg-block-pack-matmul" with options = { "block-factors" = [8, 32, %KB%] } to %func : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %packed {
      transform.apply_patterns.linalg.data_layout_propagation
      transform.apply_patterns.linalg.fold_pack_unpack_into_empty
      transform.apply_patterns.tensor.fold_tensor_empty
    } : !transform.any_op
    %mmt4d = transform.structured.match ops{["linalg.generic"]} attributes {iterator_types = ["parallel", "parallel", "reduction", "parallel", "parallel", "reduction"]} in %packed : (!transform.any_op) -> !transform.any_op
    %outer, %l2 = transform.structured.tile_using_forall %mmt4d tile_sizes [0, %NB%, 0, 0, 0, 0] : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    %inner, %loops:3 = transform.structured.tile_using_for %outer tile_sizes [1, 1, 1, 0, 0, 0] interchange = [2, 0, 1] : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
    transform.apply_patterns to %func {
      transform.apply_patterns.linalg.fold_unit_extent_dims_via_reshapes
    } : !transform.any_op
    %vfunc = transform.structured.vectorize_children_and_apply_patterns %func : (!transform.any_op) -> !transform.any_op
    transform.apply_licm to %vfunc : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %vfunc : !transform.any_op
    transform.apply_patterns to %vfunc {
      transform.apply_patterns.vector.lower_contraction lowering_strategy = "outerproduct"
      transform.apply_patterns.vector.lower_outerproduct
      transform.apply_patterns.vector.transfer_permutation_patterns
      transform.apply_patterns.vector.lower_transfer max_transfer_rank = 1
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    transform.yield
  }
}
"""

OPERATORS = {
    "mm_512": (lambda a, b: a @ b, (torch.randn(512, 512), torch.randn(512, 512))),
    "mm_odd": (lambda a, b: a @ b, (torch.randn(97, 131), torch.randn(131, 61))),
    "bmm": (torch.bmm, (torch.randn(4, 64, 32), torch.randn(4, 32, 16))),
    "linear": (
        lambda x, w, b: F.linear(x, w, b),
        (torch.randn(8, 768), torch.randn(3072, 768), torch.randn(3072)),
    ),
    "conv3x3": (
        lambda x, w: F.conv2d(x, w, padding=1),
        (torch.randn(1, 16, 32, 32), torch.randn(32, 16, 3, 3)),
    ),
    "softmax": (lambda x: torch.softmax(x, -1), (torch.randn(64, 1024),)),
    "layer_norm": (lambda x: F.layer_norm(x, (768,)), (torch.randn(32, 768),)),
    "row_sum": (lambda x: x.sum(-1), (torch.randn(256, 1024),)),
    "row_max": (lambda x: x.amax(-1), (torch.randn(256, 1024),)),
    "gelu": (F.gelu, (torch.randn(128, 3072),)),
    "chain": (lambda x: torch.tanh(x) * x + x, (torch.randn(1024, 1024),)),
}


def payloads() -> dict[str, tuple[str, str, list[int]]]:
    """name -> (op, reference lowering text, output shape) for each task of OPERATORS."""
    out = {}
    for name, (fn, args) in OPERATORS.items():
        gm = make_fx(fn, tracing_mode="fake")(*args)
        for i, task in enumerate(partition(gm, CpuTarget()).tasks):
            shape = list(task.spec.outputs[0].shape)
            out[f"{name}.{i}"] = (task.op, task.payload, shape)
    return out


def schedules() -> dict[str, str]:
    found = {
        p.name: p.read_text() for p in sorted((ROOT / "test" / "lit" / "Inputs").glob("*.mlir"))
    }
    for kb, nb in ((4, 8), (8, 16), (16, 4)):
        found[f"block_pack_{kb}_{nb}"] = BLOCK_PACK_SCHEDULE.replace("%KB%", str(kb)).replace(
            "%NB%", str(nb)
        )
    return found


def contexts(kernels: dict[str, tuple[str, str, list[int]]], root: Path) -> dict[str, str]:
    """ACMI contexts rendered from a store whose attempts carry the real payloads."""
    rng = random.Random(0)
    store = ExperienceStore(root)
    decisions = [
        "tile 8x32x4 + vectorize",
        "block-pack 8x32x8 + fma",
        "tile 64 + parallel 2",
        "interchange k outermost",
        "vectorize 16 + unroll 4",
        "pad to 8 + vectorize",
    ]
    errors = [
        "kernel.mlir:14:5: error: 'vector.contract' op failed to verify that operand #1 "
        "has the same element type as the result",
        "mismatch: max abs err 3.2e-02 at [17, 4] (got 1.532, want 1.564); rtol 1e-4",
        "runtime_error: worker died with SIGSEGV while running the kernel (verify trial 2)",
        "timeout: build did not finish in 60 s",
    ]
    names = sorted(kernels)
    for name in names:
        op, text, shape = kernels[name]
        store.add_task(
            TaskRecord(
                name,
                op,
                f"{op}({'x'.join(map(str, shape))}xf32)",
                "w",
                [[shape, "float32"]],
                [[shape, "float32"]],
                "cpu",
                "cpu|bench",
            )
        )
        parent = None
        for _ in range(6):
            ok = rng.random() < 0.6
            latency = rng.uniform(5, 500)
            a = store.add_attempt(
                AttemptRecord(
                    task=name,
                    source="agent",
                    verdict="verified"
                    if ok
                    else rng.choice(["compile_error", "mismatch", "runtime_error", "timeout"]),
                    decision=rng.choice(decisions),
                    agent="heuristic",
                    parent=parent,
                    latency_us=latency if ok else None,
                    speedup_vs_eager=rng.uniform(0.3, 3) if ok else None,
                    speedup_vs_reference=rng.uniform(1, 40) if ok else None,
                    error=None if ok else rng.choice(errors),
                ),
                artifact=text,
            )
            parent = a.id if ok else parent
    return {
        f"context.{name}.{budget}": retrieve(store, name, budget).text
        for name in names[::2]
        for budget in (500, 2000, 8000)
    }


def held_out() -> dict[str, str]:
    """Texts the estimator was not fitted on: the lit tests, the fault kernels, the README."""
    files = sorted((ROOT / "test" / "lit").glob("*.mlir")) + sorted(
        (ROOT / "test" / "kernels").glob("*.mlir")
    )
    return {**{p.name: p.read_text() for p in files}, "README.md": (ROOT / "README.md").read_text()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the per-document figures here")
    args = parser.parse_args(argv)
    try:
        exact = BpeCounter()
    except ImportError:
        print("needs bpe-openai (pip install bpe-openai)", file=sys.stderr)
        return 2
    estimate = EstimatingCounter()
    kernels = payloads()
    with tempfile.TemporaryDirectory() as tmp:
        docs = {
            **{f"mlir.{k}": v[1] for k, v in kernels.items()},
            **{f"schedule.{k}": v for k, v in schedules().items()},
            **contexts(kernels, Path(tmp)),
            **{f"heldout.{k}": v for k, v in held_out().items()},
        }
    rows = []
    for name, text in docs.items():
        true, est = exact.count(text), estimate.count(text)
        rows.append(
            {
                "doc": name,
                "kind": name.split(".")[0],
                "chars": len(text),
                "o200k": true,
                "estimate": est,
                "error": (est - true) / true,
            }
        )
    print(
        f"{'kind':10s} {'docs':>5s} {'o200k tokens':>13s} {'estimate':>9s} {'total err':>10s} "
        f"{'mean |err|':>10s} {'max |err|':>10s}"
    )
    for kind in ("mlir", "schedule", "context", "heldout", "all"):
        sel = [r for r in rows if kind in ("all", r["kind"])]
        true = sum(r["o200k"] for r in sel)
        est = sum(r["estimate"] for r in sel)
        errs = [abs(r["error"]) for r in sel]
        print(
            f"{kind:10s} {len(sel):5d} {true:13d} {est:9d} {(est - true) / true:+10.1%} "
            f"{statistics.mean(errs):10.1%} {max(errs):10.1%}"
        )
    worst = max(rows, key=lambda r: abs(r["error"]))
    print(f"worst document: {worst['doc']} ({worst['o200k']} tokens, estimate {worst['estimate']})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
