"""Fork requests, boundary resolution and the immutable fork receipt.

``resolve_boundary`` is the rule that keeps ``exact`` honest: the prefix it accepts is
one a fork can inherit call for call; anything else is an error naming the step and the
cause, never a quietly different boundary.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from forklab.experiments.runfork.overrides import ForkSignal, InputOverride, ResultOverride
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.steps import Step, StepStatus, prefix_sha256
from forklab.experiments.visible_text import visible

RECEIPT_SCHEMA_VERSION = 1


class BoundaryMode(StrEnum):
    #: every inherited call must match type and input digest; nothing but activities inside
    exact = "exact"
    #: type must match; input drift, timers and signals inside the prefix are recorded
    approximate = "approximate"
    #: nothing is inherited: the fork re-runs live, only the lineage is recorded
    lineage_only = "lineage_only"


class BoundaryError(ValueError):
    """An ``exact`` (or impossible) boundary; the message names the step and the cause."""

    def __init__(self, step: int, cause: str) -> None:
        super().__init__(f"cannot fork exactly at step {step}: {cause}")
        self.step = step
        self.cause = cause


class PrefixEvent(BaseModel):
    """Something other than an activity the parent saw inside the prefix (timer fired,
    child workflow, signal, update, local activity), with the step it came after."""

    model_config = ConfigDict(frozen=True)

    kind: str
    after_step: int


class Resolution(BaseModel):
    model_config = ConfigDict(frozen=True)

    requested_step: int
    resolved_step: int
    restorable: bool
    why: str
    prefix: list[Step]
    #: departures an ``approximate`` boundary accepted (each names its step)
    approximations: list[str] = Field(default_factory=list)


def resolve_boundary(
    steps: list[Step],
    events: list[PrefixEvent],
    at_step: int,
    mode: BoundaryMode,
    base_step: int = 0,
) -> Resolution:
    """The prefix a fork at ``at_step`` inherits from the run holding ``steps`` (numbered
    from ``base_step + 1``; earlier steps reached it through its input).

    Steps base+1..at_step are served from the record; the fork's step at_step+1 runs live.
    """
    if at_step < base_step:
        raise BoundaryError(
            at_step,
            f"this run starts after step {base_step}; fork the run it came from instead",
        )
    if mode is BoundaryMode.lineage_only:
        return Resolution(
            requested_step=at_step,
            resolved_step=0,
            restorable=False,
            why="lineage_only: nothing inherited, the fork re-runs every step live",
            prefix=[],
        )
    last = steps[-1].index if steps else base_step
    if at_step > last:
        raise BoundaryError(at_step, f"the run has only {last} steps so far (see `forklab steps`)")
    prefix = [s for s in steps if s.index <= at_step]
    notes: list[str] = []
    for s in prefix:
        if s.status is not StepStatus.completed and s.status is not StepStatus.blocked:
            cause = f"step {s.index} ({s.activity_type}) never completed (it is {s.status.value})"
            raise BoundaryError(at_step, cause)
    for e in events:
        if e.after_step < at_step:
            cause = (
                f"a {e.kind} reached the parent after step {e.after_step}, inside the "
                "prefix; a fork would not see it again"
            )
            if mode is BoundaryMode.exact:
                raise BoundaryError(at_step, cause)
            notes.append(cause)
    why = "every inherited step completed and nothing else happened inside the prefix"
    if notes:
        why = "approximate: " + "; ".join(notes)
    return Resolution(
        requested_step=at_step,
        resolved_step=at_step,
        restorable=not notes,
        why=why,
        prefix=prefix,
        approximations=notes,
    )


def ends_its_run(resolution: Resolution, steps: list[Step], events: list[PrefixEvent]) -> bool:
    """Whether the boundary is the last step of its run with nothing after it: then the
    run that continued-as-new from it starts exactly at the boundary, and its recorded
    input is a checkpoint of the parent's state after the boundary step (a fork can start
    from it and be served nothing)."""
    at = resolution.resolved_step
    return (
        bool(steps)
        and bool(resolution.prefix)
        and steps[-1].index == at
        and not any(e.after_step >= at for e in events)
    )


class ForkReceipt(BaseModel):
    """What a fork asked for and what it inherited. Written once, never changed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = RECEIPT_SCHEMA_VERSION
    fork_workflow_id: str
    name: str
    requested_step: int
    resolved_step: int
    #: the fork point by meaning it was asked at (``forklab fork --at``, e.g.
    #: ``tool:charge_customer#1``), resolved to ``requested_step``; None: asked by number
    requested_point: str | None = None
    parent_workflow_id: str
    parent_run_id: str
    #: the run of the parent's continue-as-new chain the fork started from
    source_run_id: str
    #: step numbers before the source run (inherited through its input)
    base_step: int = 0
    #: sha256 of the source run's recorded input: the parent's state after ``base_step``
    source_input_sha256: str | None = None
    #: root first: every workflow id from the lineage root down to the parent
    lineage: list[str]
    boundary: BoundaryMode
    #: sha256 over the steps the fork is served from the record (after ``base_step``, up
    #: to ``resolved_step``): index, type, input and result digests
    prefix_sha256: str
    restorable: bool
    why: str
    approximations: list[str] = Field(default_factory=list)
    intervention: dict[str, Any] | None = None
    #: the boundary step's result the fork was served instead of the parent's
    result_override: ResultOverride | None = None
    #: the step after the boundary, run live with this input instead of the parent's
    input_override: InputOverride | None = None
    #: signals delivered at the fork point
    signals: list[ForkSignal] = Field(default_factory=list)
    model: str | None = None
    tool_policies: dict[str, ToolPolicy]
    #: the sealed layer holding the parent's workspace after ``resolved_step`` (the last
    #: step at or before it whose result names a ``workspace_layer``); the fork's files
    #: start from it, copy-on-write. None: the run kept no workspace by then.
    workspace_layer_sha256: str | None = None
    requested_by: str
    created_at: AwareDatetime

    @property
    def lineage_root(self) -> str:
        return self.lineage[0]


