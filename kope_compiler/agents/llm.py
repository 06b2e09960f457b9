"""The LLM agent: kernels written by a language model behind any OpenAI-compatible endpoint.

Configuration: `base_url` / `OPENAI_BASE_URL`, `api_key` / `OPENAI_API_KEY` (read from the
environment, never logged or stored), `model` / `KOPE_LLM_MODEL`. The prompt describes the
target and the kernel forms it accepts, shows the operator's reference MLIR, the experience
retrieved from memory (ACMI: the most relevant attempts of related operators, packed under a
token budget), and the feedback on the last few attempts. With `context="passive"` it is
prompted as agent-led context construction does instead: no retrieved experience, and every
earlier attempt on the operator (its kernel text and its feedback) appended, which is what the
context ablation of `kope bench` compares ACMI with. The answer is data: the MLIR
is extracted, screened (`kope.agents.screen`), then built and verified by the target like any
other candidate; an answer with no kernel, or with hostile content, is a recorded failed
attempt. The client retries 429 and 5xx with exponential backoff; an endpoint that cannot be
reached is an error that names it.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kope.agents.base import Agent, Feedback, Proposal, ProposalRequest, Rejected
from kope.agents.screen import screen_mlir, screen_python
from kope.core.errors import KopeError
from kope.vocabulary.kernels import FORM_MLIR, FORM_TRITON

if TYPE_CHECKING:  # the client is imported when an LLM agent is made, not with kope.agents
    from openai.types.chat import ChatCompletionMessageParam

log = logging.getLogger("kope.agents.llm")

DEFAULT_BASE_URL = "https://api.openai.com/v1"

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.S)
_DECISION = re.compile(r"^\s*(?:decision|why)\s*:\s*(.+)$", re.I | re.M)

# The frame of every prompt; what kernels look like is the target's to say (`Target.describe`),
# so a prompt cannot offer a form, a signature or a dialect that the target's build refuses.
SYSTEM_PROMPT = """\
You optimize one operator of a PyTorch model for a {target} target ({capabilities}).
You are given its reference lowering: MLIR linalg-on-tensors, one `func.func @main`.
{description}
Every kernel is verified against the reference on random and edge inputs (NaN, Inf, -0).
Start your answer with one line `Decision: <what you changed and why>`."""

CONTEXT_MODES = ("acmi", "passive")
FEEDBACK_WINDOW = 4  # attempts of this operator an ACMI prompt repeats

# The fence languages that hold each kernel form, and the screen each must pass before build.
_FENCES = {FORM_MLIR: ("mlir", ""), FORM_TRITON: ("python", "py", "triton")}
_SCREENS: dict[str, Callable[[str], str | None]] = {
    FORM_MLIR: screen_mlir,
    FORM_TRITON: screen_python,
}


def extract_kernel(content: str) -> tuple[str | None, str]:
    """(kernel text or None, decision text) from a model's answer."""
    kernel, _, decision = extract_form(content)
    return kernel, decision


def extract_form(content: str) -> tuple[str | None, str | None, str]:
    """(kernel text or None, its form, decision text) from a model's answer: the first block
    in a fence of a known form (MLIR first), else an unfenced MLIR module."""
    decision_match = _DECISION.search(content)
    decision = decision_match.group(1).strip() if decision_match else ""
    blocks = _FENCE.findall(content)
    for form, languages in _FENCES.items():
        for language, body in blocks:
            if language.lower() in languages:
                return body.strip(), _form_of(body, form), decision or _prose(content)
    stripped = content.strip()
    if stripped.startswith(("module", "func.func", "#map")):
        return stripped, FORM_MLIR, decision
    return None, None, decision or _prose(content)


def _form_of(body: str, fenced: str) -> str:
    """The form a block is written in: Python in an MLIR fence is still Python."""
    python_like = "@triton.jit" in body or body.lstrip().startswith(("import", "from", "def"))
    return FORM_TRITON if python_like else fenced


