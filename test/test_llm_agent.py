"""The LLM agent against a local server that speaks the chat-completions protocol and replays
scripted answers: good, broken, hostile, failing and slow."""

from __future__ import annotations

import dataclasses
import logging
import socket
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kope.agents import make_agent
from kope.agents.base import ProposalRequest, Rejected
from kope.agents.llm import extract_kernel
from kope.core.errors import KopeError
from kope.frontend.partition import partition
from kope.memory.store import ExperienceStore
from kope.targets.cpu import CpuTarget
from kope.testing import Reply, ScriptedOpenAIServer
from kope.tuner.optimize import Budget, optimize_task, task_view
from kope.vocabulary.kernels import FORM_TRITON

SECRET = "sk-test-must-never-be-stored-4242"


@pytest.fixture(scope="module")
def target():
    cpu = CpuTarget(workers=1, timeout_s=60)
    yield cpu
    cpu.close()


@pytest.fixture(scope="module")
def task():
    return partition(
        make_fx(torch.relu, tracing_mode="fake")(torch.randn(16, 32)), CpuTarget()
    ).tasks[0]


def _agent(server: ScriptedOpenAIServer, **kw):
    return make_agent("llm", base_url=server.base_url, model="scripted", api_key=SECRET, **kw)


def good_answer(payload: str) -> str:
    return f"Decision: keep the reference loops\n```mlir\n{payload}\n```\n"


def test_scripted_session_records_every_outcome(task, target, tmp_path: Path, caplog) -> None:
    hostile_mlir = (
        "```mlir\nfunc.func private @system(i64) -> i32\nfunc.func @main() { return }\n```"
    )
    hostile_python = "```python\nimport subprocess\nsubprocess.run(['sh'])\n```"
    wrong_signature = (
        "```mlir\nfunc.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n"
        "  return %a : tensor<4xf32>\n}\n```"
    )
    script = [
        Reply(status=500),  # retried by the client
        Reply(content=good_answer(task.payload), prompt_tokens=321, completion_tokens=123),
        Reply(content="I would rather not."),
        Reply(content=hostile_mlir),
        Reply(content=hostile_python),
        Reply(content=wrong_signature),
        Reply(raw_body="{this is not json"),
        Reply(status=429),
        Reply(status=429),
    ]
    store = ExperienceStore(tmp_path)
    with caplog.at_level(logging.DEBUG), ScriptedOpenAIServer(script) as server:
        agent = _agent(server, max_retries=1)
        summary = optimize_task(task, target, store, agent, Budget(attempts=7))
        agent.close()
    attempts = [a for a in store.attempts(task.key) if a.source == "agent"]
    assert [a.verdict for a in attempts] == ["verified"] + ["compile_error"] * 6
    errors = [a.error or "" for a in attempts]
    assert "no kernel" in errors[1]
    assert "external functions" in errors[2]
    assert "imports subprocess" in errors[3]
    assert "signature" in errors[4]
    assert "malformed" in errors[5]
    assert "HTTP 429" in errors[6]
    assert attempts[0].tokens_in == 321 and attempts[0].tokens_out == 123
    assert attempts[0].model == "scripted" and attempts[0].agent == "llm"
    assert attempts[0].decision.startswith("keep the reference loops")
    assert summary.verified and summary.tokens >= 444
    request = server.requests[1]
    assert request["model"] == "scripted"
    prompt = request["messages"][1]["content"]
    assert "aten.relu" in prompt and "func.func @main" in prompt
    assert "previous attempts" not in prompt  # the first answered request had no history yet
    later = server.requests[3]["messages"][1]["content"]
    assert "previous attempts" in later and "no kernel" in later  # feedback is passed on
    # The API key reaches the server, and nowhere else.
    assert server.requests[0]["_authorization"] == f"Bearer {SECRET}"
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in caplog.text


def test_slow_answer_is_a_failed_attempt(task, target, tmp_path: Path) -> None:
    with ScriptedOpenAIServer([Reply(content=good_answer(task.payload), delay_s=3)]) as server:
        agent = _agent(server, timeout_s=0.5, max_retries=0)
        result = agent.propose(ProposalRequest(task_view(task, target)))
        agent.close()
    assert isinstance(result, Rejected) and "in time" in result.reason


def test_unreachable_endpoint_is_a_clear_error(task, target) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agent = make_agent(
        "llm", base_url=f"http://127.0.0.1:{port}/v1", model="m", api_key=SECRET, max_retries=0
    )
    with pytest.raises(KopeError) as err:
        agent.propose(ProposalRequest(task_view(task, target)))
    message = str(err.value)
    assert f"127.0.0.1:{port}" in message and "OPENAI_BASE_URL" in message
    assert SECRET not in message


