"""Fork points by meaning, and their resolution over a recorded run's steps.

A cohort names where to fork each run by what happened there, not by a number that
differs run to run: ``step:N``, ``failed`` (the first failed step), ``tool:NAME#k`` (the
k-th call of a tool) or ``last_model_call_before_failure``. Resolving one is a pure
function of the run's parsed steps (``forklab.experiments.runfork.steps.Step``): it gives
the steps the forks inherit (``at_step``, as ``forklab fork --at-step``), the decisive
step the worlds re-run live (``at_step + 1``), and the prefix digest the approver signs;
or the reason it cannot be resolved *exactly*. A run whose point cannot be resolved is
excluded with that reason, never forked somewhere near it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from enum import StrEnum
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from forklab.experiments.runfork.steps import Step, StepStatus, prefix_sha256

#: Activity types of model calls (the OpenAI Agents SDK's and ForkLab's chat call); the
#: run-fork half's ``MODEL_FIELDS`` names the same two.
MODEL_ACTIVITY_TYPES = frozenset({"invoke_model_activity", "chat_model"})
MAX_STEP = 10_000_000
_TOOL = r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}"
_TEXT = re.compile(
    rf"^(?:step:(?P<step>[0-9]{{1,8}})|(?P<failed>failed)|tool:(?P<tool>{_TOOL})"
    rf"(?:#(?P<k>[0-9]{{1,6}}))?|(?P<last>last_model_call_before_failure))$"
)


class ForkPointKind(StrEnum):
    step = "step"
    failed = "failed"
    tool = "tool"
    last_model_call_before_failure = "last_model_call_before_failure"


class ForkPoint(BaseModel):
    """Where to fork a run, written ``step:N``, ``failed``, ``tool:NAME#k`` (``#k``
    defaults to 1) or ``last_model_call_before_failure``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ForkPointKind
    step: int | None = Field(default=None, ge=0, le=MAX_STEP)
    tool: str | None = None
    occurrence: int | None = Field(default=None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        m = _TEXT.match(value.strip())
        if m is None:
            raise ValueError(
                f"{value[:60]!r} is no fork point; write step:N, failed, tool:NAME#k or "
                "last_model_call_before_failure"
            )
        if m["step"] is not None:
            return {"kind": "step", "step": int(m["step"])}
        if m["tool"] is not None:
            return {"kind": "tool", "tool": m["tool"], "occurrence": int(m["k"] or 1)}
        return {"kind": "failed" if m["failed"] else "last_model_call_before_failure"}

    @model_validator(mode="after")
    def _fields_match_kind(self) -> Self:
        if (self.kind is ForkPointKind.step) != (self.step is not None):
            raise ValueError("a step fork point (and only it) takes a step number")
        if (self.kind is ForkPointKind.tool) != (self.tool is not None):
            raise ValueError("a tool fork point (and only it) takes a tool name")
        if self.kind is ForkPointKind.tool and self.occurrence is None:
            raise ValueError("a tool fork point takes an occurrence k >= 1")
        return self

    @property
    def text(self) -> str:
        """The fork point as the spec writes it."""
        if self.kind is ForkPointKind.step:
            return f"step:{self.step}"
        if self.kind is ForkPointKind.tool:
            return f"tool:{self.tool}#{self.occurrence}"
        return self.kind.value


class ResolvedForkPoint(BaseModel):
    """A run's fork point, resolved exactly: forks inherit steps ``1..at_step`` (whose
    digest is ``prefix_sha256``) and re-run step ``at_step + 1`` live."""

    model_config = ConfigDict(frozen=True)

    at_step: int = Field(ge=0)
    #: the step the worlds change (an override applies to it); None when the run ended
    #: at ``at_step`` and the forks only continue the workflow's own code
    decisive_step: int | None
    prefix_sha256: str
    #: the chain's run ids whose histories hold the inherited steps, oldest first
    chain_run_ids: list[str]


class Unresolved(BaseModel):
    """Why a run's fork point cannot be resolved exactly (one sentence)."""

    model_config = ConfigDict(frozen=True)

    reason: str


def _first_failed(steps: Sequence[Step]) -> Step | None:
    return next((s for s in steps if s.status is StepStatus.failed), None)


def tool_calls(steps: Sequence[Step], tool: str, model_types: Collection[str]) -> list[Step]:
    """The calls of ``tool`` (an activity type, or a step's label) in ``steps``, in order;
    model calls are not tools."""
    return [
        s
        for s in steps
        if s.activity_type not in model_types and tool in (s.activity_type, s.label)
    ]


def _decisive(
    steps: Sequence[Step], point: ForkPoint, model_types: Collection[str]
) -> int | Unresolved:
    """The 1-based index of the step the point names (for ``step:N``, N + 1)."""
    if point.kind is ForkPointKind.step:
        n = point.step or 0
        if n > len(steps):
            return Unresolved(reason=f"step:{n} is past the run's {len(steps)} recorded steps")
        return n + 1
    if point.kind is ForkPointKind.tool:
        calls = tool_calls(steps, point.tool or "", model_types)
        k = point.occurrence or 1
        if len(calls) < k:
            times = "never" if not calls else f"only {len(calls)} time{'s' * (len(calls) > 1)}"
            return Unresolved(reason=f"the run calls tool {point.tool!r} {times}, not #{k}")
        return calls[k - 1].index
    failed = _first_failed(steps)
    if failed is None:
        return Unresolved(reason="the run has no failed step")
    if point.kind is ForkPointKind.failed:
        return failed.index
    model = [s for s in steps[: failed.index - 1] if s.activity_type in model_types]
    if not model:
        return Unresolved(reason=f"no model call precedes the failed step {failed.index}")
    return model[-1].index


def resolve_fork_point(
    steps: Sequence[Step],
    point: ForkPoint,
    model_types: Collection[str] = MODEL_ACTIVITY_TYPES,
) -> ResolvedForkPoint | Unresolved:
    """Resolve ``point`` over a run's steps (in order, indexed from 1 without gaps).

    Exact means: every inherited step has a recorded result (completed or failed, none
    pending or blocked), and the decisive step is recorded too. Anything else is an
    ``Unresolved`` with the reason.
    """
    for i, step in enumerate(steps, start=1):
        if step.index != i:
            return Unresolved(
                reason=f"the run's steps are not numbered 1..{len(steps)} (step {i} is "
                f"{step.index}); its history was not read whole"
            )
    found = _decisive(steps, point, model_types)
    if isinstance(found, Unresolved):
        return found
    at_step = found - 1
    inherited = steps[:at_step]
    for step in inherited:
        if step.status not in (StepStatus.completed, StepStatus.failed):
            return Unresolved(
                reason=f"step {step.index} before the fork point is {step.status.value}, "
                "so the prefix has no recorded result to inherit"
            )
    decisive = steps[at_step] if at_step < len(steps) else None
    if decisive is not None and decisive.status is StepStatus.pending:
        return Unresolved(reason=f"the decisive step {decisive.index} is still pending")
    chain: list[str] = []
    for step in inherited:
        if step.run_id not in chain:
            chain.append(step.run_id)
    return ResolvedForkPoint(
        at_step=at_step,
        decisive_step=decisive.index if decisive is not None else None,
        prefix_sha256=prefix_sha256(list(inherited)),
        chain_run_ids=chain,
    )
