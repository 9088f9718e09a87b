"""The agent-run commands as an operator runs them, through the ``forklab`` command's own
dispatch (in this process: the process boundary is not what these test)."""

from __future__ import annotations

import asyncio
import getpass
import json
from typing import Any

import pytest
from agent_fixtures import AgentTestLab
from helpers import forklab_in_process as forklab
from orchestration_lab import Lab, make_spec
from temporalio.client import WorkflowFailureError

from forklab.experiments.runfork.policy import ToolPolicy
from forklab.workers.config import ENV
from forklab.workflows.experiment.messages import Stage, workflow_id


def _env(agent_lab: AgentTestLab, address: str) -> dict[str, str]:
    import os

    a = agent_lab.agent
    return {
        **os.environ,
        ENV["address"]: address,
        ENV["home"]: str(a.home),
        "FORKLAB_MODEL_BASE_URL": a.model_base_url,
        "FORKLAB_EFFECTS_URL": a.effects_url,
        "FORKLAB_AGENT_TASK_QUEUE": a.agent_task_queue,
    }


async def test_fork_steps_diff_trail_outcome_promote_watch(agent_lab: AgentTestLab) -> None:
    parent = await agent_lab.start_research(model="fast")
    with pytest.raises(WorkflowFailureError):
        await parent.result()
    env = _env(agent_lab, agent_lab.client.service_client.config.target_host)

    out = forklab(env, "steps", parent.id)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 7 and "chat_model (fast)" in lines[1] and "charge_customer" in lines[4]

    out = await asyncio.to_thread(  # it waits for the fork, which the worker here runs
        forklab, env, "fork", parent.id, "--at-step", "3", "--model", "slow",
        "--name", f"{parent.id}-slow", "--tool-policy", "charge_customer=block",
        "--intervention", '{"note": "try slow"}',
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    receipt = json.loads(out.stdout.split("\n", 1)[1])
    assert receipt["resolved_step"] == 3
    assert receipt["tool_policies"]["charge_customer"] == ToolPolicy.block
    fork = agent_lab.client.get_workflow_handle(f"{parent.id}-slow")
    assert (await fork.result())["status"] == "ok"

    out = forklab(env, "diff", parent.id, fork.id)
    assert out.returncode == 0, out.stderr
    assert f"common ancestor: {parent.id}" in out.stdout and "divergence step: 4" in out.stdout
    assert "changed sections.recommendations" in out.stdout

    out = forklab(env, "trail", fork.id, "--json")
    trail = json.loads(out.stdout)
    assert trail["lineage"] == [parent.id, fork.id] and trail["receipts"][0]["requested_step"] == 3

    assert forklab(env, "outcome", fork.id, "--label", "fixed", "--score", "0.9").returncode == 0
    out = forklab(env, "outcome", fork.id, "--label", "checked", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "run": fork.id,
        "label": "checked",
        "score": None,
        "by": getpass.getuser(),
    }
    out = forklab(env, "promote", fork.id, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "promoted": fork.id,
        "closed": [parent.id],
        "siblings": {parent.id: "already_closed"},  # the parent had closed in Temporal
        "by": getpass.getuser(),
    }
    out = forklab(env, "promote", fork.id)
    assert out.returncode == 0 and parent.id in out.stdout

    # --json: one object per event, stdout holding nothing else; the next offset on stderr
    out = forklab(env, "watch", fork.id, "--from", "2", "--json")
    events = [json.loads(line) for line in out.stdout.splitlines()]
    offsets = [e["offset"] for e in events]
    assert offsets[0] == 2 and offsets == list(range(2, 2 + len(offsets)))
    assert out.stderr == f"next offset: {offsets[-1] + 1}\n"
    # for people: a line per event with its offset, step, kind and activity
    out = forklab(env, "watch", fork.id, "--from", "2")
    lines = out.stdout.splitlines()
    assert len(lines) == len(events) and out.stderr == f"next offset: {offsets[-1] + 1}\n"
    for line, e in zip(lines, events, strict=True):
        assert line.split()[0] == str(e["offset"]) and e["kind"] in line, line
        assert not line.lstrip().startswith("{")


async def test_bad_fork_requests_exit_2_with_one_line(agent_lab: AgentTestLab) -> None:
    parent = await agent_lab.start_research(model="slow", fail_on_low_score=False)
    await parent.result()
    env = _env(agent_lab, agent_lab.client.service_client.config.target_host)
    cases = {
        ("--at-step", "3", "--tool-policy", "charge_customer=maybe"): "not one of",
        ("--at-step", "3", "--intervention", "{oops"): "--intervention: not valid JSON",
        ("--at-step", "99"): "only 6 steps",
        ("--at-step", "3", "--name", "bad name!"): "fork name",
        ("--at-step", "3", "--name", parent.id): "is the id of an existing workflow",
    }
    for args, message in cases.items():
        out = forklab(env, "fork", parent.id, *args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    for command in (("fork", "no-such-run", "--at-step", "1"), ("watch", "no-such-run")):
        out = forklab(env, *command)
        assert out.returncode == 2 and "no run 'no-such-run'" in out.stderr, (command, out)
        assert "Traceback" not in out.stderr and "next offset" not in out.stdout


async def test_status_of_a_workflow_that_is_no_experiment_says_so(
    agent_lab: AgentTestLab,
) -> None:
    """An agent run under an experiment's workflow id (started with Temporal's own CLI,
    say): `forklab status` and `report` used to end in a traceback."""
    run = await agent_lab.start_research(run_id="forklab-not-an-experiment", model="slow")
    await run.result()
    env = _env(agent_lab, agent_lab.client.service_client.config.target_host)
    for command in ("status", "report"):
        # in a thread: the worker answering the query runs on this test's event loop
        out = await asyncio.to_thread(forklab, env, command, "not-an-experiment")
        assert out.returncode == 1, out
        assert out.stderr.startswith(
            "forklab: error: workflow forklab-not-an-experiment refused ForkLab's status query ("
        ), out.stderr
        assert "it is not a ForkLab experiment" in out.stderr
        assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr


async def test_list_shows_experiments_runs_and_forks_from_visibility(
    lab: Lab, agent_lab: AgentTestLab
) -> None:
    """``forklab list`` against a live dev server: an agent run, its fork and an experiment
    awaiting approval, each under its kind, and the filters (kind, status, stage, lineage)
    keeping exactly what they name."""
    parent = await agent_lab.start_research(model="fast")
    with pytest.raises(WorkflowFailureError):
        await parent.result()
    env = _env(agent_lab, agent_lab.client.service_client.config.target_host)
    name = f"{parent.id}-slow"
    out = await asyncio.to_thread(
        forklab, env, "fork", parent.id, "--at-step", "3", "--model", "slow", "--name", name
    )
    assert out.returncode == 0, out.stderr
    assert (await agent_lab.client.get_workflow_handle(name).result())["status"] == "ok"
    spec = make_spec()
    experiment, _ = await lab.start(spec)
    await lab.wait_for(experiment, Stage.awaiting_approval)

    async def rows(*args: str, expect: int) -> list[dict[str, Any]]:
        """The listed rows, once visibility (eventually consistent) shows ``expect``."""
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            out = await asyncio.to_thread(forklab, env, "list", *args, "--json")
            assert out.returncode == 0 and out.stderr == "", out.stderr
            found: list[dict[str, Any]] = json.loads(out.stdout)
            if len(found) >= expect or asyncio.get_running_loop().time() > deadline:
                return found
            await asyncio.sleep(0.5)

    family = await rows("--lineage", parent.id, "--limit", "1000", expect=2)
    assert {(r["kind"], r["workflow_id"], r["status"]) for r in family} == {
        ("run", parent.id, "failed"),
        ("fork", name, "completed"),
    }
    (fork_row,) = [r for r in family if r["kind"] == "fork"]
    assert fork_row["parent"] == parent.id
    root = f"{parent.id}@{parent.first_execution_run_id or parent.result_run_id}"
    assert fork_row["lineage_root"] == root
    whole = await rows("--lineage", root, expect=2)  # the root as a receipt shows it
    assert sorted(r["workflow_id"] for r in whole) == sorted([parent.id, name])
    forks = await rows("--kind", "fork", "--lineage", parent.id, expect=1)
    assert [r["workflow_id"] for r in forks] == [name]
    failed = await rows("--status", "Failed", "--lineage", parent.id, expect=1)
    assert [r["workflow_id"] for r in failed] == [parent.id]
    waiting = await rows(
        "--kind", "experiment", "--stage", "awaiting_approval", "--limit", "1000", expect=1
    )
    mine = [r for r in waiting if r["workflow_id"] == workflow_id(spec.id)]
    assert mine and mine[0]["stage"] == "awaiting_approval" and mine[0]["status"] == "running"
    assert all(r["kind"] == "experiment" for r in waiting)
    # the same for people: a header and a row per workflow, data on stdout
    out = await asyncio.to_thread(forklab, env, "list", "--lineage", parent.id)
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["kind", "status", "started"] and len(lines) == 3, out.stdout
    assert {line.split()[0] for line in lines[1:]} == {"run", "fork"}
    await experiment.cancel()
