"""The local side-effect service the example agents call: payments and mail.

Every applied effect is appended to a log, so duplicates are counted, not guessed. A
request with an ``Idempotency-Key`` header is applied at most once per key (a repeat gets
the first answer back), and ``GET /effects/status?key=K`` tells whether a key was applied
(the durable query a tool may use in the ledger's ambiguous window). Requests without a
key are applied every time, like a downstream that ignores idempotency.

Routes: ``POST /payments/charge``, ``POST /mail/send``, ``GET /effects/status``,
``GET /effects/log``. Run it with ``python -m forklab.workers.runfork.effects_service --port P``.
"""

from __future__ import annotations

import argparse
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from forklab.runtime import strict_json

MAX_BODY_BYTES = 1024 * 1024
_KINDS = {"/payments/charge": "charge", "/mail/send": "email"}


class EffectsService(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, _Handler)
        self.lock = threading.Lock()
        self.log: list[dict[str, Any]] = []
        self.by_key: dict[str, dict[str, Any]] = {}

    def apply(
        self, kind: str, key: str | None, params: dict[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        """Apply one effect (or return the keyed one already applied); True if applied now."""
        with self.lock:
            if key is not None and key in self.by_key:
                return self.by_key[key], False
            effect = {
                "effect_id": f"{kind}-{len(self.log) + 1}-{uuid.uuid4().hex[:6]}",
                "kind": kind,
                "key": key,
                "params": params,
                "seq": len(self.log) + 1,
            }
            self.log.append(effect)
            if key is not None:
                self.by_key[key] = effect
            return effect, True


class _Handler(BaseHTTPRequestHandler):
    server: EffectsService

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlparse(self.path)
        if url.path == "/effects/log":
            with self.server.lock:
                self._send(200, {"effects": list(self.server.log)})
        elif url.path == "/effects/status":
            key = (parse_qs(url.query).get("key") or [""])[0]
            with self.server.lock:
                effect = self.server.by_key.get(key)
            self._send(200, {"key": key, "applied": effect is not None, "effect": effect})
        else:
            self._send(404, {"error": f"no route {url.path}"})

    def do_POST(self) -> None:
        kind = _KINDS.get(urlparse(self.path).path)
        if kind is None:
            self._send(404, {"error": f"no route {self.path}"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:  # read(-1) would wait for the client to close the connection
            self._send(400, {"error": "malformed request: Content-Length must be 0 or more"})
            return
        if length > MAX_BODY_BYTES:
            self._send(413, {"error": "body too large"})
            return
        try:
            params = strict_json.loads(self.rfile.read(length) or b"{}", "the body")
            if not isinstance(params, dict):
                raise ValueError("the body must be a JSON object")
        except ValueError as exc:
            self._send(400, {"error": f"malformed request: {exc}"})
            return
        effect, applied = self.server.apply(kind, self.headers.get("Idempotency-Key"), params)
        self._send(200, {"effect": effect, "applied_now": applied})


def main() -> None:
    p = argparse.ArgumentParser(description="ForkLab's local payments + mail service")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    server = EffectsService((args.host, args.port))
    print(f"effects service on http://{args.host}:{server.server_port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
