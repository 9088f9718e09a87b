"""Team forks on a real dev server (``forklab fork-team``): the example team recorded,
then forked as one operation at a consistent cut.

- forking the researcher at its conclusion with an override moves the writer and the
  reviewer back, forks all three, and the forks message each other (the findings signal
  and the review update reach the forks, never the originals): the team's verdict flips,
  the originals' histories are byte for byte the same;
- forking the writer at step 0 leaves the findings signal in flight: it is delivered to
  the writer's fork at its start (and kept in its receipt), the researcher is inherited;
- forking the writer at step 1 keeps the findings signal inside its prefix: the fork gets
  it again at the same point (``prefix_messages``), and with nothing changed ends as the
  original did;
- a frozen member never runs, and a send to it is blocked; so is a send to a workflow
  outside the named team;
- a team fork of a team fork addresses the second forks;
- a member fork that cannot be made aborts the team fork: every member fork started is
  terminated having run nothing;
- ``forklab fork-team``, then ``forklab diff`` and ``forklab trail`` of the team fork.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_fixtures import Services, agent_settings
from helpers import forklab_in_process as forklab
from temporalio.client import Client, WorkflowFailureError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from forklab.activities.runfork.fork_start import ForkStarter
from forklab.activities.runfork.history_events import fetched_page, started_page
from forklab.activities.runfork.history_reads import RunNotFound
from forklab.activities.runfork.overrides import make_override
from forklab.activities.runfork.team_fork_start import (
    TeamForkError,
    TeamForkRequest,
    TeamForkStarter,
)
from forklab.activities.stores.fork_registry import ForkRegistry
from forklab.activities.stores.team_registry import TeamRegistry
from forklab.agents.team import CONCLUSION_STEP, ReviewerInput, ReviewerWorkflow, TeamIds
from forklab.agents.team_start import start_team
from forklab.contracts.errors import ForkErrorType
from forklab.contracts.fork_request import ForkRequest
from forklab.contracts.runfork import FETCH_PREFIX, TEAM_RELEASE_SIGNAL
from forklab.contracts.team_fork import TeamForkRecord, TeamForkStatus
from forklab.experiments.runfork.team_cut import EdgeCrossing, EdgeTreatment, Point
from forklab.experiments.runfork.team_receipt import SlotRole, TeamReceipt
from forklab.temporal import ensure_search_attributes
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.agent_worker import connect_agents
from forklab.workers.runfork.team_worker import build_team_worker, team_task_queue

FULL = (
    "adopt durable execution for every agent workflow, because recorded histories make "
    "each run replayable, auditable and cheap to fork"
)


@dataclass
class TeamForkLab:
    client: Client
    agent: AgentSettings

    @property
    def teams(self) -> TeamRegistry:
        return TeamRegistry(self.agent.forks_path)

    async def record(self, researcher_model: str = "fast") -> TeamIds:
        """Record the example team to its end; its members' workflow ids."""
        handles = await start_team(
            self.client,
            f"team-{uuid.uuid4().hex[:8]}",
            "durable execution",
            team_task_queue(self.agent),
            researcher_model=researcher_model,
        )
        await handles.results()
        return handles.ids

    async def fork(self, req: TeamForkRequest) -> TeamForkRecord:
        started = await TeamForkStarter(self.client, self.teams).start(req)
        try:
            return await asyncio.wait_for(started.result(), timeout=60)
        except TimeoutError:
            history = await started.handle.fetch_history()
            raise AssertionError(f"team fork did not finish: {history.to_json()[-3000:]}") from None

    async def fork_the_conclusion(self, ids: TeamIds, **fields: Any) -> tuple[str, TeamForkRecord]:
        """Fork the team at the researcher's conclusion under a new name (``fields``: the
        rest of the request); the name and the record."""
        name = _fork_name()
        request = TeamForkRequest(
            member=ids.researcher, at_step=CONCLUSION_STEP, name=name, **fields
        )
        return name, await self.fork(request)

    async def history(self, workflow_id: str) -> bytes:
        history = await self.client.get_workflow_handle(workflow_id).fetch_history()
        return b"".join(e.SerializeToString(deterministic=True) for e in history.events)

    async def histories(self, workflow_ids: Iterable[str]) -> dict[str, bytes]:
        """Each workflow's history, byte for byte: what a message reaching it would change."""
        return {w: await self.history(w) for w in workflow_ids}

    async def result(self, workflow_id: str) -> Any:
        return await asyncio.wait_for(
            self.client.get_workflow_handle(workflow_id).result(), timeout=120
        )

    async def exists(self, workflow_id: str) -> bool:
        try:
            await self.client.get_workflow_handle(workflow_id).describe()
        except RPCError:
            return False
        return True


