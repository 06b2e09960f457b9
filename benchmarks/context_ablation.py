"""What ACMI saves in prompt tokens: `kope bench --ablate context` with the LLM agent.

    python benchmarks/context_ablation.py [--budget 16] [--ops a,b,...] [--report out.json]
                                          [--answers copy|schedule]

No language model is reachable here, so the endpoint is KOPE's scripted OpenAI-protocol server
(`kope.testing`), started in this process. Its model copies the reference lowering out of the
prompt it is sent (a kernel that verifies, is timed and is recorded like any other), or with
`--answers schedule` answers with that reference and the transform schedule KOPE's own agent
would try at that attempt (kernels as long as scheduled kernels are). Its usage counts the
prompt it was sent with KOPE's token counter (o200k where bpe-openai is installed, else the
offline estimate). Both arms get identical answers, so what differs is only what the prompt
carried: ACMI's experience packed under its budget with a window of the last attempts
(`context_acmi`), or every earlier attempt of the operator, kernel text and feedback,
replayed (`context_passive`). Pass rates say nothing here (the answers are scripted); the
effect of the context on a real model's pass rate needs a real model.

It also prints the floor: the same prompts with no experience and no history (the system
prompt with the target's kernel forms, the operator, its reference lowering and the attempts
left), which no context can go below; each arm's prompt tokens are the endpoint's usage as the
bench's report records it. Passive over the floor is the most any context scheme could save
at this budget: with n attempts whose kernels are k times as long as the floor prompt, about
1 + k (n - 1) / 2. ACMI adds to each prompt the experience it packs under its token budget
(related operators' kernels, so it too grows with how long kernels are) and one feedback line
per recent attempt.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kope.memory.tokens import default_counter
from kope.passes.analysis import analyze, prepare_payload
from kope.spaces.cpu import schedule_space
from kope.spaces.kernels import kernel_source
from kope.spaces.schedules import describe
from kope.testing import Reply, ScriptedOpenAIServer
from kope.tools.bench import scratch_dir
from kope.tools.cli import main

ROOT = Path(__file__).resolve().parent.parent
# One operator per family of the suite, in suite order.
DEFAULT_OPS = (
    "000_act_relu_128x256,100_reduce_sum_128x256,200_softmax_softmax_128x256,"
    "300_norm_layer_norm_128x256,401_matmul_mm_129x65x97,510_conv_conv2d_same_2x8x37x37,"
    "600_pool_max_pool2d_2x16x37x37,700_index_gather_129x257,810_loss_mse_129x257,"
    "930_fused_elementwise_chain_129x513"
)
_REFERENCE = re.compile(r"Reference lowering:\n```mlir\n(.*?)```", re.S)


def copy_reference(request: dict[str, Any]) -> str:
    """The scripted model's answer: the prompt's reference lowering, unchanged."""
    body = _reference(_prompt(request))
    return f"Decision: keep the reference loops\n```mlir\n{body}\n```\n"


def write_schedule(budget: int) -> Callable[[dict[str, Any]], str]:
    """The scripted model's answer as a model that schedules its kernels would give it: the
    reference with the transform schedule that KOPE's heuristic agent's prior ranks n-th for
    it at the n-th attempt (read from "Attempts left"), so that the kernels a passive context
    replays are as long as scheduled kernels are, not copies of the reference. Both arms see
    the same sequence of answers."""

    def answer(request: dict[str, Any]) -> str:
        prompt = _prompt(request)
        body = _reference(prompt)
        left = re.search(r"Attempts left: (\d+)", prompt)
        capabilities = {
            "vector_bits": int(_capability(prompt, "vector_bits", "256")),
            "threads": int(_capability(prompt, "threads", "1")),
            "openmp": _capability(prompt, "openmp", "False") == "True",
        }
        space, _ = schedule_space(analyze(prepare_payload(body)), capabilities)
        if not space or left is None:
            return copy_reference(request)
        ranked = sorted(space, key=lambda point: -point[1])
        config = ranked[(budget - int(left.group(1))) % len(ranked)][0]
        payload = prepare_payload(
            body,
            approximate_math=bool(config.get("approximate_math")),
            narrow_f64=bool(config.get("narrow_f64")),
        )
        kernel = kernel_source(payload, analyze(payload), config)
        return f"Decision: {describe(config)}\n```mlir\n{kernel}\n```\n"

    return answer


def _prompt(request: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content", "")) for m in request.get("messages", []))


def _reference(prompt: str) -> str:
    found = _REFERENCE.search(prompt)
    return found.group(1).strip() if found else ""


def _capability(prompt: str, name: str, default: str) -> str:
    found = re.search(rf"\b{name}=(\w+)", prompt)
    return found.group(1) if found else default


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=int, default=16, help="attempts per operator")
    parser.add_argument("--ops", default=DEFAULT_OPS, help="suite operators, comma-separated")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default: 0)")
    parser.add_argument("--report", help="write the JSON report here")
    parser.add_argument(
        "--answers",
        choices=["copy", "schedule"],
        default="copy",
        help="what the scripted model answers: the reference copied (the shortest kernel that "
        "verifies) or the reference with a transform schedule, as KOPE's own agent writes "
        "(default: copy)",
    )
    args = parser.parse_args(argv)
    answer = copy_reference if args.answers == "copy" else write_schedule(args.budget)
    script = [Reply(answer=answer, prompt_tokens=None, completion_tokens=None)]
    report = Path(args.report) if args.report else scratch_dir("kope-context-") / "report.json"
    with ScriptedOpenAIServer(script) as server:
        bench = ["bench", "--suite", str(ROOT / "benchmarks" / "suite"), "--ablate", "context"]
        bench += ["--agent", "llm", "--llm-base-url", server.base_url, "--llm-model", "scripted"]
        bench += ["--budget", str(args.budget), "--seeds", args.seeds, "--ops", args.ops]
        code = main([*bench, "--report", str(report)])
        arms = json.loads(report.read_text())["arms"]
        print(floor(server.requests, arms))
        return code


def floor(requests: list[dict[str, Any]], arms: dict[str, dict[str, Any]]) -> str:
    """Each arm's prompt tokens (the endpoint's usage, from the bench's report) against the
    floor: the same prompts without experience or history. Both arms make the same requests
    (one per attempt), whose fixed parts (system prompt, operator, reference lowering, attempts
    left) are the same, so the floor per arm is half of all requests' fixed parts."""
    counter = default_counter()
    fixed_tokens = 0
    for request in requests:
        system, user = (str(m.get("content", "")) for m in request["messages"])
        found = _REFERENCE.search(user)
        fixed = user[: found.end()] if found else user
        fixed += "\n\n" + user.rsplit("\n\n", 1)[-1]  # "Attempts left: ..."
        fixed_tokens += counter.count(system) + counter.count(fixed)
    per_arm = fixed_tokens / 2
    acmi = arms["context_acmi"]["prompt_tokens"] or 0.0
    passive = arms["context_passive"]["prompt_tokens"] or 0.0
    if not (per_arm and acmi and passive):
        return "floor: no prompt was counted"
    return (
        f"floor (the same prompts without experience or history, {counter.name} count): "
        f"{per_arm:.0f} tokens per arm; passive / floor {passive / per_arm:.1f}x (the most any "
        f"context could save at this budget), ACMI / floor {acmi / per_arm:.2f}x, passive / "
        f"ACMI {passive / acmi:.1f}x"
    )


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
