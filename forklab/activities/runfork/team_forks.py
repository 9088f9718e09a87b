"""The activities of a team fork's coordinator: fork the members (start every member's
fork held, record the group receipt, release every member), or terminate every member fork
the team fork started.

Forking the members is one activity, which the coordinator runs as a local activity, so
that a team fork costs its start, one workflow task and this activity's own work: each
activity dispatch, workflow task and signal from a workflow is a round trip through the
server, and they were most of a small team fork's time. For the same reason the members'
fork receipts are not written one by one as each fork starts but in the group receipt's
write, one transaction: concurrent SQLite writers queue for the file's lock.

It is idempotent: each member's fork has a deterministic id (``<team fork>/<member id>``),
so an attempt retried after its worker died finds the forks the dead attempt started
(their receipts recorded with the group receipt, or only their workflows started:
``record_started`` takes the receipt from the fork's own first event when its marker was
signed here for that id) and starts only the rest. A fork that cannot be made (its
boundary, an id taken by another workflow) fails the activity non-retryably before anything
is recorded or released, and the coordinator aborts. Once every fork exists, the group
receipt and the members' receipts are recorded (the same records again on a retry change
nothing), then every member released with the team fork's token
(``fork_keys.team_release_token``: each member's signed marker names its digest, so it
takes no one else's release); a retry releases them again, which a held member takes as
its release and a released one ignores (one that already closed is not found, and
is left so).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from forklab.activities.runfork.fork_keys import issuer_key, team_release_token
from forklab.activities.runfork.fork_start import ForkError, ForkExists, ForkStarter
from forklab.activities.runfork.history_reads import RunNotFound
from forklab.activities.stores.fork_registry import ForkRegistry
from forklab.activities.stores.team_registry import TeamRecordConflict, TeamRegistry
from forklab.contracts.runfork import MARKER_MEMO_KEY, TEAM_RELEASE_SIGNAL, release_digest
from forklab.contracts.team_fork import (
    ABORT_MEMBERS,
    FORK_MEMBERS,
    AbortMembers,
    MemberFork,
    TeamForkInput,
    TeamForkRecord,
    TeamForkStatus,
)
from forklab.experiments.runfork.receipt import ForkReceipt
from forklab.experiments.runfork.team_receipt import with_member_receipts

#: The error type of a team fork whose member cannot be forked (the coordinator aborts).
TEAM_FORK_REFUSED = "team_fork_refused"


class TeamForkActivities:
    """Bound to one namespace's client and the home whose issuer key signs the forks and
    whose registry keeps their receipts (the same home ``forklab fork`` uses)."""

    def __init__(self, client: Client, home: Path) -> None:
        self._client = client
        self._home = home
        self._registry = ForkRegistry(home / "forks.sqlite")
        self._teams = TeamRegistry(home / "forks.sqlite")
        #: the member forks' starter: its cache of closed runs serves every team fork of this worker
        self.starter = ForkStarter(client, self._registry, home)

    @activity.defn(name=FORK_MEMBERS)
    async def fork_members(self, inp: TeamForkInput) -> TeamForkRecord:
        """Every member's fork started held (or found, on a retry), in parallel; then the
        group receipt recorded and every member released."""
        requested_by = inp.plan.requested_by
        token = team_release_token(issuer_key(self._home), inp.plan.team_fork_id)
        started = await asyncio.gather(
            *(self._start(m, requested_by, release_digest(token)) for m in inp.members),
            return_exceptions=True,
        )
        receipts: dict[str, ForkReceipt] = {}
        refused: list[str] = []
        for member, outcome in zip(inp.members, started, strict=True):
            if isinstance(outcome, ForkReceipt):
                receipts[member.workflow_id] = outcome
            elif isinstance(outcome, (ForkError, RunNotFound)):
                refused.append(f"{member.workflow_id}: {outcome}")
            else:
                raise outcome  # transient (the server, the registry): the attempt retries
        if refused:
            raise ApplicationError(
                "team fork refused: " + "; ".join(refused),
                type=TEAM_FORK_REFUSED,
                non_retryable=True,
            )
        record = TeamForkRecord(
            status=TeamForkStatus.forked, receipt=with_member_receipts(inp.plan, receipts)
        )
        await asyncio.to_thread(self._record, record, list(receipts.values()))
        await asyncio.gather(
            *(self._release(f, token) for f in sorted(inp.plan.addresses.values()))
        )
        return record

    async def _release(self, fork_id: str, token: str) -> None:
        try:
            await self._client.get_workflow_handle(fork_id).signal(TEAM_RELEASE_SIGNAL, token)
        except RPCError as exc:
            if exc.status is not RPCStatusCode.NOT_FOUND:  # closed: released by an earlier try
                raise

    async def _start(self, m: MemberFork, requested_by: str, release: str) -> ForkReceipt:
        """The member's fork started held, taking a release only with the token whose
        digest is ``release``, its receipt not yet recorded (that is the group receipt's
        write); or, on a retry, the fork an earlier attempt started."""
        fork_id = m.fork_workflow_id
        team = m.team.model_copy(update={"release_sha256": release})
        try:
            fork = await self.starter.fork(
                m.fork_request(requested_by).model_copy(update={"record": False, "team": team})
            )
            known: ForkReceipt | None = fork.receipt
        except ForkExists:
            # recorded by an earlier attempt, or started by one that died before recording
            # its receipt: taken only when its marker was signed here for this id
            known = await asyncio.to_thread(self._registry.receipt, fork_id)
            if known is None:
                await self.starter.record_started(fork_id)
                known = await asyncio.to_thread(self._registry.receipt, fork_id)
        if known is None or known.parent_workflow_id != m.workflow_id:
            raise ForkError(f"fork name {fork_id!r} is another fork's; choose another team name")
        if not activity.info().is_local:  # a local activity's liveness is its workflow task's
            activity.heartbeat(fork_id)
        return known

    @activity.defn(name=ABORT_MEMBERS)
    async def abort_members(self, inp: AbortMembers) -> TeamForkRecord:
        """Terminates every member fork this team fork started (a workflow under a member
        fork's id whose marker names another team fork, or none, is someone else's and
        left alone), then records the team fork as aborted."""
        team_fork = inp.plan.team_fork_id
        terminated: list[str] = []
        for fork_id in sorted(inp.plan.addresses.values()):
            activity.heartbeat(fork_id)
            handle = self._client.get_workflow_handle(fork_id)
            try:
                desc = await handle.describe()
            except RPCError as exc:
                if exc.status is RPCStatusCode.NOT_FOUND:
                    continue
                raise
            memo = await desc.memo()
            marker = memo.get(MARKER_MEMO_KEY)
            team = marker.get("team") if isinstance(marker, dict) else None
            if not isinstance(team, dict) or team.get("team_fork_id") != team_fork:
                continue
            try:
                await handle.terminate(f"team fork {team_fork} aborted: {inp.reason[:300]}")
            except RPCError as exc:
                if exc.status is not RPCStatusCode.NOT_FOUND:
                    raise
            terminated.append(fork_id)
        record = TeamForkRecord(
            status=TeamForkStatus.aborted,
            receipt=inp.plan,
            reason=inp.reason,
            terminated=terminated,
        )
        self._record(record)
        return record

    def _record(self, record: TeamForkRecord, receipts: list[ForkReceipt] | None = None) -> None:
        try:
            self._teams.add(record, receipts or [])
        except TeamRecordConflict as exc:
            raise ApplicationError(str(exc), type=TEAM_FORK_REFUSED, non_retryable=True) from None
