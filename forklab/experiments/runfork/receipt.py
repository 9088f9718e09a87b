"""Fork requests, boundary resolution and the immutable fork receipt.

``resolve_boundary`` is the rule that keeps ``exact`` honest: the prefix it accepts is
one a fork can inherit call for call; anything else is an error naming the step and the
cause, never a quietly different boundary.
"""

from __future__ import annotations

import json
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field

from forklab.experiments.runfork.approximations import Approximation, ApproximationKind, legacy
from forklab.experiments.runfork.overrides import ForkSignal, InputOverride, ResultOverride
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.steps import Step, StepStatus, prefix_sha256
from forklab.experiments.visible_text import visible

RECEIPT_SCHEMA_VERSION = 1

#: Kinds of ``PrefixEvent`` a fork sees again at the same point when they fall inside its
#: prefix (the fork interceptor redelivers them): they do not keep a boundary from being
#: exact. Every other kind inside a prefix does, but a child that closed inside it and a
#: signal sent that was acknowledged there (``CHILD_KIND``, ``SENT_SIGNAL_KIND``).
REDELIVERED_KINDS = frozenset({"signal", "update", "timer"})
#: What an approximate prefix may hold that no history read before the fork starts can
#: rule out (``why`` says it; each such call is recorded when the fork makes it).
INPUT_DRIFT = (
    "inherited calls are matched by activity type: one whose input differs from the "
    "parent's is served the parent's result, and recorded in the fork's history when it "
    "is made (`forklab trail`)"
)
#: An approximation as a receipt keeps it (receipts written before they were typed held
#: sentences: read as ``noted``).
Recorded = Annotated[Approximation, BeforeValidator(legacy)]
#: A child workflow inside a prefix is served its outcome when it closed inside it too.
CHILD_KIND = "child workflow"
#: A signal the run sent another workflow inside a prefix is not sent again when it was
#: acknowledged inside it too.
SENT_SIGNAL_KIND = "signal sent"
#: A cancellation the run asked of another workflow: the SDK gives an interceptor no hold
#: on it, so a fork's code would ask it again.
CANCEL_REQUEST_KIND = "cancel request"


class BoundaryMode(StrEnum):
    #: every inherited call must match type and input digest; nothing but activities inside
    exact = "exact"
    #: type must match; input drift and what a fork cannot see again inside the prefix are
    #: recorded
    approximate = "approximate"
    #: nothing is inherited: the fork re-runs live, only the lineage is recorded
    lineage_only = "lineage_only"


class BoundaryError(ValueError):
    """An ``exact`` (or impossible) boundary; the message names the step and the cause (and
    says "approximately" when the fork was asked approximate)."""

    def __init__(self, step: int, cause: str, mode: BoundaryMode = BoundaryMode.exact) -> None:
        how = "approximately" if mode is BoundaryMode.approximate else "exactly"
        super().__init__(f"cannot fork {how} at step {step}: {cause}")
        self.step = step
        self.cause = cause


class PrefixEvent(BaseModel):
    """Something other than an activity the parent saw inside the prefix (timer fired,
    child workflow, signal, update, local activity), with the step it came after."""

    model_config = ConfigDict(frozen=True)

    kind: str
    after_step: int
    #: the local activity's type or the child workflow's type (for ``forklab steps`` and
    #: the tool names a fork's policies may name), a signal's name; empty for the others
    name: str = ""
    #: the child workflow's id; a signal sent: the workflow it was sent to
    child_id: str | None = None
    #: a local activity or child workflow the fork's policy refused (it never ran)
    blocked: bool = False
    #: a child workflow: the step after which its result (or failure) reached the run; a
    #: signal sent: the step after which it was acknowledged (None: it had not closed, or
    #: was not served as it ended another way)
    closed_after: int | None = None
    #: a child workflow that ended canceled, timed out or terminated; a signal sent that
    #: failed
    ended: str | None = None


class Resolution(BaseModel):
    model_config = ConfigDict(frozen=True)

    requested_step: int
    resolved_step: int
    restorable: bool
    why: str
    prefix: list[Step]
    #: departures an ``approximate`` boundary accepted (each names its step)
    approximations: list[Recorded] = Field(default_factory=list)


