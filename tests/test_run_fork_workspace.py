"""Agent runs with a workspace, forked: the research pipeline keeps each section as a file
(one sealed layer per write step, on a real dev server, through the real model server),
and a fork at step N starts from step N's layer, copy-on-write, on overlay mounts and on
the copy fallback alike."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from agent_fixtures import AgentTestLab, Services, agent_settings
from fork_workloads import FilesInput, FilesWorkflow, echo, hold
from helpers import forklab_in_process as forklab
from temporalio.client import Client, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from forklab.activities.runfork.fork_keys import issuer_key_path
from forklab.activities.runfork.workspace import (
    WorkspaceStep,
    WorkspaceTools,
    WorkspaceWrite,
    agent_workspaces_root,
)
from forklab.activities.sandbox.workspace import LayerStore, Workspaces, unmount_under
from forklab.agents.tools import LedgerMode
from forklab.cli.runfork.agent_lab import AgentLab, ForkError, workspace_layer_at
from forklab.contracts.errors import ForkErrorType
from forklab.contracts.fork_request import ForkRequest
from forklab.experiments.runfork.steps import Step, StepOrigin
from forklab.temporal import ForkLabPlugin
from forklab.workers.config import ENV, Settings
from forklab.workers.runfork.agent_worker import (
    build_agent_worker,
    connect_agents,
)

WRITE = "workspace_write"


@pytest.fixture(params=[True, False], ids=["overlay", "copy"])
async def ws_lab(
    request: pytest.FixtureRequest,
    temporal_env: WorkflowEnvironment,
    services: Services,
    tmp_path: Path,
) -> AsyncIterator[AgentTestLab]:
    agent = agent_settings(services, tmp_path / "home")
    target = temporal_env.client.service_client.config.target_host
    settings = Settings.load({"address": target, "home": tmp_path / "home"}, env={})
    client = await connect_agents(settings, agent)
    try:
        async with build_agent_worker(
            client, agent, LedgerMode.ledger_query, overlay=request.param
        ):
            yield AgentTestLab(
                lab=AgentLab(client, agent), client=client, agent=agent, services=services
            )
    finally:
        unmount_under(tmp_path)


def _files(lab: AgentTestLab, layer: str) -> dict[str, bytes]:
    """Every file of the workspace layer ``layer`` holds (its stack, verified), by path."""
    root = agent_workspaces_root(lab.agent.home)
    ws = Workspaces(root, overlay=False)
    ws_id = f"read-{uuid.uuid4().hex[:8]}"
    target = root / "reads" / ws_id
    ws.attach(ws_id, target, layer)
    try:
        return {
            str(p.relative_to(target)): p.read_bytes()
            for p in sorted(target.rglob("*"))
            if p.is_file()
        }
    finally:
        ws.remove(ws_id)


def _layers(lab: AgentTestLab) -> LayerStore:
    return LayerStore(agent_workspaces_root(lab.agent.home))


async def _parent(lab: AgentTestLab) -> tuple[str, dict[str, str]]:
    """A failed research run with a workspace: its id and sections."""
    handle = await lab.start_research(model="fast", workspace=True)
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    state = failure.value.cause.details[0]  # type: ignore[attr-defined]
    return handle.id, state["sections"]


async def test_a_fork_at_step_n_starts_from_the_parents_files_at_n(ws_lab: AgentTestLab) -> None:
    lab = ws_lab
    parent_id, parent_sections = await _parent(lab)
    steps = await lab.lab.steps(parent_id)
    kinds = [s.activity_type for s in steps]
    assert kinds == ["chat_model", WRITE] * 3 + ["charge_customer"] + ["chat_model", WRITE] * 2
    # the history says which layer holds the workspace after each step
    after = {s.index: workspace_layer_at(steps[: s.index]) for s in steps}
    assert after[1] is None and after[2] is not None
    assert after[3] == after[2] and after[7] == after[6]  # no file touched: same layer
    assert len({after[i] for i in (2, 4, 6, 9, 11)}) == 5
    parent_end = after[11]
    assert parent_end is not None
    parent_files = _files(lab, parent_end)
    assert parent_files == {
        f"report/{name}.md": text.encode() for name, text in parent_sections.items()
    }
    store = _layers(lab)
    parent_layers = sorted(p.name for p in store.root.iterdir() if not p.name.startswith("."))
    for digest in {after[i] for i in (2, 4, 6, 9, 11)}:
        assert digest is not None
        store.verify(digest, full=True)

    fork = await lab.lab.fork(
        ForkRequest(run=parent_id, at_step=4, model="slow", requested_by="tester")
    )
    # the receipt carries step 4's layer, which holds exactly the parent's files at step 4
    at_four = after[4]
    assert at_four is not None and fork.receipt.workspace_layer_sha256 == at_four
    assert _files(lab, at_four) == {
        "report/research.md": parent_sections["research"].encode(),
        "report/insights.md": parent_sections["insights"].encode(),
    }
    assert (await lab.lab.chain(fork.handle.id))[0].receipt == fork.receipt

    state = await fork.handle.result()
    assert state["status"] == "ok"
    fork_steps = await lab.lab.steps(fork.handle.id)
    assert [s.origin for s in fork_steps][:4] == [StepOrigin.inherited] * 4
    first_own = workspace_layer_at(fork_steps[:6])
    assert first_own is not None
    if store.manifest(first_own).parent is not None:  # overlay: a child layer over step 4's
        assert store.manifest(first_own).parent == at_four
    # the fork's files: the parent's up to step 4, then its own writes only
    fork_files = _files(lab, state["workspace_layer"])
    assert state["workspace_layer"] == workspace_layer_at(fork_steps)
    for name in ("research", "insights"):
        assert fork_files[f"report/{name}.md"] == parent_files[f"report/{name}.md"]
    for name in ("risks", "recommendations", "summary"):
        own = state["sections"][name]
        assert own.startswith("[slow]") and own != parent_sections[name]
        assert fork_files[f"report/{name}.md"] == own.encode()
    assert set(fork_files) == set(parent_files)
    # a fork of the fork finds the layer among inherited steps and among its own
    for at, layer in ((4, at_four), (6, first_own)):
        again = await lab.lab.fork(ForkRequest(run=fork.handle.id, at_step=at, model="slow"))
        assert again.receipt.workspace_layer_sha256 == layer
        assert again.receipt.lineage == [parent_id, fork.handle.id]
        assert (await again.handle.result())["workspace_layer"] == state["workspace_layer"]
    # the parent's workspace and layers are as they were
    assert _files(lab, parent_end) == parent_files
    for digest in parent_layers:
        store.verify(digest, full=True)
    now = {p.name for p in store.root.iterdir() if not p.name.startswith(".")}
    assert set(parent_layers) <= now


async def test_a_tampered_layer_refuses_the_fork(ws_lab: AgentTestLab, tmp_path: Path) -> None:
    lab = ws_lab
    parent_id, _ = await _parent(lab)
    steps = await lab.lab.steps(parent_id)
    at_two, at_four = workspace_layer_at(steps[:2]), workspace_layer_at(steps[:4])
    assert at_two is not None and at_four is not None
    store = _layers(lab)
    victim = store.tree(at_four) / "report" / "insights.md"  # written at step 4
    with victim.open("ab") as fh:
        fh.write(b" tampered")
    with pytest.raises(ForkError, match=f"step 4.*{at_four}.*modified after sealing"):
        await lab.lab.fork(ForkRequest(run=parent_id, at_step=4, name=f"{parent_id}--tampered"))
    with pytest.raises(RPCError, match="not found"):
        await lab.client.get_workflow_handle(f"{parent_id}--tampered").describe()
    # the real command: exit 2, one line, no workflow; a fork before that step works and
    # its receipt names its own (intact) layer
    a = lab.agent
    env = {
        **os.environ,
        ENV["address"]: lab.client.service_client.config.target_host,
        ENV["home"]: str(a.home),
        "FORKLAB_MODEL_BASE_URL": a.model_base_url,
        "FORKLAB_EFFECTS_URL": a.effects_url,
        "FORKLAB_AGENT_TASK_QUEUE": a.agent_task_queue,
    }
    out = forklab(env, "fork", parent_id, "--at-step", "4")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "the workspace layer of that step is unusable" in out.stderr
    out = await asyncio.to_thread(forklab, env, "fork", parent_id, "--at-step", "2")
    assert out.returncode == 0, out.stderr
    receipt = json.loads(out.stdout.split("\n", 1)[1])
    assert receipt["workspace_layer_sha256"] == at_two
    # where the client cannot see the layers, the worker checks them before mounting:
    # the fork's first file step over the tampered layer fails, and so does the fork
    # (model `slow`: its writes differ from the parent's, so ``auto`` runs them live)
    # (the same operator on another host: the issuer key the worker trusts goes along)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "fork-issuer").mkdir(parents=True)
    shutil.copy2(issuer_key_path(a.home), issuer_key_path(elsewhere))
    remote = AgentLab(lab.client, a.model_copy(update={"home": elsewhere}))
    blind = await remote.fork(
        ForkRequest(run=parent_id, at_step=4, name=f"{parent_id}--blind", model="slow")
    )
    assert blind.receipt.workspace_layer_sha256 == at_four
    with pytest.raises(WorkflowFailureError) as failure:
        await blind.handle.result()
    cause = failure.value.cause.cause  # the activity's error
    assert (
        isinstance(cause, ApplicationError)
        and cause.type == ForkErrorType.workspace_layer_corrupted
    )
    assert "modified after sealing" in str(cause)
    kinds = [(s.activity_type, s.status.value) for s in await lab.lab.steps(blind.handle.id)]
    assert kinds[-1] == (WRITE, "failed") and len(kinds) == 6


async def test_the_write_tool_reuses_the_digest_and_refuses_bad_paths(tmp_path: Path) -> None:
    tools = WorkspaceTools(tmp_path / "ws", overlay=False)
    env = ActivityEnvironment()
    first: WorkspaceStep = await env.run(tools.write, WorkspaceWrite(path="a/b.txt", content="x"))
    assert first.changed
    same = await env.run(
        tools.write, WorkspaceWrite(layer=first.workspace_layer, path="a/b.txt", content="x")
    )
    assert not same.changed and same.workspace_layer == first.workspace_layer
    # content addressing: the same write from the same layer seals the same layer again
    again = await env.run(tools.write, WorkspaceWrite(path="a/b.txt", content="x"))
    assert again.workspace_layer == first.workspace_layer
    for bad in ("/etc/passwd", "../x", "a/../../x", "a//b"):
        with pytest.raises(Exception, match="workspace path"):
            await env.run(tools.write, WorkspaceWrite(path=bad, content="x"))
    assert Workspaces(tmp_path / "ws", overlay=False).ids() == []  # nothing left behind


@asynccontextmanager
async def _files_worker(
    temporal_env: WorkflowEnvironment, services: Services, home: Path
) -> AsyncIterator[AgentLab]:
    """A worker of the plain ``ForkFiles`` workflow with the real file tool (copy
    fallback: every layer stands alone, so which ones a gc keeps is exact)."""
    client = await Client.connect(
        temporal_env.client.service_client.config.target_host,
        data_converter=pydantic_data_converter,
    )
    agent = agent_settings(services, home)
    tools = WorkspaceTools(agent_workspaces_root(agent.home), overlay=False)
    async with Worker(
        client,
        task_queue=agent.agent_task_queue,
        workflows=[FilesWorkflow],
        activities=[echo, hold, tools.write],
        plugins=[ForkLabPlugin(agent.run_log_path)],
    ):
        yield AgentLab(client, agent)


def _cli_env(lab: AgentLab) -> dict[str, str]:
    a = lab.agent
    return {
        **os.environ,
        ENV["address"]: lab.client.service_client.config.target_host,
        ENV["home"]: str(a.home),
        "FORKLAB_MODEL_BASE_URL": a.model_base_url,
        "FORKLAB_EFFECTS_URL": a.effects_url,
        "FORKLAB_AGENT_TASK_QUEUE": a.agent_task_queue,
    }


async def test_a_fork_finds_a_layer_written_in_an_earlier_run_of_the_chain(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> None:
    """The parent writes at steps 1 and 2, continues as new (its input carries the layer),
    echoes at 3 and 4 and writes at 5. A fork at 3 or 4 — in the second run, before any
    file step of that run — starts from step 2's layer, read from that run's recorded
    input; the fork's own write at 5 lands over it and equals the parent's."""
    async with _files_worker(temporal_env, services, tmp_path / "home") as lab:
        client, agent = lab.client, lab.agent
        wid = f"files-{uuid.uuid4().hex[:8]}"
        parent = await client.start_workflow(
            FilesWorkflow.run,
            FilesInput(steps=5, write_at=[1, 2, 5], can_after=2),
            id=wid,
            task_queue=agent.agent_task_queue,
        )
        final = await parent.result()
        chain = await lab.chain(wid)
        assert len(chain) == 2 and [s.index for s in chain[1].steps] == [3, 4, 5]
        steps = await lab.steps(wid)
        at = {i: workspace_layer_at(steps[:i]) for i in range(1, 6)}
        assert at[1] is not None and at[2] not in (None, at[1]) and at[5] == final
        for step, want in ((1, at[1]), (2, at[2]), (3, at[2]), (4, at[2]), (5, final)):
            fork = await lab.fork(ForkRequest(run=wid, at_step=step))
            assert fork.receipt.workspace_layer_sha256 == want, step
            assert await fork.handle.result() == final
        store = LayerStore(agent_workspaces_root(agent.home))
        assert at[2] is not None
        assert {e.path for e in store.verify(at[2], full=True).entries} >= {"f1.txt", "f2.txt"}
        # the real command finds it too
        out = await asyncio.to_thread(forklab, _cli_env(lab), "fork", wid, "--at-step", "4")
        assert out.returncode == 0, out.stderr
        receipt = json.loads(out.stdout.split("\n", 1)[1])
        assert receipt["workspace_layer_sha256"] == at[2]
        await client.get_workflow_handle(receipt["fork_workflow_id"]).result()


async def test_layers_gc_keeps_every_layer_a_retained_history_names(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> None:
    """``forklab layers gc`` on agent-run layers: a run can be forked at any step while
    Temporal keeps its history, so every layer a retained history names stays — a closed
    run's, an open run's current one, an open fork's even when its write was served from
    its ended parent's record. Before, every layer of a finished run went, and a fork of
    it at a step with files failed although its history still named them. Only once a
    run's history is gone (deleted here; the namespace's retention in general) do its
    layers go, and a fork of it is refused with a sentence."""
    async with _files_worker(temporal_env, services, tmp_path / "home") as lab:
        queue = lab.agent.agent_task_queue
        store = LayerStore(agent_workspaces_root(lab.agent.home))

        async def run(tag: str, **fields: object) -> str:
            wid = f"files-{tag}-{uuid.uuid4().hex[:8]}"
            inp = FilesInput(tag=tag, **fields)  # type: ignore[arg-type]
            await lab.client.start_workflow(FilesWorkflow.run, inp, id=wid, task_queue=queue)
            return wid

        forked = await run("a", steps=2, write_at=[1, 2])
        a_final = await lab.client.get_workflow_handle(forked).result()
        a_steps = await lab.steps(forked)
        a_one = workspace_layer_at(a_steps[:1])
        fork = await lab.fork(ForkRequest(run=forked, at_step=1))
        assert fork.receipt.workspace_layer_sha256 == a_one
        assert await fork.handle.result() == a_final  # its write was the parent's: replayed
        closed = await run("c", steps=1, write_at=[1])
        c_final = await lab.client.get_workflow_handle(closed).result()

        async def reach(wid: str, n: int) -> list[Step]:
            for _ in range(300):
                if len(steps := await lab.steps(wid)) == n:
                    return steps
                await asyncio.sleep(0.1)
            raise AssertionError(f"{wid} did not reach step {n}")

        held = await run("b", steps=3, write_at=[1], hold_at=2)
        b_now = workspace_layer_at(await reach(held, 2))
        # a parent ended (terminated) while its fork is open: the fork's write at 2 was
        # served from the parent's record (no tool ran, no pin); it holds at 3
        ended = await run("p", steps=3, write_at=[1, 2], hold_at=3)
        p_steps = await reach(ended, 3)
        p_one, p_two = workspace_layer_at(p_steps[:1]), workspace_layer_at(p_steps[:2])
        await lab.client.get_workflow_handle(ended).terminate("test: parent ends")
        open_fork = await lab.fork(ForkRequest(run=ended, at_step=1))
        fork_steps = await reach(open_fork.handle.id, 3)
        assert fork_steps[1].origin == StepOrigin.replayed
        assert workspace_layer_at(fork_steps) == p_two
        layers = {a_one, a_final, c_final, b_now, p_one, p_two}
        assert None not in layers and len(layers) == 6
        assert layers <= {p.name for p in store.root.iterdir()}

        gc = ("layers", "gc", "--min-age", "0")
        out = forklab(_cli_env(lab), *gc)
        assert out.returncode == 0, out.stderr
        assert "agent runs: removed" in out.stdout and "kept 6 " in out.stdout, out.stdout
        left = {p.name for p in store.root.iterdir() if not p.name.startswith(".")}
        assert left == layers
        for digest in left:
            store.verify(digest, full=True)
        # a finished run forks at every step with files after the collection
        for step in (1, 2):
            again = await lab.fork(ForkRequest(run=forked, at_step=step))
            assert await again.handle.result() == a_final
        closed_fork = await lab.fork(ForkRequest(run=closed, at_step=1))
        assert await closed_fork.handle.result() == c_final

        await lab.client.get_workflow_handle(held).terminate("test over")
        await open_fork.handle.terminate("test over")
        out = forklab(_cli_env(lab), *gc)
        assert out.returncode == 0, out.stderr
        left = {p.name for p in store.root.iterdir() if not p.name.startswith(".")}
        assert left == layers  # terminated runs' histories are still retained

        # the history of `closed` and of its fork goes: then, and only then, c_final goes
        await asyncio.gather(
            *(_delete_history(lab.client, w) for w in (closed, closed_fork.handle.id))
        )
        out = forklab(_cli_env(lab), *gc)
        assert out.returncode == 0, out.stderr
        left = {p.name for p in store.root.iterdir() if not p.name.startswith(".")}
        assert left == layers - {c_final}
        refused = forklab(_cli_env(lab), "fork", closed, "--at-step", "1")
        assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr


async def _delete_history(client: Client, workflow_id: str) -> None:
    """Delete ``workflow_id``'s executions (what the namespace's retention does in time)
    and wait until Temporal no longer finds it (the dev server deletes in a background
    task: about 35 s here)."""
    from temporalio.api.common.v1 import WorkflowExecution
    from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest

    await client.workflow_service.delete_workflow_execution(
        DeleteWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=workflow_id),
        )
    )
    for _ in range(1200):
        try:
            await client.get_workflow_handle(workflow_id).describe()
        except RPCError:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{workflow_id} was not deleted")
