"""What a member of a team fork does differently (``forklab fork-team``): it waits to be
released, and its messages are addressed to the team's forks, never to the originals.

- **Held.** A member fork starts held: before anything runs (no activity, no handler of
  the workflow's own), it waits for the coordinator's ``forklab.team_release`` signal,
  sent once every member's fork exists, and takes it only with the team fork's token
  (``TeamPart.release_sha256``): anyone may signal, only the coordinator knows the
  token. A member the coordinator never releases (the team fork was aborted, or its
  coordinator is gone) fails after :data:`HOLD_TIMEOUT` having run nothing. So a team
  fork runs either whole or not at all.
- **Addressed.** A signal the member sends (``signal_external_workflow``), a child it
  starts and, through the ``forklab-team`` activity header, an update its activities
  send (``team.send_update``), go to the fork that stands for the target in this fork
  world (``TeamPart.address``); a send to any other workflow is blocked
  (``fork_team_send_blocked``), as a blocked tool call fails.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from forklab.contracts.errors import ForkErrorType
from forklab.workflows.runfork.fork_memo import memo_value

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from forklab.contracts.runfork import (
        MARKER_MEMO_KEY,
        TEAM_RELEASE_SIGNAL,
        TeamPart,
        release_digest,
    )

#: How long a member fork waits for its team fork's release before it gives up.
HOLD_TIMEOUT = timedelta(minutes=10)


def held_team() -> TeamPart | None:
    """The team part of the run's marker when the run is a member fork still to be
    released (its first run; a later run or a child is never held). Read at the start of
    the run, before the marker is verified: a memo that does not parse holds nothing
    here and fails the run where the marker is checked."""
    try:  # the marker alone (fork_memo: no other memo value is decoded)
        raw = memo_value(MARKER_MEMO_KEY)
    except ApplicationError:
        return None
    if not isinstance(raw, dict) or raw.get("continued") or raw.get("child_of"):
        return None
    try:
        team = TeamPart.model_validate(raw.get("team"))
    except ValidationError:
        return None
    return team if team.held else None


class Hold:
    """The member's hold: released by the coordinator's signal."""

    def __init__(self, team: TeamPart | None) -> None:
        self.team = team
        self.released = team is None
        if team is not None:
            workflow.set_signal_handler(TEAM_RELEASE_SIGNAL, self._release)

    def _release(self, *args: Any) -> None:
        """Taken with the token whose digest the marker names, and only then: a release
        from anyone but the coordinator is ignored (a member whose marker names none, from
        before releases carried one, takes any)."""
        expected = self.team.release_sha256 if self.team is not None else None
        token = args[0] if len(args) == 1 else None
        if expected is None or (isinstance(token, str) and release_digest(token) == expected):
            self.released = True

    async def wait(self) -> None:
        """Until released; a member never released fails, having run nothing."""
        if self.released or self.team is None:
            return
        try:
            await workflow.wait_condition(lambda: self.released, timeout=HOLD_TIMEOUT)
        except TimeoutError:
            raise ApplicationError(
                f"team fork {self.team.team_fork_id[:100]!r} never released this member "
                f"within {HOLD_TIMEOUT}: it was aborted or its coordinator is gone; "
                "this member ran nothing",
                type=ForkErrorType.team_not_released,
                non_retryable=True,
            ) from None


def addressed(team: TeamPart, target: str, what: str, own: set[str]) -> str:
    """Where ``what`` (a signal) to ``target`` goes in this fork world: the fork standing
    for it, a workflow this run started itself (``own``), or nowhere: blocked."""
    if target in own:
        return target
    return _to(team, target, what)


def child_id(team: TeamPart, target: str) -> str:
    """The id a child the member starts gets: the fork standing for it when it is a member
    of the team; a new id the member's code chose stays (the child is new in this fork
    world); the id of a member without a fork is blocked (a child started there would be
    a new run under an original's id)."""
    if target in team.all_addresses or target in team.without_fork:
        return _to(team, target, "a child workflow")
    return target


def _to(team: TeamPart, target: str, what: str) -> str:
    to = team.address(target)
    if to is None:
        raise ApplicationError(
            f"{what} to {target[:100]!r} is blocked: it is not a member of team fork "
            f"{team.team_fork_id[:100]!r} with a fork (a send there would reach an "
            "original, or a workflow outside the fork world)",
            type=ForkErrorType.team_send_blocked,
            non_retryable=True,
        )
    return to
