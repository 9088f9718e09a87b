"""The local OpenAI-compatible model server: ``POST /v1/chat/completions`` and
``POST /v1/responses`` (tool calls in both, streamed as server-sent events when the
request says ``stream: true``) and ``GET /v1/models``, answering from
``forklab.experiments.runfork.scripted_model`` (its behaviour model says which mistakes
each named model makes; any other name behaves as the documented default).

A stand-in for a real endpoint (OpenAI, vLLM, Ollama …) so that agents run offline; the
``openai`` client and the OpenAI Agents SDK talk to it exactly as to a real server. A
request's ``seed`` fixes its draws (the same seed, the same answer); without one the
server draws from its own seed and a request counter.
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

from forklab.experiments.runfork.scripted_model import (
    BEHAVIOURS,
    DEFAULT_BEHAVIOUR,
    Reply,
    reply_json,
    respond,
)
from forklab.runtime import strict_json

#: Request bodies larger than this are refused (the server is reachable by any local user).
MAX_BODY_BYTES = 4 * 1024 * 1024
#: Seeds the server takes (OpenAI's own range is a 64-bit integer).
MAX_SEED = 2**63 - 1
_CHAT = ("/v1/chat/completions", "/chat/completions")
_RESPONSES = ("/v1/responses", "/responses")


class BadRequest(ValueError):
    """A request the server refuses with 400 and this message."""


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


def _seed(body: dict[str, Any]) -> int | None:
    seed = body.get("seed")
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise BadRequest("seed must be an integer from 0 to 2**63-1")
    return seed


def _temperature(body: dict[str, Any]) -> float:
    value = body.get("temperature")
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 2:
        raise BadRequest("temperature must be a number from 0 to 2")
    return float(value)


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model must be a non-empty string")
    return model


def _chat_request(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise BadRequest("messages must be a list of message objects")
    tools: list[str] = []
    for tool in body.get("tools") or []:
        try:
            tools.append(str(tool["function"]["name"]))
        except (KeyError, TypeError):
            raise BadRequest("each tool must be {type: function, function: {name}}") from None
    return messages, tools


def _input_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _responses_request(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The Responses API's ``instructions``, ``input`` items and ``tools`` as the chat
    messages and tool names the scripted model reads."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise BadRequest("input must be a string or a list of input items")
    for item in items:
        if not isinstance(item, dict):
            raise BadRequest("each input item must be an object")
        kind = item.get("type", "message")
        if kind == "message" or "role" in item:
            role = item.get("role", "user")
            messages.append({"role": role, "content": _input_text(item.get("content"))})
        elif kind == "function_call":
            messages.append({"role": "assistant", "content": "", "tool_call": item.get("name")})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": _input_text(item.get("output"))})
    tools: list[str] = []
    for tool in body.get("tools") or []:
        if isinstance(tool, dict) and tool.get("type") == "function" and "name" in tool:
            tools.append(str(tool["name"]))
    return messages, tools


def _usage_chat(reply: Reply) -> dict[str, int]:
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
    }


def _response_output(reply: Reply, rid: str) -> list[dict[str, Any]]:
    if reply.tool_calls:
        return [
            {
                "type": "function_call",
                "id": f"fc_{rid}_{i}",
                "call_id": c.id,
                "name": c.name,
                "arguments": json.dumps(c.arguments),
                "status": "completed",
            }
            for i, c in enumerate(reply.tool_calls)
        ]
    text = {"type": "output_text", "text": reply.content or "", "annotations": []}
    return [
        {
            "type": "message",
            "id": f"msg_{rid}",
            "role": "assistant",
            "status": "completed",
            "content": [text],
        }
    ]


def _response(body: dict[str, Any], model: str, reply: Reply, rid: str) -> dict[str, Any]:
    return {
        "id": f"resp_{rid}",
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": "completed",
        "output": _response_output(reply, rid),
        "parallel_tool_calls": True,
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "temperature": body.get("temperature"),
        "usage": {
            "input_tokens": reply.prompt_tokens,
            "output_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def _chat_chunks(body: dict[str, Any], model: str, reply: Reply, rid: str) -> list[dict[str, Any]]:
    """A chat completion as the stream of chunks a server sends for ``stream: true``."""
    base: dict[str, Any] = {
        "id": f"chatcmpl-{rid}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }
    delta: dict[str, Any] = {"role": "assistant"}
    if reply.tool_calls:
        delta["tool_calls"] = [
            {
                "index": i,
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for i, c in enumerate(reply.tool_calls)
        ]
        finish = "tool_calls"
    else:
        delta["content"] = reply.content or ""
        finish = "stop"
    chunks = [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
    ]
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        chunks.append({**base, "choices": [], "usage": _usage_chat(reply)})
    return chunks


def _response_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A response as the Responses API's stream of events."""
    start = {**response, "status": "in_progress", "output": []}
    events: list[dict[str, Any]] = [{"type": "response.created", "response": start}]
    for i, item in enumerate(response["output"]):
        opened = {**item, "status": "in_progress"}
        if item["type"] == "message":
            opened["content"] = []
        else:
            opened["arguments"] = ""
        events.append({"type": "response.output_item.added", "output_index": i, "item": opened})
        if item["type"] == "message":
            part = item["content"][0]
            common = {"item_id": item["id"], "output_index": i, "content_index": 0}
            events += [
                {
                    "type": "response.content_part.added",
                    **common,
                    "part": {**part, "text": ""},
                },
                {"type": "response.output_text.delta", **common, "delta": part["text"]},
                {"type": "response.output_text.done", **common, "text": part["text"]},
                {"type": "response.content_part.done", **common, "part": part},
            ]
        else:
            common = {"item_id": item["id"], "output_index": i}
            events += [
                {
                    "type": "response.function_call_arguments.delta",
                    **common,
                    "delta": item["arguments"],
                },
                {
                    "type": "response.function_call_arguments.done",
                    **common,
                    "arguments": item["arguments"],
                },
            ]
        events.append({"type": "response.output_item.done", "output_index": i, "item": item})
    events.append({"type": "response.completed", "response": response})
    return [{**e, "sequence_number": n} for n, e in enumerate(events)]


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

    def _stream(self, events: list[dict[str, Any]], named: bool) -> None:
        """Server-sent events, then ``[DONE]`` (chat) ; the connection closes after."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for event in events:
            head = f"event: {event['type']}\n" if named else ""
            self.wfile.write(f"{head}data: {json.dumps(event)}\n\n".encode())
        if not named:
            self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"error": {"message": message, "type": "invalid_request_error"}})

    def do_GET(self) -> None:
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            names = [m for m in BEHAVIOURS if m != DEFAULT_BEHAVIOUR]
            data = [{"id": m, "object": "model", "owned_by": "forklab"} for m in names]
            self._send(200, {"object": "list", "data": data})
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path not in _CHAT + _RESPONSES:
            self._error(
                404, f"no route {self.path}; this server speaks chat completions and responses"
            )
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:  # read(-1) would wait for the client to close the connection
            self._error(400, "malformed request: Content-Length must be a non-negative integer")
            return
        if length > MAX_BODY_BYTES:
            self._error(413, f"request body over {MAX_BODY_BYTES} bytes")
            return
        try:
            body = strict_json.loads(self.rfile.read(length) or b"{}", "the body")
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            model, temperature, seed = _model(body), _temperature(body), _seed(body)
            chat = path in _CHAT
            messages, tools = _chat_request(body) if chat else _responses_request(body)
        except (ValueError, BadRequest) as exc:
            self._error(400, f"malformed request: {exc}")
            return
        counter = self.server.next_counter()
        # the request's seed alone fixes the draws; else the server's seed and counter
        draw_seed, draw_counter = (seed, 0) if seed is not None else (self.server.seed, counter)
        reply = respond(model, messages, tools, temperature, draw_seed, draw_counter)
        rid = f"{counter:08d}"
        stream = body.get("stream") is True
        if not chat:
            response = _response(body, model, reply, rid)
            if stream:
                self._stream(_response_events(response), named=True)
            else:
                self._send(200, response)
            return
        if stream:
            self._stream(_chat_chunks(body, model, reply, rid), named=False)
            return
        finish = "tool_calls" if reply.tool_calls else "stop"
        self._send(
            200,
            {
                "id": f"chatcmpl-{rid}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "message": reply_json(reply), "finish_reason": finish}],
                "usage": _usage_chat(reply),
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