def make_receipt(
    resolution: Resolution,
    *,
    fork_workflow_id: str,
    name: str,
    parent_workflow_id: str,
    parent_run_id: str,
    source_run_id: str,
    base_step: int,
    source_input_sha256: str,
    lineage: list[str],
    boundary: BoundaryMode,
    intervention: dict[str, Any] | None,
    model: str | None,
    tool_policies: dict[str, ToolPolicy],
    requested_by: str,
    created_at: datetime,
    workspace_layer_sha256: str | None = None,
    requested_point: str | None = None,
    result_override: ResultOverride | None = None,
    input_override: InputOverride | None = None,
    signals: list[ForkSignal] | None = None,
) -> ForkReceipt:
    return ForkReceipt(
        fork_workflow_id=fork_workflow_id,
        name=name,
        requested_step=resolution.requested_step,
        resolved_step=resolution.resolved_step,
        requested_point=requested_point,
        parent_workflow_id=parent_workflow_id,
        parent_run_id=parent_run_id,
        source_run_id=source_run_id,
        base_step=base_step,
        source_input_sha256=source_input_sha256,
        lineage=lineage,
        boundary=boundary,
        prefix_sha256=prefix_sha256(resolution.prefix),
        restorable=resolution.restorable,
        why=resolution.why,
        approximations=resolution.approximations,
        intervention=intervention,
        result_override=result_override,
        input_override=input_override,
        signals=signals or [],
        model=model,
        tool_policies=tool_policies,
        workspace_layer_sha256=workspace_layer_sha256,
        requested_by=requested_by,
        created_at=created_at,
    )


def receipt_markdown(r: ForkReceipt) -> str:
    """The receipt as the Web UI shows it in the workflow's details (``visible``: tool
    names and the intervention come from the run's history and the operator's input)."""
    policies = ", ".join(f"`{k}={v.value}`" for k, v in sorted(r.tool_policies.items()))
    rows = [
        ("fork of", f"`{r.parent_workflow_id}` run `{r.parent_run_id}`"),
        ("step", f"requested {r.requested_step}, resolved {r.resolved_step}"),
        ("asked at", f"`{r.requested_point}`" if r.requested_point else "(a step number)"),
        ("boundary", f"{r.boundary.value} (restorable: {r.restorable}; {r.why})"),
        ("starts from", f"run `{r.source_run_id}`'s input (state after step {r.base_step})"),
        ("prefix sha256", f"`{r.prefix_sha256}`"),
        ("lineage", " → ".join(f"`{w}`" for w in r.lineage)),
        ("model", r.model or "(unchanged)"),
        ("intervention", f"`{r.intervention}`" if r.intervention is not None else "(none)"),
        (
            "result override",
            f"step {r.result_override.step} returns `{r.result_override.value}`"
            if r.result_override is not None
            else "(none)",
        ),
        (
            "input override",
            f"step {r.input_override.step} asked `{r.input_override.value}`"
            if r.input_override is not None
            else "(none)",
        ),
        ("signals", ", ".join(f"`{g.name}`" for g in r.signals) or "(none)"),
        ("tool policies", policies),
        (
            "workspace layer",
            f"`{r.workspace_layer_sha256}`" if r.workspace_layer_sha256 else "(none)",
        ),
        ("by", f"{r.requested_by} at {r.created_at.isoformat()}"),
    ]
    return visible("**ForkLab fork receipt**\n\n" + "\n".join(f"- **{k}**: {v}" for k, v in rows))
