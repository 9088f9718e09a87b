"""``forklab demo agent --yes`` as a person runs it, from nothing: the diff shows each
changed path with its values (not the paths alone), and the Web UI links of the run and
the fork stay true after the demo stopped the server it started (they say to start it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from free_ports import free_port

FORKLAB = str(Path(sys.executable).parent / "forklab")


def test_the_agent_demo_shows_the_diffs_values_and_the_web_ui_links(tmp_path: Path) -> None:
    ui = free_port()
    env = {
        **os.environ,
        "FORKLAB_HOME": str(tmp_path / "home"),
        "FORKLAB_ADDRESS": f"127.0.0.1:{free_port()}",
        "FORKLAB_UI_PORT": str(ui),
        "FORKLAB_HTTP_PORT": str(free_port()),
        "FORKLAB_METRICS_PORT": str(free_port()),
        "FORKLAB_MODEL_PORT": str(free_port()),
        "FORKLAB_EFFECTS_PORT": str(free_port()),
        "FORKLAB_AGENT_TASK_QUEUE": "forklab-agent-demo-test",
    }
    demo = subprocess.run(
        [FORKLAB, "demo", "agent", "--yes"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    out = demo.stdout
    diff = out.split("4. diff", 1)[1].split("5. parent events", 1)[0]
    # values, not only paths: the fix is visible in the demo's own output
    assert ' changed status: "failed" -> "ok"' in diff
    assert ' changed invoice.status: "charged" -> "blocked"' in diff
    assert " changed score: 0.8 -> 1.0" in diff
    assert all(len(line) < 200 for line in diff.splitlines()), "long values are cut"
    run_id = out.split("1. research pipeline ", 1)[1].split()[0]
    base = f"http://localhost:{ui}/namespaces/default/workflows"
    assert f"the run in the Web UI: `forklab up`, then {base}/{run_id}\n" in out
    assert f"the fork in the Web UI: {base}/{run_id}-slow\n" in out
    assert "stopped what the demo started:" in out and "server" in out
