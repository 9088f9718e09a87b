"""The group receipt of a team fork: what was asked (member, step, overrides, policies),
the consistent cut it resolved to, how every message across the cut is treated, which
member becomes which fork, and a slot per member for that fork's own receipt.

Like a fork receipt it is written once and never changed: :func:`plan_team_fork` makes it
with empty slots before anything starts, :func:`with_member_receipts` returns the final
copy with every forked member's receipt in its slot.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.receipt import ForkReceipt
from forklab.experiments.runfork.team_cut import EdgeCrossing, MemberCut, TeamCut

TEAM_RECEIPT_SCHEMA_VERSION = 1
_FORK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$")


class SlotRole(StrEnum):
    #: forked at its point, continues live
    forked = "forked"
    #: kept as it was at its point, never continued (sends to it are not delivered)
    frozen = "frozen"
    #: closed, and the cut keeps its whole run: nothing to continue; its result stands
    inherited = "inherited"
    #: a child its parent's fork has not started yet: the parent's fork starts it live
    absent = "absent"


class OverrideKind(StrEnum):
    #: the member's fork sees ``value`` as step ``step``'s result
    result = "result"
    #: the member's step ``step`` runs live with ``value`` as its input
    input = "input"
    #: signal ``name`` with ``value`` is delivered to the member's fork at its start
    signal = "signal"


class TeamOverride(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    member: str
    kind: OverrideKind
    step: int | None = Field(default=None, ge=1)
    name: str | None = None
    value: Any = None

    @model_validator(mode="after")
    def _addressed(self) -> TeamOverride:
        if self.kind is OverrideKind.signal and not self.name:
            raise ValueError(f"the signal override for {self.member!r} needs a signal name")
        if self.kind is not OverrideKind.signal and self.step is None:
            raise ValueError(f"the {self.kind.value} override for {self.member!r} needs a step")
        return self


class MemberSlot(BaseModel):
    """One member of the team fork: its role, its fork's workflow id and, once the fork
    has started, that fork's own receipt."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workflow_id: str
    role: SlotRole
    fork_workflow_id: str | None = None
    receipt: ForkReceipt | None = None


class TeamReceipt(BaseModel):
    """What a team fork asked for and what it resolved to. Written once, never changed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = TEAM_RECEIPT_SCHEMA_VERSION
    team_fork_id: str
    name: str
    requested_member: str
    requested_step: int = Field(ge=0)
    cut: list[MemberCut]
    edges: list[EdgeCrossing]
    slots: list[MemberSlot]
    #: original workflow id -> its fork's: where a fork's message to a member goes. A
    #: member without a fork (frozen, inherited, absent) has no address: sends to it
    #: are not delivered, never to the original.
    addresses: dict[str, str]
    tool_policies: dict[str, ToolPolicy]
    overrides: list[TeamOverride] = Field(default_factory=list)
    intervention: dict[str, Any] | None = None
    model: str | None = None
    requested_by: str
    created_at: AwareDatetime

    def slot(self, workflow_id: str) -> MemberSlot:
        for s in self.slots:
            if s.workflow_id == workflow_id:
                return s
        raise KeyError(workflow_id)

    @property
    def crossing(self) -> list[EdgeCrossing]:
        """The messages sent before the cut and received after it."""
        return [e for e in self.edges if e.crosses]


def member_fork_id(team_fork_id: str, workflow_id: str) -> str:
    """The workflow id of a member's fork: the team fork's id, then the member's."""
    return f"{team_fork_id}/{workflow_id}"


def slot_role(cut: MemberCut) -> SlotRole:
    """What a team fork does with a member cut so: fork it, keep it, or leave it out."""
    if cut.absent:
        return SlotRole.absent
    if cut.frozen:
        return SlotRole.frozen
    if cut.whole and cut.closed:
        return SlotRole.inherited
    return SlotRole.forked


def plan_team_fork(
    cut: TeamCut,
    *,
    team_fork_id: str,
    tool_policies: dict[str, ToolPolicy],
    requested_by: str,
    created_at: datetime,
    name: str | None = None,
    overrides: list[TeamOverride] | None = None,
    intervention: dict[str, Any] | None = None,
    model: str | None = None,
) -> TeamReceipt:
    """The receipt of a team fork before any member's fork starts (empty slots).

    An override must address a member that is forked (a frozen, inherited or absent
    member does not run in the fork world)."""
    if not _FORK_ID.match(team_fork_id) or len(team_fork_id) > 120:
        raise ValueError(
            f"team fork name {team_fork_id!r}: use 1-120 letters, digits and . _ : / - "
            "(starting with a letter or digit)"
        )
    slots: list[MemberSlot] = []
    addresses: dict[str, str] = {}
    for m in cut.members:
        role = slot_role(m)
        fork_id = member_fork_id(team_fork_id, m.workflow_id) if role is SlotRole.forked else None
        if fork_id is not None:
            addresses[m.workflow_id] = fork_id
        slots.append(MemberSlot(workflow_id=m.workflow_id, role=role, fork_workflow_id=fork_id))
    for o in overrides or []:
        if o.member not in addresses:
            raise ValueError(
                f"the {o.kind.value} override names {o.member!r}, which this team fork does "
                "not continue (not a member, or frozen, inherited or absent)"
            )
    return TeamReceipt(
        team_fork_id=team_fork_id,
        name=name or team_fork_id,
        requested_member=cut.requested_member,
        requested_step=cut.requested_step,
        cut=cut.members,
        edges=cut.edges,
        slots=slots,
        addresses=addresses,
        tool_policies=tool_policies,
        overrides=list(overrides or []),
        intervention=intervention,
        model=model,
        requested_by=requested_by,
        created_at=created_at,
    )


def with_member_receipts(team: TeamReceipt, receipts: dict[str, ForkReceipt]) -> TeamReceipt:
    """The final receipt: every forked member's slot holds its fork's receipt (one for
    each, and for no other member)."""
    forked = {s.workflow_id for s in team.slots if s.role is SlotRole.forked}
    if set(receipts) != forked:
        missing = sorted(forked - set(receipts))
        extra = sorted(set(receipts) - forked)
        raise ValueError(f"member receipts do not match the forked members ({missing=}, {extra=})")
    for workflow_id, r in receipts.items():
        if r.fork_workflow_id != team.addresses[workflow_id]:
            raise ValueError(
                f"the receipt for {workflow_id!r} is for {r.fork_workflow_id!r}, "
                f"not its fork {team.addresses[workflow_id]!r}"
            )
    slots = [
        s.model_copy(update={"receipt": receipts[s.workflow_id]})
        if s.workflow_id in receipts
        else s
        for s in team.slots
    ]
    return team.model_copy(update={"slots": slots})
