"""``forklab demo`` from nothing: it starts a dev server and a worker, runs an experiment
through approval to the report, and stops what it started."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from orchestration_lab import ROOT

FORKLAB = str(Path(sys.executable).parent / "forklab")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_demo_runs_from_nothing_and_stops_what_it_started(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "FORKLAB_HOME": str(tmp_path / "home"),
        "FORKLAB_ADDRESS": f"127.0.0.1:{port}",
        "FORKLAB_UI_PORT": str(free_port()),
        "FORKLAB_TASK_QUEUE": "forklab-demo-test",
    }
    spec = ROOT / "experiments" / "recovery-counter.yaml"
    demo = subprocess.run(
        [FORKLAB, "demo", "--yes", "--spec", str(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    out = demo.stdout
    assert "started in the background: server and worker" in out
    assert "3. approved by 'demo --yes'" in out
    assert "  [running_" in out and "world batches" in out  # progress was shown
    assert "# Experiment `recovery-counter-" in out and "## Durable run" in out
    assert "cleanup: 0 sandboxes found, 0 removed, 0 left" in out
    assert out.rstrip().endswith("stopped what the demo started: server and worker")
    with socket.socket() as s:  # the dev server is gone
        assert s.connect_ex(("127.0.0.1", port)) != 0
    assert not list((tmp_path / "home" / "run").glob("*.pid"))