@pytest.fixture
async def lab(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> AsyncIterator[TeamForkLab]:
    agent = agent_settings(services, tmp_path / "home")
    target = temporal_env.client.service_client.config.target_host
    settings = Settings.load({"address": target, "home": tmp_path / "home"}, env={})
    client = await connect_agents(settings, agent)
    await ensure_search_attributes(client)
    async with build_team_worker(client, agent):
        yield TeamForkLab(client=client, agent=agent)


def _conclusion(text: str) -> Any:
    return {"content": text, "model": "override"}


def _members(ids: TeamIds) -> tuple[str, str, str]:
    return ids.researcher, ids.writer, ids.reviewer


def _fork_name() -> str:
    return f"tf-{uuid.uuid4().hex[:6]}"


def _writer_side_forked(ids: TeamIds) -> dict[str, SlotRole]:
    """The slots of a cut at the writer: the researcher, who sent before it, is inherited."""
    return {
        ids.researcher: SlotRole.inherited,
        ids.writer: SlotRole.forked,
        ids.reviewer: SlotRole.forked,
    }


def _findings(receipt: TeamReceipt) -> EdgeCrossing:
    return next(e for e in receipt.edges if e.message.name == "findings")


async def _assert_the_writers_send_is_blocked(
    lab: TeamForkLab, name: str, ids: TeamIds, reviewer_before: bytes
) -> None:
    """The writer's fork (of team fork ``name``) asks for a review that may reach no
    reviewer: its send is blocked, and the original reviewer got nothing."""
    with pytest.raises(WorkflowFailureError) as failed:
        await lab.result(f"{name}/{ids.writer}")
    assert ForkErrorType.team_send_blocked.value in _causes(failed.value)
    assert await lab.history(ids.reviewer) == reviewer_before


async def test_a_team_forked_at_the_conclusion_flips_the_verdict_and_leaves_the_originals(
    lab: TeamForkLab,
) -> None:
    ids = await lab.record("fast")
    before = await lab.histories(_members(ids))
    name, record = await lab.fork_the_conclusion(
        ids, result_override=make_override(CONCLUSION_STEP, _conclusion(FULL))
    )
    assert record.status is TeamForkStatus.forked
    receipt = record.receipt
    # the cut: the findings signal moves the writer back to step 0, the review update the
    # reviewer; every member is forked (nobody is frozen or whole and closed)
    assert {c.workflow_id: c.point for c in receipt.cut} == {
        ids.researcher: Point(step=3),
        ids.writer: Point(step=0),
        ids.reviewer: Point(step=0),
    }
    assert {s.role for s in receipt.slots} == {SlotRole.forked}
    assert receipt.addresses == {w: f"{name}/{w}" for w in before}
    assert all(s.receipt is not None for s in receipt.slots)
    assert {e.treatment for e in receipt.edges} == {EdgeTreatment.regenerated}
    # the forks messaged each other: the writer's fork wrote from the overridden
    # conclusion, the reviewer's fork approved it
    writer = await lab.result(receipt.addresses[ids.writer])
    reviewer = await lab.result(receipt.addresses[ids.reviewer])
    assert writer["conclusion"] == FULL
    assert reviewer["approved"] is True and writer["review"] == reviewer
    researcher = await lab.result(receipt.addresses[ids.researcher])
    assert researcher["conclusion"] == FULL
    # the originals: byte for byte the same histories (no message reached them)
    assert await lab.histories(before) == before
    assert lab.teams.get(name) == record
    # every member's fork receipt was recorded with the group receipt, as in its slot
    forks = ForkRegistry(lab.agent.forks_path)
    assert {s.fork_workflow_id: forks.receipt(s.fork_workflow_id) for s in receipt.slots} == {
        s.fork_workflow_id: s.receipt for s in receipt.slots
    }


async def test_a_member_fork_starts_from_the_run_the_cut_read_and_only_from_its_own(
    lab: TeamForkLab,
) -> None:
    ids = await lab.record("fast")
    runs = {w: (await lab.client.get_workflow_handle(w).describe()).run_id for w in _members(ids)}
    started = await TeamForkStarter(lab.client, lab.teams).start(
        TeamForkRequest(member=ids.researcher, at_step=CONCLUSION_STEP, name=_fork_name())
    )
    # the coordinator is handed each closed member's run: its forks start from it
    first = (await started.handle.fetch_history()).events[0]
    handed = first.workflow_execution_started_event_attributes.input.payloads[0].data
    assert {m["workflow_id"]: m["run_id"] for m in json.loads(handed)["members"]} == runs
    record = await asyncio.wait_for(started.result(), timeout=60)
    slots = record.receipt.slots
    assert {s.workflow_id: s.receipt.parent_run_id for s in slots if s.receipt} == runs
    # a run handed for a member is read under that member's id: another's is not found
    starter = ForkStarter(lab.client, ForkRegistry(lab.agent.forks_path), lab.agent.home)
    with pytest.raises(RunNotFound):
        await starter.fork(ForkRequest(run=ids.writer, at_step=0, run_id=runs[ids.researcher]))
    # a run that is not closed is located as any fork's parent is
    running = await lab.client.start_workflow(
        ReviewerWorkflow.run,
        ReviewerInput(topic="still running"),
        id=f"reviewer-{uuid.uuid4().hex[:6]}",
        task_queue=team_task_queue(lab.agent),
    )
    fork = await starter.fork(ForkRequest(run=running.id, at_step=0, run_id=running.result_run_id))
    assert fork.receipt.parent_run_id == running.result_run_id
    await fork.handle.terminate("test over")
    await running.terminate("test over")


async def test_a_signal_in_flight_at_the_cut_is_delivered_to_the_fork_at_its_start(
    lab: TeamForkLab,
) -> None:
    ids = await lab.record("slow")
    before = await lab.histories(_members(ids))
    record = await lab.fork(
        TeamForkRequest(member=ids.writer, at_step=0, name=_fork_name(), model="fast")
    )
    assert record.status is TeamForkStatus.forked
    receipt = record.receipt
    assert {s.workflow_id: s.role for s in receipt.slots} == _writer_side_forked(ids)
    assert _findings(receipt).treatment is EdgeTreatment.delivered_at_start
    writer_slot = receipt.slot(ids.writer)
    assert writer_slot.receipt is not None
    assert [s.name for s in writer_slot.receipt.signals] == ["findings"]
    writer = await lab.result(receipt.addresses[ids.writer])
    original = await lab.result(ids.writer)
    # the findings the researcher sent once, delivered again; the draft under `fast`
    assert writer["conclusion"] == original["conclusion"]
    assert writer["draft"] != original["draft"]
    assert ids.researcher not in receipt.addresses
    assert await lab.histories(before) == before


async def test_a_member_whose_prefix_received_a_signal_gets_it_again_at_the_same_point(
    lab: TeamForkLab,
) -> None:
    ids = await lab.record("fast")
    before = await lab.histories(_members(ids))
    # the writer received the findings, then drafted (step 1): its cut holds the signal
    record = await lab.fork(TeamForkRequest(member=ids.writer, at_step=1, name=_fork_name()))
    assert record.status is TeamForkStatus.forked
    receipt = record.receipt
    cut = {c.workflow_id: c.point for c in receipt.cut}
    assert (cut[ids.writer], cut[ids.reviewer]) == (Point(step=1), Point(step=0))
    assert {s.workflow_id: s.role for s in receipt.slots} == _writer_side_forked(ids)
    assert _findings(receipt).treatment is EdgeTreatment.in_prefix
    writer_slot = receipt.slot(ids.writer)
    assert writer_slot.receipt is not None and writer_slot.receipt.signals == []
    fork_id = receipt.addresses[ids.writer]
    # nothing changed: the fork ends as the original did (its draft, served from the
    # prefix, waited for the findings: handed over before step 1, as on the original)
    assert await lab.result(fork_id) == await lab.result(ids.writer)
    assert await lab.result(receipt.addresses[ids.reviewer]) == await lab.result(ids.reviewer)
    # the signal came with the prefix, placed after 0 inherited steps, not from a sender
    history = (await lab.client.get_workflow_handle(fork_id).fetch_history()).events
    prefix_calls = {
        e.event_id
        for e in history
        if e.activity_task_scheduled_event_attributes.activity_type.name == FETCH_PREFIX
    }
    # the page its start carries, which its fetch verified (a verdict in its history)
    pages = [
        fetched_page(
            e.activity_task_completed_event_attributes.result.payloads[0].data,
            started_page(history[0]),
        )
        for e in history
        if e.activity_task_completed_event_attributes.scheduled_event_id in prefix_calls
    ]
    messages = [(m.name, m.position) for page in pages if page for m in page.messages]
    assert messages == [("findings", 0)]
    signalled = [
        e.workflow_execution_signaled_event_attributes.signal_name
        for e in history
        if e.HasField("workflow_execution_signaled_event_attributes")
    ]
    assert signalled == [TEAM_RELEASE_SIGNAL]
    assert await lab.histories(before) == before


async def test_a_frozen_member_never_runs_and_a_send_to_it_is_blocked(lab: TeamForkLab) -> None:
    ids = await lab.record("fast")
    before = await lab.history(ids.reviewer)
    name, record = await lab.fork_the_conclusion(ids, freeze=(ids.reviewer,))
    assert record.status is TeamForkStatus.forked
    assert record.receipt.slot(ids.reviewer).role is SlotRole.frozen
    assert not await lab.exists(f"{name}/{ids.reviewer}")
    # the reviewer has no fork: the writer's fork's review update never reaches the original
    await _assert_the_writers_send_is_blocked(lab, name, ids, before)


async def test_a_send_outside_the_named_team_is_blocked(lab: TeamForkLab) -> None:
    ids = await lab.record("fast")
    before = await lab.history(ids.reviewer)
    name, record = await lab.fork_the_conclusion(ids, members=[ids.writer])
    outside = [e for e in record.receipt.edges if e.message.receiver is None]
    assert [e.treatment for e in outside] == [EdgeTreatment.outside_blocked]
    await _assert_the_writers_send_is_blocked(lab, name, ids, before)


async def test_a_team_fork_of_a_team_fork_addresses_the_second_forks(lab: TeamForkLab) -> None:
    ids = await lab.record("fast")
    first = _fork_name()
    one = await lab.fork(TeamForkRequest(member=ids.researcher, at_step=2, name=first))
    assert one.status is TeamForkStatus.forked
    for fork_id in one.receipt.addresses.values():
        await lab.result(fork_id)
    forks = {w: one.receipt.addresses[w] for w in _members(ids)}
    before = await lab.histories([*forks.values(), *forks])
    second = _fork_name()
    two = await lab.fork(
        TeamForkRequest(
            member=forks[ids.researcher],
            at_step=CONCLUSION_STEP,
            name=second,
            result_override=make_override(CONCLUSION_STEP, _conclusion(FULL)),
        )
    )
    assert two.status is TeamForkStatus.forked
    # the second team is read from the first forks' histories: their messages connect them
    assert set(two.receipt.addresses) == set(forks.values())
    researcher2 = two.receipt.addresses[forks[ids.researcher]]
    assert researcher2 == f"{second}/{forks[ids.researcher]}"
    slot = two.receipt.slot(forks[ids.researcher])
    assert slot.receipt is not None and slot.receipt.lineage == [
        ids.researcher,
        forks[ids.researcher],
    ]
    reviewer2 = await lab.result(two.receipt.addresses[forks[ids.reviewer]])
    writer2 = await lab.result(two.receipt.addresses[forks[ids.writer]])
    assert writer2["conclusion"] == FULL and reviewer2["approved"] is True
    # neither the first forks nor the originals got a message
    assert await lab.histories(before) == before


async def test_a_member_that_cannot_be_forked_aborts_the_whole_team(lab: TeamForkLab) -> None:
    ids = await lab.record("fast")
    name = _fork_name()
    # someone else's workflow already holds the reviewer's fork id
    squatter = await lab.client.start_workflow(
        ReviewerWorkflow.run,
        ReviewerInput(topic="squat"),
        id=f"{name}/{ids.reviewer}",
        task_queue=team_task_queue(lab.agent),
    )
    record = await lab.fork(
        TeamForkRequest(member=ids.researcher, at_step=CONCLUSION_STEP, name=name)
    )
    assert record.status is TeamForkStatus.aborted
    assert record.reason is not None and ids.reviewer in record.reason
    # the researcher's and writer's forks were started held and terminated: they ran
    # nothing (no activity of their own in their histories); the squatter is untouched
    assert sorted(record.terminated) == sorted(f"{name}/{w}" for w in (ids.researcher, ids.writer))
    for fork_id in record.terminated:
        history = await lab.client.get_workflow_handle(fork_id).fetch_history()
        assert not any(
            e.HasField("activity_task_scheduled_event_attributes") for e in history.events
        )
    assert (await squatter.describe()).status is not None
    assert lab.teams.get(name) == record
    with pytest.raises(TeamForkError, match="is taken"):
        await TeamForkStarter(lab.client, lab.teams).start(
            TeamForkRequest(member=ids.researcher, at_step=CONCLUSION_STEP, name=name)
        )
    await squatter.terminate("test over")


def _causes(exc: BaseException) -> str:
    out = []
    cur: BaseException | None = exc
    while cur is not None:
        out.append(f"{getattr(cur, 'type', '')} {cur}")
        cur = cur.__cause__
    return " | ".join(out)


async def test_forklab_fork_team_then_trail_and_diff_the_team(lab: TeamForkLab) -> None:
    ids = await lab.record("fast")
    env = {
        **os.environ,
        "FORKLAB_ADDRESS": lab.client.service_client.config.target_host,
        "FORKLAB_HOME": str(lab.agent.home),
    }
    name = _fork_name()
    value = json.dumps(_conclusion(FULL))
    done = await asyncio.to_thread(
        forklab, env, "fork-team", ids.researcher, "--override-result", f"3={value}", "--name", name
    )
    assert done.returncode == 0, done.stderr
    assert f"team fork {name}: forked, every member released" in done.stdout
    assert f"{ids.writer:<34} at step 0 of 2   moved back by signal:findings:" in done.stdout
    for w in _members(ids):
        await lab.result(f"{name}/{w}")
    diff = await asyncio.to_thread(forklab, env, "diff", name)
    assert diff.returncode == 0, diff.stderr
    assert f"{ids.researcher:<34} diverged from step 3, entered through override result" in (
        diff.stdout
    )
    assert f"{ids.writer:<34} diverged from step 1, entered through signal:findings:" in diff.stdout
    trail = await asyncio.to_thread(forklab, env, "trail", name, "--json")
    assert json.loads(trail.stdout)["status"] == "forked"
    # bad requests: one sentence, exit 2, nothing started
    for argv, says in (
        (("--at-step", "9"), "the step to cut it at must be 0..3"),
        (("--at-step", "3", "--freeze", ids.researcher), "cannot also be frozen"),
        (("--at-step", "3", "--name", name), f"team fork name {name!r} is taken"),
        ((), "give --at-step N"),
    ):
        bad = await asyncio.to_thread(forklab, env, "fork-team", ids.researcher, *argv)
        assert bad.returncode == 2 and says in bad.stderr, (argv, bad.stderr)
