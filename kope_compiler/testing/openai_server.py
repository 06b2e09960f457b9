"""A local HTTP server that speaks OpenAI's chat-completions protocol and replays a script.

Each request to `POST /v1/chat/completions` consumes the next `Reply`: a message (good,
broken or hostile kernels), an HTTP error status (429, 500, ...), a delay (to exercise
timeouts), or a raw malformed body. Its usage reports the scripted token counts, or counts the
prompt it was sent. Requests are kept for inspection. It binds to 127.0.0.1.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    content: str = ""
    # Computes the content from the request instead (e.g. an answer built from the prompt).
    answer: Callable[[dict[str, Any]], str] | None = None
    status: int = 200
    delay_s: float = 0.0
    # None: counted from the request's messages (KOPE's token counter), as an endpoint would
    prompt_tokens: int | None = 100
    completion_tokens: int | None = 50  # None: counted from the answer
    raw_body: str | None = None  # sent as is, e.g. malformed JSON


@dataclass
class ScriptedOpenAIServer:
    """Serve `script` in order; the last reply repeats once the script is exhausted."""

    script: list[Reply]
    model: str = "scripted-model"
    requests: list[dict[str, Any]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _next: int = 0

    @property
    def base_url(self) -> str:
        assert self._server is not None, "start() the server first"
        host, port = self._server.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        return f"http://{host}:{port}/v1"

    def start(self) -> ScriptedOpenAIServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                try:
                    request = json.loads(body)
                except json.JSONDecodeError:
                    request = {"unparsable": body.decode(errors="replace")}
                request["_path"] = self.path
                request["_authorization"] = self.headers.get("Authorization", "")
                reply = server._take(request)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                if reply.raw_body is not None:
                    self._send_text(reply.status, reply.raw_body)
                    return
                if reply.status != 200:
                    self._send(
                        reply.status,
                        {
                            "error": {
                                "message": f"scripted status {reply.status}",
                                "type": "server_error",
                            }
                        },
                    )
                    return
                content = reply.answer(request) if reply.answer is not None else reply.content
                prompt_tokens = reply.prompt_tokens
                if prompt_tokens is None:
                    prompt_tokens = _prompt_tokens(request)
                completion_tokens = reply.completion_tokens
                if completion_tokens is None:
                    completion_tokens = _count(content)
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{len(server.requests)}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": request.get("model", server.model),
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": content},
                            }
                        ],
                        "usage": {
                            "prompt_tokens": prompt_tokens,
                            "completion_tokens": completion_tokens,
                            "total_tokens": prompt_tokens + completion_tokens,
                        },
                    },
                )

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                self._send_text(status, json.dumps(payload))

            def _send_text(self, status: int, text: str) -> None:
                data = text.encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a scripted delay past its timeout)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def _take(self, request: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(request)
            reply = self.script[min(self._next, len(self.script) - 1)]
            self._next += 1
            return reply

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> ScriptedOpenAIServer:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()


def _count(text: str) -> int:
    """Tokens in `text` by KOPE's own counter (o200k where bpe-openai is installed)."""
    from kope.memory.tokens import default_counter

    return default_counter().count(text)


def _prompt_tokens(request: dict[str, Any]) -> int:
    messages = request.get("messages") or []
    return sum(_count(str(m.get("content", ""))) for m in messages if isinstance(m, dict))
