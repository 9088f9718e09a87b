"""A local HTTP server speaking the subset of Daytona's API that ForkLab's Daytona backend
calls through the real ``daytona`` SDK: snapshot get, organisation usage, sandbox
create/get/list/delete with labels, and the toolbox's bulk upload, bulk download and
process execute. The toolbox's execute runs the command in a local subprocess, in a folder
of its own per sandbox — that is what the real toolbox does inside the sandbox.

Faults are injected per route: ``fail(route, status, times)`` makes the next ``times``
calls of ``route`` answer ``status``; ``hang_create`` leaves new sandboxes ``starting``
(the SDK's create times out, with the sandbox id); ``undeletable`` keeps sandboxes with
that label value in ``destroying`` forever.
"""

from __future__ import annotations

import contextlib
import email.parser
import email.policy
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

ORG = "org-forklab-test"
API_KEY = "dtn-test-key"
#: How long an "endless" body runs: 48 MiB, past any bound the backend keeps.
ENDLESS_CHUNKS = 768


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Box:
    dto: dict[str, Any]
    root: Path

    def local(self, remote: str) -> Path:
        """A sandbox path (absolute or relative to the home folder) inside ``root``."""
        rel = remote.lstrip("/") if remote.startswith("/") else f"home/daytona/{remote}"
        path = (self.root / rel).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise ValueError(f"path {remote!r} leaves the sandbox")
        return path


@dataclass
class FakeDaytona:
    root: Path
    api_url: str = ""
    snapshots: dict[str, dict[str, Any]] = field(default_factory=dict)
    regions: list[dict[str, Any]] = field(default_factory=list)
    boxes: dict[str, Box] = field(default_factory=dict)
    faults: dict[str, list[int]] = field(default_factory=dict)
    hang_create: bool = False
    undeletable: set[str] = field(default_factory=set)
    calls: list[tuple[str, str]] = field(default_factory=list)
    #: Hostile modes: the id a create hands out; routes that never answer; routes whose
    #: body never ends (or is ``huge`` bytes); routes that answer a body that is not JSON.
    create_id: str | None = None
    hang: set[str] = field(default_factory=set)
    endless: set[str] = field(default_factory=set)
    garbage: set[str] = field(default_factory=set)
    #: Error messages quote the request's Authorization header back.
    echo_key: bool = False
    #: The id a sandbox lookup answers with (another sandbox's), when set.
    get_as: str | None = None
    release: threading.Event = field(default_factory=threading.Event)
    created: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_snapshot(
        self,
        name: str,
        *,
        state: str = "active",
        regions: tuple[str, ...] = ("eu",),
        cpu: int = 1,
        mem: int = 1,
        disk: int = 3,
    ) -> dict[str, Any]:
        snap = {
            "id": f"snap-{uuid.uuid4().hex[:12]}",
            "organizationId": ORG,
            "general": False,
            "name": name,
            "imageName": "python:3.11-slim",
            "state": state,
            "cpu": cpu,
            "gpu": 0,
            "mem": mem,
            "disk": disk,
            "size": 0.2,
            "createdAt": _now(),
            "updatedAt": _now(),
            "regionIds": list(regions),
        }
        self.snapshots[name] = snap
        return snap

    def set_region(
        self, region: str, *, cpu: int = 40, mem: int = 80, disk: int = 60, used_disk: int = 0
    ) -> None:
        self.regions = [r for r in self.regions if r["regionId"] != region]
        self.regions.append(
            {
                "regionId": region,
                "sandboxClass": "container",
                "totalCpuQuota": cpu,
                "currentCpuUsage": 0,
                "totalMemoryQuota": mem,
                "currentMemoryUsage": 0,
                "totalDiskQuota": disk,
                "currentDiskUsage": used_disk,
                "totalGpuQuota": 0,
                "currentGpuUsage": 0,
                "maxCpuPerSandbox": None,
                "maxMemoryPerSandbox": None,
                "maxDiskPerSandbox": None,
                "maxDiskPerNonEphemeralSandbox": None,
                "maxCpuPerGpu": None,
                "maxMemoryPerGpu": None,
                "maxDiskPerGpu": None,
            }
        )

    def snapshot(self, name_or_id: str) -> dict[str, Any] | None:
        return self.snapshots.get(name_or_id) or next(
            (s for s in self.snapshots.values() if s["id"] == name_or_id), None
        )

    def fail(self, route: str, status: int, times: int = 1) -> None:
        self.faults.setdefault(route, []).extend([status] * times)

    def live(self, labels: dict[str, str] | None = None) -> list[str]:
        """Sandboxes that exist (not destroyed) and carry every given label."""
        with self.lock:
            return [
                i
                for i, b in self.boxes.items()
                if all(b.dto["labels"].get(k) == v for k, v in (labels or {}).items())
            ]


