"""A local HTTP server speaking the Braintrust endpoints the SDK's logger uses: API-key
login, project and experiment registration, version, and ``logs3`` (the rows). Rows are
merged by id, as Braintrust does. ``fail_logs(status, times)`` makes uploads fail."""

from __future__ import annotations

import gzip
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

API_KEY = "bt-test-key"


@dataclass
class FakeBraintrust:
    url: str = ""
    projects: dict[str, str] = field(default_factory=dict)
    experiments: dict[str, dict[str, Any]] = field(default_factory=dict)
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    log_faults: list[int] = field(default_factory=list)
    down: bool = False
    #: Hostile modes: error bodies quote the request's Authorization header back; the
    #: experiment registration answers this (another experiment's) id; rows are acknowledged
    #: and not stored.
    echo_key: bool = False
    experiment_id: str | None = None
    drop_rows: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail_logs(self, status: int, times: int = 1) -> None:
        self.log_faults.extend([status] * times)

    def spans(self, experiment: str) -> list[dict[str, Any]]:
        exp_id = next(e["id"] for e in self.experiments.values() if e["name"] == experiment)
        return [r for r in self.rows.values() if r.get("experiment_id") == exp_id]


class _Handler(BaseHTTPRequestHandler):
    state: FakeBraintrust

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.headers.get("content-encoding") == "gzip":
            raw = gzip.decompress(raw)
        return json.loads(raw) if raw else None

    def _handle(self, method: str) -> None:
        st = self.state
        body = self._body()
        path = self.path.split("?")[0]
        said = f" (you sent {self.headers.get('authorization')})" if st.echo_key else ""
        if st.down:
            return self._send(503, {"error": f"down for maintenance{said}"})
        if self.headers.get("authorization") != f"Bearer {API_KEY}":
            return self._send(401, {"error": f"invalid api key{said}"})
        if (method, path) == ("POST", "/api/apikey/login"):
            org = {"id": "org-1", "name": "forklab", "api_url": st.url, "proxy_url": st.url}
            return self._send(200, {"org_info": [{**org, "git_metadata": None}]})
        if (method, path) == ("POST", "/v1/project"):
            with st.lock:
                pid = st.projects.setdefault(body["name"], f"proj-{uuid.uuid4().hex[:8]}")
            return self._send(200, {"id": pid, "name": body["name"], "org_id": "org-1"})
        if (method, path) == ("POST", "/v1/experiment"):
            key = f"{body['project_id']}/{body['name']}"
            with st.lock:
                exp = st.experiments.get(key)
                if exp is None or body.get("ensure_new"):
                    exp = {
                        "id": f"exp-{uuid.uuid4().hex[:8]}",
                        "name": body["name"],
                        "project_id": body["project_id"],
                        "created": "2026-11-29T00:00:00Z",
                    }
                    st.experiments[key] = exp
            if st.experiment_id:
                return self._send(200, {**exp, "id": st.experiment_id})
            return self._send(200, exp)
        if (method, path) == ("GET", "/version"):
            return self._send(200, {"version": "fake"})
        if (method, path) == ("POST", "/logs3"):
            with st.lock:
                fault = st.log_faults.pop(0) if st.log_faults else None
                if fault is None and not st.drop_rows:
                    for row in body["rows"]:
                        merged = {**st.rows.get(row["id"], {}), **row}
                        st.rows[row["id"]] = merged
            if fault is not None:
                return self._send(fault, {"error": f"injected {fault}{said}"})
            return self._send(200, {"ids": [r["id"] for r in body["rows"]]})
        self._send(404, {"error": f"fake braintrust has no route {method} {path}"})

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")


@contextmanager
def fake_braintrust() -> Iterator[FakeBraintrust]:
    state = FakeBraintrust()
    handler = type("Handler", (_Handler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
