"""`forklab up` and the dev server it starts: a bad setting stops `up` before anything
starts, and a server that dies at start is reported at once, with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from free_ports import free_port

from forklab.workers.config import Settings
from forklab.workers.server import ServerError, start_server
from tests.helpers import run_cli


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("FORKLAB_ADDRESS", "127.0.0.1:99999", "setting address (FORKLAB_ADDRESS) is"),
        ("FORKLAB_MODEL_PORT", "abc", "setting model_port (FORKLAB_MODEL_PORT) is invalid"),
    ],
)
def test_up_refuses_a_bad_setting_before_it_starts_anything(
    variable: str,
    value: str,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """A port past 65535 used to pass, and `up` waited a minute for a server that had
    died at once; a bad agent setting stopped `up` only after the server and the worker
    had started, and left them running."""
    monkeypatch.setenv("FORKLAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FORKLAB_ADDRESS", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv(variable, value)
    code, out, err = run_cli(capsys, "up")
    assert (code, out) == (2, "")
    assert err.startswith(f"forklab: error: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "home").exists()  # no server, no worker, no pidfile


def test_a_server_that_dies_at_start_is_reported_at_once(tmp_path: Path) -> None:
    """The dev server cannot open its database (a folder stands where the file goes): it
    exits at once, and `up` says so with the server's last line instead of waiting out
    its 60 s for a port nobody will open."""
    settings = Settings.load(
        {"home": tmp_path / "home", "address": f"127.0.0.1:{free_port()}"}, env={}
    )
    settings.temporal_db.mkdir(parents=True)
    with pytest.raises(ServerError) as refused:
        start_server(settings)
    message = str(refused.value)
    assert message.startswith(
        f"the Temporal dev server exited before it accepted connections on {settings.address} ("
    ), message
    assert message.endswith(f"; see {settings.logs_dir / 'server.log'}")
    assert not (settings.run_dir / "server.pid").exists()
