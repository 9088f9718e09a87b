"""A fork as the Temporal Web UI shows it: linked to the run it was forked from, its
summary and receipt naming the model, intervention and tool policies in effect (its Input
is the parent's, which still says ``"model": "fast"``), and its timeline saying which
model its live calls used. Checked on the events Temporal stores and on the page the
Web UI (the dev server's own) renders in a headless chromium."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_fixtures import AgentTestLab, Services, running_agent_lab
from free_ports import free_port
from orchestration_lab import temporal_path
from PIL import Image
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from forklab.contracts.fork_request import ForkRequest
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.receipt import BoundaryMode


@pytest.fixture
async def ui_lab(services: Services, tmp_path: Path) -> AsyncIterator[tuple[AgentTestLab, int]]:
    """An agent worker on a dev server of its own that serves the Web UI."""
    port = free_port()
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_path(),
        data_converter=pydantic_data_converter,
        ui=True,
        ui_port=port,
    )
    try:
        async with running_agent_lab(env, services, tmp_path) as lab:
            yield lab, port
    finally:
        await env.shutdown()


def _summary(event: object) -> str:
    metadata = getattr(event, "user_metadata", None)
    if metadata is None or not metadata.HasField("summary"):
        return ""
    text: str = json.loads(metadata.summary.data)  # a JSON payload
    return text


def _chromium(url: str, shot: Path) -> str:
    """The page's DOM once its scripts have rendered it, and a screenshot of it."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed; run scripts/ensure-chromium.sh (make test does)")
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={shot.parent / 'profile'}",
        "--virtual-time-budget=20000",  # the UI's fetches, in virtual time
        "--window-size=1600,1200",
    ]
    run = [*flags, f"--screenshot={shot}", url]
    done = subprocess.run([found, *run], capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    dom = subprocess.run(
        [found, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=180, check=False
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    return dom.stdout


async def test_a_fork_in_the_web_ui_names_its_parent_and_the_model_it_ran(
    ui_lab: tuple[AgentTestLab, int], tmp_path: Path
) -> None:
    lab, port = ui_lab
    parent = await lab.start_research(model="fast")
    with pytest.raises(WorkflowFailureError):
        await parent.result()
    fork = await lab.lab.fork(
        ForkRequest(
            run=parent.id,
            at_step=3,
            name=f"{parent.id}-slow",
            model="slow",
            intervention={"why": "thin"},
            tool_policies={"charge_customer": ToolPolicy.block},
            requested_by="tester",
        )
    )
    await fork.handle.result()
    source_run = fork.receipt.source_run_id
    history = await fork.handle.fetch_history()
    started = history.events[0]
    # the link Temporal keeps on the fork's first event: the run it starts from
    (link,) = started.links
    assert (link.workflow_event.workflow_id, link.workflow_event.run_id) == (parent.id, source_run)
    assert (
        link.workflow_event.event_ref.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED
    )
    # the input is the parent's, unchanged: the summary and the receipt say what ran
    assert b'"model":"fast"' in started.workflow_execution_started_event_attributes.input.payloads[
        0
    ].data.replace(b" ", b"")
    summary = (
        f"fork of {parent.id} at step 3 (exact): model slow, "
        'intervention {"why":"thin"}, tools charge_customer=block'
    )
    desc = await fork.handle.describe()
    assert await desc.static_summary() == summary
    details = await desc.static_details() or ""
    assert details.splitlines()[2].startswith("**In effect from step 4**: model `slow`")
    # the timeline: the fetch names the model to come, the live model calls the one used
    scheduled = [
        e for e in history.events if e.HasField("activity_task_scheduled_event_attributes")
    ]
    fetch = next(
        e
        for e in scheduled
        if e.activity_task_scheduled_event_attributes.activity_type.name == "forklab.fetch_prefix"
    )
    assert _summary(fetch) == f"fork of {parent.id}: inherit steps 1..3; model slow from step 4"
    models = [
        _summary(e)
        for e in scheduled
        if e.activity_task_scheduled_event_attributes.activity_type.name == "chat_model"
    ]
    assert models and all(s.endswith(" · model slow") for s in models), models

    # a lineage-only fork inherits nothing, yet its model is swapped after the step asked
    live = await lab.lab.fork(
        ForkRequest(run=parent.id, at_step=3, model="slow", boundary=BoundaryMode.lineage_only)
    )
    shown = await (await live.handle.describe()).static_summary() or ""
    assert shown.startswith(f"fork of {parent.id} at step 3 (lineage_only): model slow,")
    receipt = await (await live.handle.describe()).static_details() or ""
    assert "nothing is served from the parent's history (lineage only)" in receipt
    assert "**In effect from step 4**: model `slow`" in receipt

    # the Web UI's page of that first event: the summary, and a link to the parent's run
    run_id = history.events[0].workflow_execution_started_event_attributes.original_execution_run_id
    page = f"http://127.0.0.1:{port}/namespaces/default/workflows/{fork.handle.id}/{run_id}"
    shot = tmp_path / "fork-event-1.png"
    dom = await asyncio.to_thread(_chromium, f"{page}/history/events/1", shot)
    assert summary.replace('"', "&quot;") in dom or summary in dom
    assert f"/namespaces/default/workflows/{parent.id}/{source_run}/history/events/1" in dom
    image = Image.open(shot).convert("RGB")
    assert len(image.getcolors(maxcolors=1 << 20) or []) > 50  # not a blank page
