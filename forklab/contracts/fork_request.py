"""What a fork of a recorded run asks for: one typed request that ``forklab fork``
(``AgentLab.fork``), a team fork's members (``MemberFork.fork_request``) and an experiment
over a cohort each build once and hand to ``ForkStarter.fork``, instead of spelling out
its arguments again. What the fork changes (``ForkOptions``) is one model that a team
fork's request (``TeamForkRequest``) and its members' (``MemberFork``) hold as well."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from forklab.contracts.runfork import CohortFork, TeamPart
from forklab.experiments.runfork.overrides import ForkSignal, ResultOverride
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.receipt import BoundaryMode


class ForkOptions(BaseModel):
    """What a fork changes after its point and how it is tagged, whatever run and step it
    forks: a single fork (``ForkRequest``), a team fork (``TeamForkRequest``: every
    member's fork; the overrides and signals the requested member's) and a team fork's
    member (``MemberFork``) hold these fields, so one is built from another with
    ``options()`` instead of naming each of them again."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: carried in the marker: the workflow's code reads it after the boundary
    #: (``interceptor.current_fork()``)
    intervention: dict[str, Any] | None = None
    #: the model the fork's calls after ``at_step`` use (None: the workflow's own choice)
    model: str | None = None
    #: per tool (``*``: every other, ``auto`` when not given): what the fork's calls do
    tool_policies: dict[str, ToolPolicy] = Field(default_factory=dict)
    #: how the boundary at ``at_step`` is resolved in the parent's history
    boundary: BoundaryMode = BoundaryMode.exact
    #: served to the fork as step ``at_step``'s result (``make_override``)
    result_override: ResultOverride | None = None
    #: (step, JSON): that step, ``at_step + 1``, runs live with the JSON as its input
    input_override: tuple[int, Any] | None = None
    #: reach the workflow's handlers at the fork point
    signals: list[ForkSignal] = Field(default_factory=list)
    #: marks the fork of an experiment over a cohort (seeds, prompt patch, faults)
    cohort: CohortFork | None = None
    #: the experiment run whose cleanup finds the fork: its ``ForkLabExperiment`` search
    #: attribute, added to the fork's own (None: only its own)
    experiment_tag: str | None = None

    def options(self, **update: Any) -> dict[str, Any]:
        """These options, ``update`` replacing some, as the keyword arguments of another
        request of the same fork (``ForkRequest(run=..., at_step=..., **m.options())``);
        the fields of a request that holds more are left out."""
        return {name: getattr(self, name) for name in ForkOptions.model_fields} | update


class ForkRequest(ForkOptions):
    """A fork of ``run`` that inherits steps 1..``at_step`` and continues live, changed as
    its ``ForkOptions`` say (``ForkStarter.fork`` says what it does with each field).
    Derive one from another with ``model_copy(update=...)``."""

    #: the workflow id of the run to fork
    run: str
    #: the last step the fork inherits; it continues live after it
    at_step: int
    #: the fork's workflow id (None: ``<run>--fork-<8 hex>``)
    name: str | None = None
    #: who asked, for the receipt (None: the user running this process)
    requested_by: str | None = None
    #: the fork point by meaning ``at_step`` was resolved from (``fork_at.resolve_at``)
    point: str | None = None
    #: the member of a team fork (``forklab fork-team``): held until released, its
    #: messages addressed to the team's forks; composed with the team part of the fork
    #: ``run`` is, so a team fork of a team fork addresses the ids its code names
    team: TeamPart | None = None
    #: the receipt and the marker name the builds that recorded the prefix; this lets a
    #: fork on another build whose prefix notices the change go on approximately
    allow_build_change: bool = False
    #: False leaves the receipt for the caller to record: a team fork writes its held
    #: members' receipts with the group receipt, in one transaction, before any member runs
    record: bool = True
    #: the run of ``run`` to fork when the caller read it closed and the only run of its
    #: chain (a team fork's cut was computed on it): it is read (or taken from the cache
    #: of closed runs) without asking for the latest run and its first event again; a run
    #: that is not so is located as usual
    run_id: str | None = None
