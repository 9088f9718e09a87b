"""The local OpenAI-compatible model server: ``POST /v1/chat/completions`` (with tool calls)
and ``GET /v1/models``, answering from ``forklab.experiments.runfork.scripted_model``.

A stand-in for a real endpoint (OpenAI, vLLM, Ollama …) so that agents run offline; the
``openai`` client and the OpenAI Agents SDK talk to it exactly as to a real server.
Run it with ``python -m forklab.workers.runfork.model_server --port P [--seed S]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from forklab.experiments.runfork.scripted_model import MODELS, reply_json, respond

#: Request bodies larger than this are refused (the server is reachable by any local user).
MAX_BODY_BYTES = 4 * 1024 * 1024


class ModelServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], seed: int = 0) -> None:
        super().__init__(address, _Handler)
        self.seed = seed
        self._counter = itertools.count()
        self._lock = threading.Lock()

    def next_counter(self) -> int:
        with self._lock:
            return next(self._counter)


class _Handler(BaseHTTPRequestHandler):
    server: ModelServer

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"error": {"message": message, "type": "invalid_request_error"}})

    def do_GET(self) -> None:
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            data = [{"id": m, "object": "model", "owned_by": "forklab"} for m in MODELS]
            self._send(200, {"object": "list", "data": data})
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._error(404, f"no route {self.path}; this server speaks chat completions")
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._error(413, f"request body over {MAX_BODY_BYTES} bytes")
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            model = str(body["model"])
            messages = list(body["messages"])
            tools = [str(t["function"]["name"]) for t in body.get("tools") or []]
            temperature = float(body.get("temperature") or 0.0)
        except (ValueError, KeyError, TypeError) as exc:
            self._error(400, f"malformed chat request: {exc}")
            return
        try:
            reply = respond(
                model, messages, tools, temperature, self.server.seed, self.server.next_counter()
            )
        except ValueError as exc:
            self._error(404, str(exc))
            return
        finish = "tool_calls" if reply.tool_calls else "stop"
        self._send(
            200,
            {
                "id": f"chatcmpl-{self.server.next_counter()}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "message": reply_json(reply), "finish_reason": finish}],
                "usage": {
                    "prompt_tokens": reply.prompt_tokens,
                    "completion_tokens": reply.completion_tokens,
                    "total_tokens": reply.prompt_tokens + reply.completion_tokens,
                },
            },
        )


def main() -> None:
    p = argparse.ArgumentParser(description="ForkLab's local OpenAI-compatible model server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    server = ModelServer((args.host, args.port), seed=args.seed)
    print(f"model server on http://{args.host}:{server.server_port}/v1", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