def _prose(content: str) -> str:
    text = _FENCE.sub("", content).strip().replace("\n", " ")
    return text[:240]


class LLMAgent(Agent):
    """Kernels proposed by a chat model over the OpenAI protocol."""

    name = "llm"

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        temperature: float = 0.2,
        seed: int = 0,
        context: str = "acmi",
        **_: Any,
    ):
        import openai

        if context not in CONTEXT_MODES:
            raise KopeError(
                f"unknown context mode {context!r} for the llm agent: use one of "
                f"{', '.join(CONTEXT_MODES)}"
            )
        self.context = context

        url = base_url or os.environ.get("OPENAI_BASE_URL")
        self.base_url = url or DEFAULT_BASE_URL
        self.model = model or os.environ.get("KOPE_LLM_MODEL") or ""
        key = api_key or os.environ.get("OPENAI_API_KEY")
        # Said in words in every configuration error; the key itself never is.
        self._config = (
            f"configured: endpoint {self.base_url}"
            f"{'' if url else ' (the default: OPENAI_BASE_URL is unset)'}; "
            f"model {self.model or 'unset'}; API key {'set' if key else 'unset'}"
        )
        missing = [
            *([] if self.model else ["a model name: set KOPE_LLM_MODEL (or pass --llm-model)"]),
            # OpenAI's own API refuses every request without a key; a local server may not.
            *(
                []
                if url or key
                else [
                    "an endpoint or a key: set OPENAI_BASE_URL (or pass "
                    "--llm-base-url) to your server, or OPENAI_API_KEY for "
                    f"{DEFAULT_BASE_URL}"
                ]
            ),
        ]
        if missing:
            raise KopeError(f"the llm agent needs {', and '.join(missing)} [{self._config}]")
        key = key or "unset"  # the client insists on one; a keyless local server ignores it
        self.temperature = temperature
        self.seed = seed
        self._openai = openai
        self._client = openai.OpenAI(
            base_url=self.base_url, api_key=key, timeout=timeout_s, max_retries=max_retries
        )

    def propose(self, request: ProposalRequest) -> Proposal | Rejected | None:
        messages = self.messages(request)
        try:
            response = self._client.chat.completions.create(
                model=self.model,
                messages=messages,
                temperature=self.temperature,
                seed=self.seed,
            )
        except self._openai.APIConnectionError as err:
            if isinstance(err, self._openai.APITimeoutError):
                return Rejected(f"the endpoint did not answer in time ({err})", model=self.model)
            raise KopeError(
                f"cannot reach the LLM endpoint at {self.base_url}: {_cause(err)}; check "
                f"OPENAI_BASE_URL (or --llm-base-url) and that the server is running "
                f"[{self._config}]"
            ) from None
        except self._openai.AuthenticationError as err:
            raise KopeError(
                f"the LLM endpoint at {self.base_url} rejected the API key (HTTP "
                f"{err.status_code}): set OPENAI_API_KEY to a key it accepts [{self._config}]"
            ) from None
        except self._openai.NotFoundError:
            # A wrong model name or base URL fails the same way on every attempt: say so once.
            raise KopeError(
                f"the LLM endpoint at {self.base_url} answered HTTP 404 for model "
                f"{self.model!r}: check KOPE_LLM_MODEL (or --llm-model) and that the base URL "
                f"ends where /chat/completions is served, e.g. .../v1 [{self._config}]"
            ) from None
        except self._openai.APIStatusError as err:
            return Rejected(
                f"the endpoint answered HTTP {err.status_code} after retries", model=self.model
            )
        except (self._openai.APIError, ValueError) as err:  # ValueError: a body that is not JSON
            return Rejected(
                f"the endpoint's answer was malformed: {type(err).__name__}", model=self.model
            )
        usage = getattr(response, "usage", None)
        tokens_in = getattr(usage, "prompt_tokens", 0) or 0
        tokens_out = getattr(usage, "completion_tokens", 0) or 0
        content = ""
        if getattr(response, "choices", None):
            content = response.choices[0].message.content or ""
        kernel, form, decision = extract_form(content)
        meta: dict[str, Any] = dict(model=self.model, tokens_in=tokens_in, tokens_out=tokens_out)
        forms = request.task.kernel_forms
        if kernel is None or form is None:
            fences = " or ".join(f"```{_FENCES[f][0]}" for f in forms if f in _FENCES)
            return Rejected(
                f"the answer holds no kernel (no {fences or 'code'} block)",
                decision=decision,
                **meta,
            )
        screen = _SCREENS.get(form)
        refused = screen(kernel) if screen is not None else None
        if refused is None and form not in forms:
            refused = (
                f"the {request.task.target} target takes {', '.join(forms)} kernels, not {form}"
            )
        if refused:
            # Kept as evidence of what the model answered; it is never built or run.
            return Rejected(refused, decision=decision, source=kernel, form=form, **meta)
        parent = request.history[-1].attempt_id if request.history else None
        return Proposal(
            source=kernel,
            decision=decision or "rewritten by the model",
            form=form,
            parent=parent,
            **meta,
        )

    def messages(self, request: ProposalRequest) -> list[ChatCompletionMessageParam]:
        task = request.task
        capabilities = ", ".join(f"{k}={v}" for k, v in sorted(task.capabilities.items()))
        system = SYSTEM_PROMPT.format(
            target=task.target,
            capabilities=capabilities,
            description=task.description or f"Kernel forms: {', '.join(task.kernel_forms)}.",
        )
        parts = [
            f"Operator: {task.label}",
            "Inputs: "
            + ", ".join(str(s) for s in task.inputs)
            + "; outputs: "
            + ", ".join(str(s) for s in task.outputs),
            "Reference lowering:\n```mlir\n" + task.payload.strip() + "\n```",
        ]
        if self.context == "passive":
            parts += [_replayed(i, f, task.kernel_forms) for i, f in enumerate(request.history)]
        else:
            if request.context:
                parts.append(
                    "What KOPE learned from related operators (most relevant first):\n"
                    + request.context
                )
            if request.history:
                parts.append(
                    "Your previous attempts on this operator:\n"
                    + "\n".join(_feedback_line(f) for f in request.history[-FEEDBACK_WINDOW:])
                )
        parts.append(f"Attempts left: {request.attempts_left}. Propose your next kernel.")
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": "\n\n".join(parts)},
        ]

    def close(self) -> None:
        self._client.close()