def test_missing_model_name_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.delenv("KOPE_LLM_MODEL", raising=False)
    with pytest.raises(KopeError, match="KOPE_LLM_MODEL"):
        make_agent("llm", base_url="http://127.0.0.1:9/v1")


def test_rejected_key_is_a_clear_error(task, target) -> None:
    with ScriptedOpenAIServer([Reply(status=401)]) as server:
        agent = _agent(server, max_retries=0)
        with pytest.raises(KopeError, match="OPENAI_API_KEY"):
            agent.propose(ProposalRequest(task_view(task, target)))


@pytest.mark.parametrize(
    "answer, kernel",
    [
        ("Decision: x\n```mlir\nmodule {}\n```", "module {}"),
        ("```\nfunc.func @main() { return }\n```", "func.func @main() { return }"),
        ("module {\n}", "module {\n}"),
        ("no code here", None),
    ],
)
def test_kernel_extraction(answer: str, kernel: str | None) -> None:
    assert extract_kernel(answer)[0] == kernel


def test_unreachable_endpoint_says_what_failed_and_what_is_unset(task, target, monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agent = make_agent("llm", base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=0)
    with pytest.raises(KopeError) as err:
        agent.propose(ProposalRequest(task_view(task, target)))
    message = str(err.value)
    assert ".." not in message  # the client's "Connection error." is not glued to a period
    assert "Connection refused" in message  # what failed, from the socket error beneath
    assert "API key unset" in message and "model m" in message


@pytest.mark.parametrize(
    "given, unset, missing",
    [
        (
            {},
            ["OPENAI_BASE_URL", "OPENAI_API_KEY", "KOPE_LLM_MODEL"],
            ["KOPE_LLM_MODEL", "OPENAI_BASE_URL"],
        ),
        (
            {"model": "m"},
            ["OPENAI_BASE_URL", "OPENAI_API_KEY"],
            ["OPENAI_BASE_URL", "OPENAI_API_KEY"],
        ),
    ],
)
def test_missing_configuration_is_named_before_any_request(
    given: dict, unset: list[str], missing: list[str], monkeypatch
) -> None:
    for name in unset:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(KopeError) as err:
        make_agent("llm", **given)
    message = str(err.value)
    for name in missing:
        assert name in message
    assert "API key unset" in message


def test_a_set_key_is_said_to_be_set_and_never_shown(monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.delenv("KOPE_LLM_MODEL", raising=False)
    with pytest.raises(KopeError) as err:
        make_agent("llm", base_url="http://127.0.0.1:9/v1")
    assert "API key set" in str(err.value) and SECRET not in str(err.value)


def test_unknown_model_is_a_clear_error(task, target) -> None:
    with ScriptedOpenAIServer([Reply(status=404)]) as server:
        agent = _agent(server, max_retries=0)
        with pytest.raises(KopeError, match="KOPE_LLM_MODEL") as err:
            agent.propose(ProposalRequest(task_view(task, target)))
        agent.close()
    assert "'scripted'" in str(err.value) and SECRET not in str(err.value)


def test_the_prompt_and_the_accepted_forms_are_the_targets(task, target) -> None:
    """The agent asks the target: its description is the prompt's account of kernels, a
    Python (Triton) kernel is taken for a target that builds that form, and refused, in the
    target's words, for one that does not."""
    triton_kernel = (
        "import triton\nimport triton.language as tl\n\n@triton.jit\n"
        "def relu(x, y, n, BLOCK: tl.constexpr):\n    pass\n\n"
        "def launch(in0, out0):\n    relu[(1,)](in0, out0, in0.numel(), BLOCK=16)\n"
    )
    answer = f"Decision: one program per block\n```python\n{triton_kernel}```\n"
    mlir_view = task_view(task, target)
    triton_view = dataclasses.replace(
        mlir_view, target="gpu", kernel_forms=(FORM_TRITON,), description="Write Triton."
    )
    with ScriptedOpenAIServer([Reply(content=answer)] * 2) as server:
        agent = _agent(server)
        taken = agent.propose(ProposalRequest(triton_view))
        refused = agent.propose(ProposalRequest(mlir_view))
        system = agent.messages(ProposalRequest(triton_view))[0]["content"]
        agent.close()
    assert not isinstance(taken, Rejected) and taken is not None
    assert taken.form == FORM_TRITON and "@triton.jit" in taken.source
    assert isinstance(refused, Rejected)
    assert refused.reason == "the cpu target takes mlir kernels, not triton"
    assert "Write Triton." in str(system) and "```mlir" not in str(system)