def _sandbox_dto(sid: str, body: dict[str, Any], snap: dict[str, Any], base: str) -> dict[str, Any]:
    return {
        "id": sid,
        "organizationId": ORG,
        "name": sid,
        "snapshot": snap["name"],
        "user": "daytona",
        "env": body.get("env") or {},
        "labels": body.get("labels") or {},
        "public": False,
        "networkBlockAll": bool(body.get("networkBlockAll")),
        "kvm": False,
        "target": body.get("target") or snap["regionIds"][0],
        "cpu": snap["cpu"],
        "gpu": 0,
        "memory": snap["mem"],
        "disk": snap["disk"],
        "state": "started",
        "desiredState": "started",
        "autoStopInterval": body.get("autoStopInterval"),
        "autoDeleteInterval": body.get("autoDeleteInterval"),
        "ttlMinutes": body.get("ttlMinutes"),
        "createdAt": _now(),
        "updatedAt": _now(),
        "toolboxProxyUrl": f"{base}/toolbox",
    }


def _multipart(parts: list[tuple[str, str, bytes]]) -> tuple[str, bytes]:
    boundary = uuid.uuid4().hex
    out = b""
    for name, filename, data in parts:
        out += (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
            f'filename="{filename}"\r\nContent-Type: application/octet-stream\r\n\r\n'
        ).encode()
        out += data + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return f"multipart/form-data; boundary={boundary}", out


