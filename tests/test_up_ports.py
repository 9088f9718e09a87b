"""``forklab up`` owns its ports: one held by something it did not start stops it before
anything starts, with one sentence naming the port, the setting and the holder; two
settings giving one port are refused; and the dev server's HTTP and metrics ports come
from the settings (a real dev server listens on exactly them)."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from free_ports import free_port

from forklab.workers.config import Settings
from forklab.workers.ports import holder, listening_inodes
from forklab.workers.server import server_argv, start_server, stop_server, wait_reachable
from tests.helpers import run_cli


@contextmanager
def held_port() -> Iterator[int]:
    """A port this test process listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("FORKLAB_HOME", str(home))
    monkeypatch.setenv("FORKLAB_ADDRESS", f"127.0.0.1:{free_port()}")
    for var in ("UI", "HTTP", "METRICS", "MODEL", "EFFECTS"):
        monkeypatch.setenv(f"FORKLAB_{var}_PORT", str(free_port()))
    for var in ("FORKLAB_MODEL_BASE_URL", "FORKLAB_EFFECTS_URL"):
        monkeypatch.delenv(var, raising=False)
    return home


def test_the_holder_of_a_port_is_named_by_pid_and_command() -> None:
    with held_port() as port:
        assert listening_inodes(port)
        assert holder(port).startswith(f"pid {os.getpid()} (")
    assert not listening_inodes(port)


@pytest.mark.parametrize(
    ("variable", "what"),
    [
        ("FORKLAB_MODEL_PORT", "the local model server"),
        ("FORKLAB_EFFECTS_PORT", "the payments/mail service"),
        ("FORKLAB_UI_PORT", "the Web UI"),
        ("FORKLAB_HTTP_PORT", "the dev server's HTTP API"),
        ("FORKLAB_METRICS_PORT", "the dev server's metrics"),
    ],
)
def test_up_refuses_a_port_someone_else_holds_before_it_starts_anything(
    variable: str,
    what: str,
    fresh: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with held_port() as port:
        monkeypatch.setenv(variable, str(port))
        code, out, err = run_cli(capsys, "up")
    assert (code, out) == (1, "")
    assert err == (
        f"forklab: error: port {port} ({what}, setting {variable}) is held by pid "
        f"{os.getpid()} ({holder_command()}), which `forklab up` did not start; stop it or "
        f"set {variable} to a free port\n"
    )
    assert not (fresh / "run").exists()  # nothing was started


def test_up_refuses_a_temporal_address_someone_else_holds(
    fresh: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with held_port() as port:
        monkeypatch.setenv("FORKLAB_ADDRESS", f"127.0.0.1:{port}")
        code, _, err = run_cli(capsys, "up")
    assert code == 1
    assert err.startswith(
        f"forklab: error: port {port} (the Temporal frontend, setting FORKLAB_ADDRESS) is "
        f"held by pid {os.getpid()} ("
    )
    assert err.endswith("(to use that server as it is, run only a worker: `forklab worker`)\n")
    assert not (fresh / "run").exists()


def test_two_settings_on_one_port_are_refused(
    fresh: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    monkeypatch.setenv("FORKLAB_UI_PORT", str(port))
    monkeypatch.setenv("FORKLAB_MODEL_PORT", str(port))
    code, out, err = run_cli(capsys, "up")
    assert (code, out) == (2, "")
    assert err == (
        f"forklab: error: FORKLAB_UI_PORT and FORKLAB_MODEL_PORT both give port {port}; "
        "give each its own port\n"
    )


def holder_command() -> str:
    text = " ".join(w.decode() for w in Path("/proc/self/cmdline").read_bytes().split(b"\0") if w)
    return text if len(text) <= 80 else text[:79] + "…"


def fixed_ports(count: int) -> list[int]:
    """Free ports below the ephemeral range: the dev server picks its internal services'
    ports with ``bind(0)``, which may hand out a port ``free_port`` has just released."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    found: list[int] = []
    for port in random.Random().sample(range(20000, min(low, 32000)), 200):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                found.append(port)
        if len(found) == count:
            return found
    raise AssertionError("no free ports below the ephemeral range")


def test_the_dev_server_opens_the_http_and_metrics_ports_of_the_settings(tmp_path: Path) -> None:
    grpc, ui, http, metrics = fixed_ports(4)
    settings = Settings.load(
        {
            "home": tmp_path / "home",
            "address": f"127.0.0.1:{grpc}",
            "ui_port": ui,
            "http_port": http,
            "metrics_port": metrics,
        },
        env={},
    )
    argv = server_argv(settings)
    assert argv[argv.index("--http-port") + 1] == str(http)
    assert argv[argv.index("--metrics-port") + 1] == str(metrics)
    assert start_server(settings)
    try:
        for port in (settings.port, settings.ui_port, http, metrics):  # (opened one by one)
            assert wait_reachable("127.0.0.1", port, 20), port
    finally:
        stop_server(settings)


def test_unset_http_and_metrics_ports_sit_beside_the_address() -> None:
    settings = Settings.load({"address": "localhost:7256"}, env={})
    assert (settings.dev_http_port, settings.dev_metrics_port) == (7266, 7267)
    top = Settings.load({"address": "localhost:65530"}, env={})
    assert (top.dev_http_port, top.dev_metrics_port) == (65520, 65519)
