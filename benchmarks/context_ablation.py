"""What ACMI saves in prompt tokens: `kope bench --ablate context` with the LLM agent.

    python benchmarks/context_ablation.py [--budget 16] [--ops a,b,...] [--report out.json]

No language model is reachable here, so the endpoint is KOPE's scripted OpenAI-protocol server
(`kope.testing`), started in this process. Its model copies the reference lowering out of the
prompt it is sent (a kernel that verifies, is timed and is recorded like any other) and its
usage counts the prompt it was sent with KOPE's token counter (o200k where bpe-openai is
installed, else the offline estimate). Both arms get identical answers, so what differs is
only what the prompt carried: ACMI's experience packed under its budget with a window of the
last attempts (`context_acmi`), or every earlier attempt of the operator, kernel text and
feedback, replayed (`context_passive`). Pass rates say nothing here (the answers are
scripted); the effect of the context on a real model's pass rate needs a real model.

It also prints the floor: the same prompts with no experience and no history (the target's
description, the operator and its reference lowering), which no context can go below. Passive
over the floor is the most any context scheme could save at this budget: with n attempts
whose kernels are about as long as the reference, about 1 + (n - 1) / 2 when the reference
is most of the prompt.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from kope.cli import main
from kope.memory.tokens import default_counter
from kope.testing import Reply, ScriptedOpenAIServer

ROOT = Path(__file__).resolve().parent.parent
# One operator per family of the suite, in suite order.
DEFAULT_OPS = (
    "000_act_relu_128x256,100_reduce_sum_128x256,200_softmax_softmax_128x256,"
    "300_norm_layer_norm_128x256,401_matmul_mm_129x65x97,510_conv_conv2d_same_2x8x37x37,"
    "600_pool_max_pool2d_2x16x37x37,700_index_gather_129x257,810_loss_mse_129x257,"
    "930_fused_elementwise_chain_129x513"
)
_REFERENCE = re.compile(r"Reference lowering:\n```mlir\n(.*?)```", re.S)
# What marks each arm's prompts once an operator has history (kope.agents.llm's sections).
_PASSIVE = "\n\nAttempt 1:\n"
_ACMI = "\n\nYour previous attempts on this operator:\n"


def copy_reference(request: dict[str, Any]) -> str:
    """The scripted model's answer: the prompt's reference lowering, unchanged."""
    prompt = "\n".join(str(m.get("content", "")) for m in request.get("messages", []))
    found = _REFERENCE.search(prompt)
    body = found.group(1).strip() if found else ""
    return f"Decision: keep the reference loops\n```mlir\n{body}\n```\n"


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=int, default=16, help="attempts per operator")
    parser.add_argument("--ops", default=DEFAULT_OPS, help="suite operators, comma-separated")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default: 0)")
    parser.add_argument("--report", help="write the JSON report here")
    args = parser.parse_args(argv)
    script = [Reply(answer=copy_reference, prompt_tokens=None, completion_tokens=None)]
    with ScriptedOpenAIServer(script) as server:
        bench = ["bench", "--suite", str(ROOT / "benchmarks" / "suite"), "--ablate", "context"]
        bench += ["--agent", "llm", "--llm-base-url", server.base_url, "--llm-model", "scripted"]
        bench += ["--budget", str(args.budget), "--seeds", args.seeds, "--ops", args.ops]
        if args.report:
            bench += ["--report", args.report]
        code = main(bench)
        print(floor(server.requests))
        return code


def floor(requests: list[dict[str, Any]]) -> str:
    """The prompts' tokens without experience or history, per arm, against what each arm sent."""
    counter = default_counter()
    sent = {"passive": 0, "acmi": 0, "first": 0}
    kept = {"passive": 0, "acmi": 0, "first": 0}
    asked = {"passive": 0, "acmi": 0, "first": 0}
    for request in requests:
        system, user = (str(m.get("content", "")) for m in request["messages"])
        arm = "passive" if _PASSIVE in user else "acmi" if _ACMI in user else "first"
        found = _REFERENCE.search(user)
        fixed = user[: found.end()] if found else user
        fixed += "\n\n" + user.rsplit("\n\n", 1)[-1]  # "Attempts left: ..."
        sent[arm] += counter.count(system) + counter.count(user)
        kept[arm] += counter.count(system) + counter.count(fixed)
        asked[arm] += 1
    if asked["passive"] != asked["acmi"] or asked["first"] % 2:
        return "floor: the arms made different numbers of requests; no floor per arm"
    per_arm = (kept["passive"] + kept["acmi"] + kept["first"]) // 2
    passive = sent["passive"] + sent["first"] // 2
    acmi = sent["acmi"] + sent["first"] // 2
    return (
        f"floor (the same prompts without experience or history, {counter.name} count): "
        f"{per_arm} tokens per arm; passive / floor {passive / per_arm:.1f}x (the most any "
        f"context could save at this budget), ACMI / floor {acmi / per_arm:.2f}x, passive / "
        f"ACMI {passive / acmi:.1f}x"
    )


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