class _Handler(BaseHTTPRequestHandler):
    state: FakeDaytona

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, payload: Any = None, raw: tuple[str, bytes] | None = None) -> None:
        if raw is not None:
            ctype, data = raw
        else:
            ctype, data = "application/json", json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _endless(self) -> None:
        """A 200 whose body (no length: it ends when the connection does) goes on for
        ``ENDLESS_CHUNKS`` × 64 KiB (unbounded for a client), until the client goes."""
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        chunk = b'{"exitCode": 0, "result": "' + b"x" * 65536
        with contextlib.suppress(OSError):
            for _ in range(ENDLESS_CHUNKS):  # then it gives up, so a test without bounds ends
                if self.state.release.is_set():
                    break
                self.wfile.write(chunk)
                chunk = b"x" * 65536

    def _error(self, status: int, message: str) -> None:
        if self.state.echo_key:
            message += f" (you sent {self.headers.get('authorization')})"
        self._send(status, {"statusCode": status, "message": message, "error": "fake"})

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def _route(self, method: str) -> None:
        st = self.state
        url = urlparse(self.path)
        path = url.path.removeprefix("/api")
        routes = [
            ("GET", r"/snapshots/(?P<name>[^/]+)", "snapshot_get", self._snapshot_get),
            ("GET", r"/organizations/(?P<org>[^/]+)/usage", "usage", self._usage),
            ("POST", r"/sandbox", "create", self._create),
            ("GET", r"/sandbox", "list", self._list),
            ("GET", r"/sandbox/(?P<sid>[^/]+)", "get", self._get),
            ("DELETE", r"/sandbox/(?P<sid>[^/]+)", "delete", self._delete),
            ("POST", r"/toolbox/(?P<sid>[^/]+)/files/bulk-upload", "upload", self._upload),
            ("POST", r"/toolbox/(?P<sid>[^/]+)/files/bulk-download", "download", self._download),
            ("POST", r"/toolbox/(?P<sid>[^/]+)/process/execute", "exec", self._exec),
        ]
        for verb, pattern, name, handler in routes:
            m = re.fullmatch(pattern, path)
            if verb != method or m is None:
                continue
            with st.lock:
                st.calls.append((name, path))
                queued = st.faults.get(name)
                status = queued.pop(0) if queued else None
            body = self._body()
            if self.headers.get("authorization") != f"Bearer {API_KEY}":
                return self._error(401, "invalid credentials")
            if status is not None:
                return self._error(status, f"injected {status}")
            if name in st.hang:
                st.release.wait()  # never answers until the test ends
                return None
            if name in st.endless:
                return self._endless()
            if name in st.garbage:
                return self._send(200, raw=("application/json", b'{"id": [1, 2,'))
            params = {k: unquote(v) for k, v in m.groupdict().items()}
            return handler(body, parse_qs(url.query), **params)
        self._body()
        self._error(404, f"fake daytona has no route {method} {path}")

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    # --- control plane ---
    def _snapshot_get(self, body: bytes, q: Any, name: str) -> None:
        snap = self.state.snapshot(name)
        if snap is None:
            return self._error(404, f"snapshot {name} not found")
        self._send(200, snap)

    def _usage(self, body: bytes, q: Any, org: str) -> None:
        if org != ORG:
            return self._error(403, "not your organisation")
        self._send(
            200,
            {
                "regionUsage": self.state.regions,
                "totalSnapshotQuota": 100,
                "currentSnapshotUsage": 1,
                "totalVolumeQuota": 10,
                "currentVolumeUsage": 0,
            },
        )

    def _create(self, body: bytes, q: Any) -> None:
        st = self.state
        req = json.loads(body)
        snap = st.snapshot(req.get("snapshot", ""))
        if snap is None:
            return self._error(404, f"snapshot {req.get('snapshot')} not found")
        sid = st.create_id or f"sbx-{uuid.uuid4().hex[:12]}"
        base = f"http://{self.headers['host']}"
        dto = _sandbox_dto(sid, req, snap, base)
        if st.hang_create:
            dto["state"] = "starting"
        root = Path(tempfile.mkdtemp(prefix="sbx-", dir=st.root))
        (root / "home" / "daytona").mkdir(parents=True)
        with st.lock:
            st.boxes[sid] = Box(dto=dto, root=root)
            st.created.append({**req, "id": sid})  # the request, with the id it got
        self._send(200, dto)

    def _box(self, sid: str) -> Box | None:
        with self.state.lock:
            return self.state.boxes.get(sid)

    def _get(self, body: bytes, q: Any, sid: str) -> None:
        box = self._box(sid)
        if box is None:
            return self._error(404, f"sandbox {sid} not found")
        self._send(
            200, box.dto if self.state.get_as is None else {**box.dto, "id": self.state.get_as}
        )

    def _list(self, body: bytes, q: Any) -> None:
        labels = json.loads(q["labels"][0]) if "labels" in q else {}
        ids = self.state.live(labels)
        items = [self.state.boxes[i].dto for i in ids if i in self.state.boxes]
        self._send(200, {"items": items, "nextCursor": None})

    def _delete(self, body: bytes, q: Any, sid: str) -> None:
        st = self.state
        box = self._box(sid)
        if box is None:
            return self._error(404, f"sandbox {sid} not found")
        if set(box.dto["labels"].values()) & st.undeletable:
            box.dto["state"] = "destroying"
            return self._send(200, box.dto)
        with st.lock:
            st.boxes.pop(sid, None)
        shutil.rmtree(box.root, ignore_errors=True)
        self._send(200, {**box.dto, "state": "destroyed"})

    # --- toolbox ---
    def _upload(self, body: bytes, q: Any, sid: str) -> None:
        box = self._box(sid)
        if box is None:
            return self._error(404, "sandbox not found")
        head = f"Content-Type: {self.headers['content-type']}\r\n\r\n".encode()
        msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
        paths: dict[str, str] = {}
        files: dict[str, bytes] = {}
        for part in msg.iter_parts():
            name = part.get_param("name", header="content-disposition") or ""
            data = part.get_payload(decode=True) or b""
            index = name.split("]")[0]
            if name.endswith(".path"):
                paths[index] = data.decode()
            elif name.endswith(".file"):
                files[index] = data
        for index, remote in paths.items():
            target = box.local(remote)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(files[index])
        self._send(200, None)

    def _download(self, body: bytes, q: Any, sid: str) -> None:
        box = self._box(sid)
        if box is None:
            return self._error(404, "sandbox not found")
        parts = []
        for remote in json.loads(body)["paths"]:
            local = box.local(remote)
            if local.is_file():
                parts.append(("file", remote, local.read_bytes()))
            else:
                err = json.dumps({"message": "file not found", "statusCode": 404}).encode()
                parts.append(("error", remote, err))
        self._send(200, raw=_multipart(parts))

    def _exec(self, body: bytes, q: Any, sid: str) -> None:
        box = self._box(sid)
        if box is None:
            return self._error(404, "sandbox not found")
        req = json.loads(body)
        cwd = box.local(req.get("cwd") or "/home/daytona")
        env = {"PATH": os.environ["PATH"], "HOME": str(box.local("/home/daytona"))}
        env.update(req.get("envs") or {})
        # the sandbox's absolute paths live under its root here
        env = {k: str(box.local(v)) if v.startswith("/home/") else v for k, v in env.items()}
        try:
            done = subprocess.run(
                ["/bin/sh", "-c", req["command"]],
                cwd=cwd,
                env=env,
                capture_output=True,
                timeout=req.get("timeout") or None,
            )
        except subprocess.TimeoutExpired:
            return self._error(408, "command timed out")
        out = (done.stdout + done.stderr).decode(errors="replace")
        self._send(200, {"exitCode": done.returncode, "result": out})


@contextmanager
def fake_daytona(root: Path) -> Iterator[FakeDaytona]:
    root.mkdir(parents=True, exist_ok=True)
    state = FakeDaytona(root=root)
    handler = type("Handler", (_Handler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.api_url = f"http://127.0.0.1:{server.server_address[1]}/api"
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()