def resolve_boundary(
    steps: list[Step],
    events: list[PrefixEvent],
    at_step: int,
    mode: BoundaryMode,
    base_step: int = 0,
    drift: list[Approximation] | None = None,
) -> Resolution:
    """The prefix a fork at ``at_step`` inherits from the run holding ``steps`` (numbered
    from ``base_step + 1``; earlier steps reached it through its input).

    Steps base+1..at_step are served from the record; the fork's step at_step+1 runs live.
    ``drift``: the inherited calls already known to ask with another input on the fork
    (``approximations.predicted_id_drift``): an exact boundary is refused at the first,
    an approximate one lists each.
    """
    if at_step < base_step:
        raise BoundaryError(
            at_step,
            f"this run starts after step {base_step}; fork the run it came from instead",
            mode,
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
        raise BoundaryError(
            at_step, f"the run has only {last} steps so far (see `forklab steps`)", mode
        )
    prefix = [s for s in steps if s.index <= at_step]
    notes: list[Approximation] = []
    for s in prefix:
        if s.status is not StepStatus.completed and s.status is not StepStatus.blocked:
            cause = f"step {s.index} ({s.activity_type}) never completed (it is {s.status.value})"
            raise BoundaryError(at_step, cause, mode)
    for e in events:
        if e.after_step >= at_step or e.kind in REDELIVERED_KINDS:
            continue
        if e.kind in (CHILD_KIND, SENT_SIGNAL_KIND) and (
            e.closed_after is not None and e.closed_after < at_step
        ):
            continue  # served its recorded outcome
        if e.kind == CANCEL_REQUEST_KIND:
            raise BoundaryError(
                at_step,
                f"the run asked {(e.child_id or '')[:100]} to cancel after step {e.after_step}, "
                "inside the prefix; a fork's code would ask it again (nothing holds such a "
                f"request back): fork at step {e.after_step} or before",
                mode,
            )
        if e.kind == SENT_SIGNAL_KIND:
            # sent again, it would reach a workflow outside the fork: refused either way
            raise BoundaryError(
                at_step,
                f"signal {e.name[:100]!r} to {(e.child_id or '')[:100]}, sent after step "
                f"{e.after_step}, "
                + (
                    f"{e.ended}, which a fork cannot be handed"
                    if e.ended
                    else f"was not acknowledged by step {at_step}; a fork would send it again"
                ),
                mode,
            )
        cause = (
            f"a {e.kind} reached the parent after step {e.after_step}, inside the "
            "prefix; a fork would not see it again"
        )
        kind = ApproximationKind.not_seen_again
        if e.kind == "local activity":
            kind = ApproximationKind.local_activity
        if e.kind == CHILD_KIND and not e.blocked:
            kind = ApproximationKind.child_rerun
            child = f"child workflow {e.name} ({e.child_id})"
            cause = f"{child}, started after step {e.after_step}, " + (
                f"ended {e.ended}, which a fork cannot be handed"
                if e.ended
                else f"is still running at step {at_step}; a fork would start it again"
            )
        if mode is BoundaryMode.exact:
            raise BoundaryError(at_step, cause)
        notes.append(Approximation(kind=kind, step=e.after_step, detail=cause))
    for d in drift or []:
        if mode is BoundaryMode.exact:
            raise BoundaryError(
                at_step,
                f"{d.line()}; fork with --boundary approximate to be served the parent's result",
            )
        notes.append(d)
    why = (
        "every inherited step completed, and whatever else reached the parent inside the "
        "prefix (signals, updates, fired timers, closed children) is handed over again"
    )
    if mode is BoundaryMode.approximate and prefix:
        # drift of any origin shows only when the fork makes the call
        why = "approximate: " + "; ".join([INPUT_DRIFT, *(n.line() for n in notes)])
    return Resolution(
        requested_step=at_step,
        resolved_step=at_step,
        restorable=not notes and not (mode is BoundaryMode.approximate and prefix),
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
    #: each departure an approximate boundary accepted before the fork started, with its
    #: step and kind (drift seen only once the fork runs: its history, ``forklab trail``)
    approximations: list[Recorded] = Field(default_factory=list)
    intervention: dict[str, Any] | None = None
    #: the boundary step's result the fork was served instead of the parent's
    result_override: ResultOverride | None = None
    #: the step after the boundary, run live with this input instead of the parent's
    input_override: InputOverride | None = None
    #: signals delivered at the fork point
    signals: list[ForkSignal] = Field(default_factory=list)
    #: the builds (Worker Deployment Version, else build id) that recorded the parent's
    #: prefix (None: its history names none)
    parent_build: str | None = None
    #: the builds of the workers polling the fork's queue when it started, one of which
    #: runs it (its history records which on every workflow task; None: none said)
    fork_build: str | None = None
    #: ``--allow-build-change``: a fork on another build is served the parent's results
    #: approximately where its prefix notices the change, instead of failing
    allow_build_change: bool = False
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
    parent_build: str | None = None,
    fork_build: str | None = None,
    allow_build_change: bool = False,
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
        parent_build=parent_build,
        fork_build=fork_build,
        allow_build_change=allow_build_change,
        model=model,
        tool_policies=tool_policies,
        workspace_layer_sha256=workspace_layer_sha256,
        requested_by=requested_by,
        created_at=created_at,
    )


def _policies(r: ForkReceipt) -> str:
    """The tool policies that are not the default ``auto``."""
    set_ = [
        f"{k}={v.value}" for k, v in sorted(r.tool_policies.items()) if v is not ToolPolicy.auto
    ]
    return ", ".join(set_) or "all auto"


def _intervention(r: ForkReceipt) -> str:
    if r.intervention is None:
        return "none"
    text = json.dumps(r.intervention, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= 60 else text[:59] + "…"


def _inherited(r: ForkReceipt) -> str:
    if r.boundary is BoundaryMode.lineage_only:
        return "nothing is served from the parent's history (lineage only): every call runs"
    if r.base_step >= r.resolved_step:
        return f"it holds the state after step {r.base_step}, so nothing is served"
    return f"steps {r.base_step + 1}..{r.resolved_step} are served from the parent's history"


def fork_summary(r: ForkReceipt, model_in_effect: str | None) -> str:
    """The fork's line in the Web UI (its static summary, shown on its first event): where
    it forks, and what is in effect after the boundary, which its Input (the parent's,
    unchanged) does not show. ``model_in_effect``: the model its calls after the
    boundary use (None: the workflow's own choice, as in the parent)."""
    model = model_in_effect or "the parent's"
    text = (
        f"fork of {r.parent_workflow_id} at step {r.requested_step} ({r.boundary.value}): "
        f"model {model}, intervention {_intervention(r)}, tools {_policies(r)}"
    )
    return visible(text if len(text) <= 240 else text[:239] + "…")


def receipt_markdown(r: ForkReceipt, model_in_effect: str | None = None) -> str:
    """The receipt as the Web UI shows it in the workflow's details, what is in effect
    first (``visible``: tool names and the intervention come from the run's history and
    the operator's input)."""
    policies = ", ".join(f"`{k}={v.value}`" for k, v in sorted(r.tool_policies.items()))
    model = f"`{model_in_effect}`" if model_in_effect else "the parent's (unchanged)"
    head = [
        "**ForkLab fork receipt**",
        "",
        f"**In effect from step {r.requested_step + 1}**: model {model}, intervention "
        f"`{_intervention(r)}`, tools {_policies(r)}.",
        "",
        f"The Input is the parent run's, unchanged (sha256 `{r.source_input_sha256}`); "
        f"{_inherited(r)}. The model and intervention above apply to the calls after step "
        f"{r.requested_step}, not to the input.",
        "",
    ]
    rows = [
        ("fork of", f"`{r.parent_workflow_id}` run `{r.parent_run_id}`"),
        ("step", f"requested {r.requested_step}, resolved {r.resolved_step}"),
        ("asked at", f"`{r.requested_point}`" if r.requested_point else "(a step number)"),
        ("boundary", f"{r.boundary.value} (restorable: {r.restorable}; {r.why})"),
        ("approximations", "; ".join(a.line() for a in r.approximations) or "(none)"),
        ("starts from", f"run `{r.source_run_id}`'s input (state after step {r.base_step})"),
        ("prefix sha256", f"`{r.prefix_sha256}`"),
        ("lineage", " → ".join(f"`{w}`" for w in r.lineage)),
        ("model", model),
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
        (
            "parent build",
            (f"`{r.parent_build}`" if r.parent_build else "(not recorded)")
            + ("; a fork on another build may go on approximately" if r.allow_build_change else ""),
        ),
        ("fork build", f"`{r.fork_build}`" if r.fork_build else "(none polling yet)"),
        ("tool policies", policies),
        (
            "workspace layer",
            f"`{r.workspace_layer_sha256}`" if r.workspace_layer_sha256 else "(none)",
        ),
        ("by", f"{r.requested_by} at {r.created_at.isoformat()}"),
    ]
    return visible("\n".join([*head, *(f"- **{k}**: {v}" for k, v in rows)]))