def _cause(err: Exception) -> str:
    """What failed under an openai connection error, in one sentence without a final period.

    The client's own text is only "Connection error."; the socket error beneath it says what
    happened (refused, unknown host, TLS)."""
    cause = err.__cause__ or err.__context__
    text = f"{type(cause).__name__}: {cause}" if cause is not None and str(cause) else str(err)
    return text.strip().rstrip(".")


def _replayed(index: int, f: Feedback, forms: tuple[str, ...]) -> str:
    """One earlier attempt in full, as a passive context carries it: kernel and feedback."""
    fence = _FENCES.get(forms[0], ("",))[0] if forms else ""
    kernel = f"```{fence}\n{f.source.strip()}\n```\n" if f.source else ""
    return f"Attempt {index + 1}:\n{kernel}{_feedback_line(f)}"


def _feedback_line(f: Feedback) -> str:
    if f.verdict == "verified":
        speed = f"{f.speedup_vs_eager:.2f}x eager" if f.speedup_vs_eager else "untimed"
        ref = f", {f.speedup_vs_reference:.2f}x reference" if f.speedup_vs_reference else ""
        return f"- {f.decision}: verified, {speed}{ref}"
    error = (f.error or "").strip().splitlines()
    detail = " / ".join(line.strip() for line in error[:3])[:400]
    return f"- {f.decision}: {f.verdict}: {detail}"
