"""A local OpenAI-compatible HTTP server answering ``POST /v1/chat/completions`` with
crafted answers, so tests drive the real ``openai`` client over real HTTP."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Answer:
    """What the next requests get: ``content`` as the assistant message, or ``status``
    with an error body, after ``delay`` seconds."""

    content: str = "{}"
    status: int = 200
    delay: float = 0.0
    #: When set, the body is this many bytes of one endless JSON string, with no length
    #: (it ends when the connection does): an answer of enormous size.
    flood_bytes: int = 0
    #: When set, the whole message object (a tool call, a refusal, wrong types).
    message: dict[str, Any] | None = None


@dataclass
class FakeOpenAI:
    answer: Answer = field(default_factory=Answer)
    requests: list[dict[str, Any]] = field(default_factory=list)
    base_url: str = ""


def _completion(content: str, model: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": content},
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


@contextmanager
def fake_openai() -> Iterator[FakeOpenAI]:
    state = FakeOpenAI()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
            state.requests.append({"path": self.path, "body": body})
            answer = state.answer
            if answer.delay:
                time.sleep(answer.delay)
            if answer.flood_bytes:
                return self._flood(answer.flood_bytes)
            if answer.status == 200:
                payload = _completion(answer.content, body.get("model", ""))
                if answer.message is not None:
                    payload["choices"][0]["message"] = answer.message
            else:
                payload = {"error": {"message": "crafted failure", "type": "server_error"}}
            data = json.dumps(payload).encode()
            try:
                self.send_response(answer.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test)

        def _flood(self, size: int) -> None:
            head = json.dumps(_completion("", "m"))[:-1].encode()  # an object left open
            chunk = b"x" * 65536
            with contextlib.suppress(OSError):
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(head + b', "flood": "')
                for _ in range(size // len(chunk)):
                    self.wfile.write(chunk)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
