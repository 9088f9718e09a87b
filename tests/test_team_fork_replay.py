"""A team fork's coordinator recorded before the members were forked in a local activity
(``tests/golden/team_fork_remote_activity.json``: a relay team of 3 forked by the
coordinator of commit 9d8c546, whose history holds a remote ``forklab.team_fork_members``
activity) replays, offline, on the coordinator as it is now: a team fork in flight when
its worker is upgraded goes on as it began (``workflow.patched``). That the replay can
fail is shown on the same history: with the local activity unguarded it is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from forklab.workflows.runfork import team_fork
from forklab.workflows.runfork.team_fork import TeamForkWorkflow

GOLDEN = Path(__file__).resolve().parent / "golden" / "team_fork_remote_activity.json"


def recorded() -> WorkflowHistory:
    return WorkflowHistory.from_json("team-fork-remote-activity", GOLDEN.read_text("utf-8"))


def replayer() -> Replayer:
    return Replayer(workflows=[TeamForkWorkflow], data_converter=pydantic_data_converter)


async def test_a_coordinator_recorded_with_a_remote_activity_replays() -> None:
    result = await replayer().replay_workflow(recorded(), raise_on_replay_failure=False)
    assert result.replay_failure is None


async def test_without_the_patch_guard_that_history_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workflow, "patched", lambda _id: True)
    assert team_fork.workflow.patched is workflow.patched
    result = await replayer().replay_workflow(recorded(), raise_on_replay_failure=False)
    assert "Nondeterminism" in str(result.replay_failure)
