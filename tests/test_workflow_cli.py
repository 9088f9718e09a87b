"""The operator CLI as a person runs it: ``demo`` from nothing (it starts a dev server and
a worker, runs an experiment through approval to the report, and stops what it started),
then ``reject``, ``cancel``, ``status`` and ``report`` against running experiments, and
``start`` and ``status`` where no worker polls."""

from __future__ import annotations

import asyncio
import getpass
import os
import re
import socket
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

from free_ports import free_port
from helpers import CliResult
from helpers import forklab_in_process as forklab_in
from orchestration_lab import Lab, cli_env, make_spec

from forklab.cli.ops_common import POLLER_GONE, live_pollers, workflow_pollers
from forklab.workflows.experiment.messages import Stage, Status, workflow_id

FORKLAB = str(Path(sys.executable).parent / "forklab")


#: The flagship demo's story must fit one screen (issue 36: ≤ 40 lines).
DEMO_SCREEN_LINES = 40


def test_demo_runs_from_nothing_tells_its_story_in_a_screen_and_stops_what_it_started(
    tmp_path: Path,
) -> None:
    """``make demo`` as a person runs it (the default spec, retry-cascade): a story of at
    most one screen with the predictions counted, a verdict and interval per world, the
    validity and noise line, where the report is, and hints that still work once the
    demo has stopped the server it started."""
    port = free_port()
    env = {
        **os.environ,
        "FORKLAB_HOME": str(tmp_path / "home"),
        "FORKLAB_ADDRESS": f"127.0.0.1:{port}",
        "FORKLAB_UI_PORT": str(free_port()),
        "FORKLAB_HTTP_PORT": str(free_port()),
        "FORKLAB_METRICS_PORT": str(free_port()),
        "FORKLAB_TASK_QUEUE": "forklab-demo-test",
    }
    demo = subprocess.run(
        [FORKLAB, "demo", "--yes"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    out, lines = demo.stdout, demo.stdout.splitlines()
    assert len(lines) <= DEMO_SCREEN_LINES, out
    # it started its own worker and waited for it: no warning that no worker polls
    assert "no worker has polled" not in demo.stderr, demo.stderr
    assert "started in the background: server and worker" in out
    assert "3. approved by 'demo --yes'" in out and "world batches" in out
    assert (
        "Hypothesis partly supported: 5 of 7 predictions supported; jitter and queue-memory "
        "inconclusive." in out
    )
    assert (
        "Valid: 8 of 8 validity checks passed. Noise: placebo differed from baseline in 0 of "
        "160 episodes." in out
    )
    for world in ("jitter", "broadcast", "queue-memory", "latency", "restart", "placebo"):
        row = next(line for line in lines if line.split()[:1] == [world])
        assert re.search(r"[+-]\d\.\d{3} \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\]", row), row
    assert " 1 sandboxes" not in out and not re.search(r"\d\.\d{2,} of 300", out)
    (folder,) = (tmp_path / "home" / "reports").iterdir()  # <home>/reports/<experiment id>
    assert f"5. report: {folder}/report.html" in out
    assert sorted(p.name for p in folder.iterdir()) == ["report.html", "report.json", "report.md"]
    assert out.rstrip().endswith("stopped what the demo started: server and worker")
    with socket.socket() as s:  # the dev server is gone
        assert s.connect_ex(("127.0.0.1", port)) != 0
    assert not list((tmp_path / "home" / "run").glob("*.pid"))
    # the closing hints work now that the server is down
    experiment = folder.name
    assert f"forklab report {experiment}" in out
    assert f"`forklab up`, then http://localhost:{env['FORKLAB_UI_PORT']}/" in out
    report = subprocess.run(
        [FORKLAB, "report", experiment],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert report.returncode == 0, report.stderr
    assert report.stdout == (folder / "report.md").read_text()
    assert "not reachable" in report.stderr and "`forklab up`" in report.stderr


async def test_reject_cancel_and_their_aftermath_through_the_cli(lab: Lab) -> None:
    env = {
        **os.environ,
        "FORKLAB_ADDRESS": lab.settings.address,
        "FORKLAB_HOME": str(lab.settings.home),
        "FORKLAB_TASK_QUEUE": lab.settings.task_queue,
    }

    def forklab(*args: str) -> CliResult:
        return forklab_in(env, *args)

    rejected, cancelled = make_spec(), make_spec()
    first, _ = await lab.start(rejected)
    second, _ = await lab.start(cancelled)
    await lab.wait_for(first, Stage.awaiting_approval)
    await lab.wait_for(second, Stage.awaiting_approval)

    done = await asyncio.to_thread(forklab, "reject", rejected.id, "--reason", "not now")
    assert done.returncode == 0, done.stderr
    assert (await first.result()).status is Status.rejected
    late = await asyncio.to_thread(forklab, "approve", rejected.id)
    assert late.returncode == 1
    assert late.stderr == (
        f"forklab: error: experiment {rejected.id} has ended (rejected: rejected by "
        f"{getpass.getuser()}); it takes no more approvals\n"
    )

    done = await asyncio.to_thread(forklab, "cancel", cancelled.id)
    assert done.returncode == 0, done.stderr
    status = await lab.wait_for(second, Stage.done)
    assert status.status is Status.cancelled and status.cleanup is not None
    shown = await asyncio.to_thread(forklab, "status", cancelled.id)
    assert "cancelled" in shown.stdout and "web UI: http" in shown.stdout
    report = await asyncio.to_thread(forklab, "report", cancelled.id)
    assert report.returncode == 1
    assert report.stderr.strip() == (
        f"forklab: error: experiment {cancelled.id} ended cancelled without a report: "
        "cancelled by the operator"
    )
    again = await asyncio.to_thread(forklab, "cancel", cancelled.id)
    assert again.returncode == 1 and "is not running" in again.stderr
    assert lab.sandbox_folders() == []


async def test_without_a_worker_start_and_status_say_why(lab: Lab, tmp_path: Path) -> None:
    """A run on a task queue no worker polls: ``forklab start`` says the run waits for a
    worker; ``status`` says on stderr that no worker polls the queue as soon as its query
    is slow (a query nobody answers waits out the server's ~30 s), then waits it out and
    fails with one sentence."""
    queue = f"nobody-{uuid.uuid4().hex[:8]}"
    env = {**cli_env(lab.settings), "FORKLAB_TASK_QUEUE": queue}
    spec = make_spec()
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec.model_dump_json())
    started = await asyncio.to_thread(forklab_in, env, "start", str(spec_file))
    assert started.returncode == 0, started.stderr
    # a message, not data: on stderr (stdout is what `start --json` would print)
    assert f"no worker has polled task queue {queue!r} lately: the run waits" in started.stderr
    status = await asyncio.to_thread(forklab_in, env, "status", spec.id)
    assert status.returncode == 1 and status.stdout == ""
    note, error = status.stderr.splitlines()
    assert note == (
        f"forklab: no worker has polled task queue {queue!r} in the last 2 minutes; start one "
        "with `forklab up` (or `forklab worker` where Temporal is reachable); waiting for the "
        "status query"
    )
    assert error.startswith("forklab: error: the experiment did not answer its status query (")
    assert error.endswith("); is a ForkLab worker running (`forklab up`)?")
    await lab.client.get_workflow_handle(workflow_id(spec.id)).terminate("test over")

    # the lab's own queue has a live worker: the same check finds it, and finds it gone
    # once its last poll is older than POLLER_GONE, or when the run needs another build
    pollers = await workflow_pollers(lab.client, lab.settings.namespace, lab.settings.task_queue)
    now = datetime.now(UTC)
    assert live_pollers(pollers, now, None)
    assert not live_pollers(pollers, now + POLLER_GONE, None)
    assert not live_pollers(pollers, now, "a-build-nobody-runs")
    other = make_spec()
    spec_file.write_text(other.model_dump_json())
    started = await asyncio.to_thread(forklab_in, cli_env(lab.settings), "start", str(spec_file))
    assert started.returncode == 0, started.stderr
    assert "no worker has polled" not in started.stdout + started.stderr
    await lab.client.get_workflow_handle(workflow_id(other.id)).terminate("test over")
