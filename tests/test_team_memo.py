"""A team fork's part of every member's marker (``TeamPart``) travels in the member's
memo, which Temporal wants under 2 KiB (it warns on every start past it): the team's
members are named once each, their forks' ids following from the team fork's id."""

from __future__ import annotations

from datetime import UTC, datetime

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from forklab.activities.runfork.fork_start import composed_team
from forklab.activities.runfork.team_fork_start import team_part
from forklab.contracts.fork_signature import sign_marker
from forklab.contracts.runfork import ForkMarker, TeamPart, release_digest
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.prefix_messages import MessageKind
from forklab.experiments.runfork.receipt import BoundaryMode
from forklab.experiments.runfork.team_cut import Member, Message, Position, Team, consistent_cut
from forklab.experiments.runfork.team_receipt import plan_team_fork


def _relay(size: int) -> Team:
    """Member i signals member i + 1 after its one step; ids as long as a service's."""
    ids = [f"order-fulfilment-relay-{i:02d}-0f3c9a" for i in range(size)]
    return Team(
        members=[Member(workflow_id=w, run_id=f"run-{w}", steps=1, closed=True) for w in ids],
        messages=[
            Message(
                id=f"go-{i}",
                kind=MessageKind.signal,
                name="go",
                sender=ids[i],
                receiver=ids[i + 1],
                sent_at=Position(after_step=1),
                received_at=Position(after_step=0),
            )
            for i in range(size - 1)
        ],
    )


def test_a_member_of_a_30_member_team_carries_a_marker_under_the_memo_warning() -> None:
    """Every member fork's marker holds the team's addresses, and the marker is the memo,
    which Temporal wants under 2 KiB: the team's members are named once each (their forks'
    ids follow), and every address still resolves as the plan says."""
    team = _relay(30)
    first = team.members[0].workflow_id
    cut = consistent_cut(team, first, 0)
    plan = plan_team_fork(
        cut,
        team_fork_id="checkout-incident-4711--team-9f2c1e0a",
        tool_policies={"*": ToolPolicy.auto, "forklab.team_update": ToolPolicy.live},
        requested_by="oncall-engineer",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    # as the coordinator starts each member: with the digest of the team fork's release token
    part = team_part(plan, cut).model_copy(update={"release_sha256": release_digest("t" * 64)})
    assert len(plan.addresses) == 30
    assert {o: part.address(o) for o in plan.addresses} == plan.addresses
    assert all(part.address(f) == f for f in plan.addresses.values())
    assert part.address("someone-else") is None
    key = Ed25519PrivateKey.generate()
    marker = sign_marker(
        ForkMarker(
            parent_workflow_id=first,
            source_run_id="0194b0a4-5c2e-7d3f-9a51-6c2b8e4f1d70",
            base_step=0,
            at_step=0,
            boundary=BoundaryMode.exact,
            lineage_root=f"{first}@0194b0a4-5c2e-7d3f-9a51-6c2b8e4f1d70",
            tool_policies=plan.tool_policies,
            team=part,
            fork_workflow_id=plan.addresses[first],
            start_input_sha256="0" * 64,
            issued_at=datetime(2026, 1, 1, tzinfo=UTC),
            parent_build="forklab-agents.9c1d2e3f4a5b",
        ),
        key,
    )
    memo = marker.model_dump_json(exclude_defaults=True, exclude={"prefix_page_sha256"})
    assert len(memo.encode()) < 2048, len(memo.encode())
    # written out in full, the same addresses would not fit
    full = part.model_copy(update={"forked": [], "addresses": plan.addresses})
    wide = marker.model_copy(update={"team": full})
    wide_memo = wide.model_dump_json(exclude_defaults=True, exclude={"prefix_page_sha256"})
    assert len(wide_memo.encode()) > 2048


def test_a_team_fork_of_a_team_fork_still_addresses_the_first_teams_originals() -> None:
    """A member of a team fork of a team fork: its own team's members named once, the
    first team's originals addressed to the new forks, and an original whose fork is not
    in the new team without a fork."""
    inherited = TeamPart(team_fork_id="tf1", forked=["writer", "reviewer"])
    team = TeamPart(team_fork_id="tf2", forked=["tf1/writer"])
    composed = composed_team(team, inherited)
    assert composed is not None
    assert composed.address("writer") == "tf2/tf1/writer"
    assert composed.address("tf1/writer") == "tf2/tf1/writer"
    assert composed.address("reviewer") is None and "reviewer" in composed.without_fork
