"""Injected faults: small, documented, counter-seeded transformations of a fork's live
calls after the fork point.

Each fault hits a share (``rate``) of the calls it targets. Whether call ``c`` of fork
``f`` of run ``r`` is hit, and how, is a pure function of ``(seed, r, f, c)`` and the
fault's place in the world's list (``forklab.runtime.crn.uniform``), never of how many
calls came before: two forks that make the same call see the same fault, and a world that
makes an extra call shifts nobody's faults. What each kind does (docs/agent-experiments.md):

- ``brownout``: the model call fails as the provider would (``server_error``,
  ``timeout`` or ``rate_limited``) instead of answering;
- ``malformed_tool_response``: the tool's result is cut in half mid-JSON
  (``truncated``), replaced by a proxy's HTML error page (``not_json``) or turned into
  another JSON type (``wrong_type``);
- ``stale_data``: the tool answers with the result it gave ``age`` calls earlier (in
  this run's record); with no such result the call is left alone;
- ``schema_drift``: a field of the result is renamed (``rename_to``) or missing (none),
  ``field`` or, when not named, one picked by the draw;
- ``poisoned_retrieval``: a misleading ``passage`` is put first in the result's list
  (``field``, or the result itself when it is a list; prepended to a text result);
- ``partial_data_loss``: each item of a list result, key of a mapping result, or the
  tail of a text result is lost with probability ``share``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from forklab.runtime.crn import uniform

_NAME = r"^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$"


class FaultKind(StrEnum):
    brownout = "brownout"
    malformed_tool_response = "malformed_tool_response"
    stale_data = "stale_data"
    schema_drift = "schema_drift"
    poisoned_retrieval = "poisoned_retrieval"
    partial_data_loss = "partial_data_loss"


class _Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    rate: float = Field(gt=0, le=1, description="Share of the targeted calls hit.")
    tools: list[Annotated[str, Field(pattern=_NAME)]] = Field(
        default_factory=list,
        max_length=100,
        description="Tools whose calls are targeted; empty: every tool call.",
    )


class BrownoutError(StrEnum):
    server_error = "server_error"
    timeout = "timeout"
    rate_limited = "rate_limited"


class Brownout(_Fault):
    """Targets model calls (``tools`` must stay empty)."""

    kind: Literal["brownout"]
    error: Annotated[BrownoutError, Field(strict=False)] = BrownoutError.server_error

    @model_validator(mode="after")
    def _model_calls_only(self) -> Self:
        if self.tools:
            raise ValueError("a brownout hits model calls; remove 'tools'")
        return self


class MalformedStyle(StrEnum):
    truncated = "truncated"
    not_json = "not_json"
    wrong_type = "wrong_type"


class MalformedToolResponse(_Fault):
    kind: Literal["malformed_tool_response"]
    style: Annotated[MalformedStyle, Field(strict=False)] = MalformedStyle.truncated


class StaleData(_Fault):
    kind: Literal["stale_data"]
    age: int = Field(default=1, ge=1, le=1000)


class SchemaDrift(_Fault):
    kind: Literal["schema_drift"]
    field: str | None = Field(default=None, min_length=1, max_length=200)
    rename_to: str | None = Field(default=None, min_length=1, max_length=200)


class PoisonedRetrieval(_Fault):
    kind: Literal["poisoned_retrieval"]
    passage: str = Field(min_length=1, max_length=4000)
    field: str | None = Field(default=None, min_length=1, max_length=200)


class PartialDataLoss(_Fault):
    kind: Literal["partial_data_loss"]
    share: float = Field(default=0.5, gt=0, le=1)


AnyFault = (
    Brownout | MalformedToolResponse | StaleData | SchemaDrift | PoisonedRetrieval | PartialDataLoss
)
#: A fault as a spec writes it: ``kind`` says which.
Fault = Annotated[AnyFault, Field(discriminator="kind")]

#: What a ``not_json`` tool response looks like: a proxy's error page.
NOT_JSON = "<html><head><title>502 Bad Gateway</title></head><body>bad gateway</body></html>"


class CallSite(BaseModel):
    """The coordinates of one live call of a fork: the call is its step index."""

    model_config = ConfigDict(frozen=True)

    seed: int
    run: int = Field(ge=0)
    fork: int = Field(ge=0)
    call: int = Field(ge=1)
    #: the tool's name; None for a model call
    tool: str | None = None


class FaultResult(BaseModel):
    """The call's result after the faults, or the error it fails with instead."""

    model_config = ConfigDict(frozen=True)

    value: Any = None
    #: a brownout's error; the call fails with it and ``value`` is unused
    error: BrownoutError | None = None
    applied: list[FaultKind] = Field(default_factory=list)


def _draw(site: CallSite, slot: int, stream: str) -> float:
    return uniform(site.seed, site.run, site.fork, site.call, f"fault{slot}/{stream}")


def targets(fault: AnyFault, site: CallSite) -> bool:
    """Whether ``fault`` targets the call at ``site`` at all (before its rate)."""
    if isinstance(fault, Brownout):
        return site.tool is None
    if site.tool is None:
        return False
    return not fault.tools or site.tool in fault.tools


def hits(fault: AnyFault, site: CallSite, slot: int = 0) -> bool:
    """Whether the fault in place ``slot`` of a world's list hits the call at ``site``."""
    return targets(fault, site) and _draw(site, slot, "hit") < fault.rate


def _malformed(style: MalformedStyle, value: Any) -> Any:
    if style is MalformedStyle.not_json:
        return NOT_JSON
    if style is MalformedStyle.wrong_type:
        if isinstance(value, dict):
            return list(value.values())
        return {"value": value}
    text = json.dumps(value, sort_keys=True)
    return text[: max(1, len(text) // 2)]


def _drift(fault: SchemaDrift, value: Any, site: CallSite, slot: int) -> tuple[Any, bool]:
    if not isinstance(value, dict) or not value:
        return value, False
    keys = sorted(value)
    field = fault.field
    if field is None:
        field = keys[min(len(keys) - 1, int(_draw(site, slot, "field") * len(keys)))]
    if field not in value:
        return value, False
    out = {k: v for k, v in value.items() if k != field}
    if fault.rename_to is not None:
        out[fault.rename_to] = value[field]
    return out, True


def _poison(fault: PoisonedRetrieval, value: Any) -> tuple[Any, bool]:
    if fault.field is not None:
        if isinstance(value, dict) and isinstance(value.get(fault.field), list):
            return {**value, fault.field: [fault.passage, *value[fault.field]]}, True
        return value, False
    if isinstance(value, list):
        return [fault.passage, *value], True
    if isinstance(value, str):
        return f"{fault.passage}\n\n{value}", True
    if isinstance(value, dict):
        for key in sorted(value):
            if isinstance(value[key], list):
                return {**value, key: [fault.passage, *value[key]]}, True
    return value, False


def _lose(fault: PartialDataLoss, value: Any, site: CallSite, slot: int) -> tuple[Any, bool]:
    def kept(i: int) -> bool:
        return _draw(site, slot, f"loss/{i}") >= fault.share

    if isinstance(value, list):
        out_list = [item for i, item in enumerate(value) if kept(i)]
        return out_list, len(out_list) != len(value)
    if isinstance(value, dict):
        out = {k: value[k] for i, k in enumerate(sorted(value)) if kept(i)}
        return out, len(out) != len(value)
    if isinstance(value, str) and value:
        cut = int(len(value) * (1 - fault.share * _draw(site, slot, "loss/text")))
        return value[:cut], cut < len(value)
    return value, False


def apply_faults(
    faults: Sequence[AnyFault],
    site: CallSite,
    value: Any = None,
    earlier: Sequence[Any] = (),
) -> FaultResult:
    """Apply a world's faults, in its list's order, to one live call.

    ``value`` is the call's JSON result (unused for a model call: a brownout replaces the
    call, nothing else touches it); ``earlier`` are the results this tool gave earlier in
    the run's record, oldest first (for ``stale_data``). The input is never modified.
    """
    applied: list[FaultKind] = []
    for slot, fault in enumerate(faults):
        if not hits(fault, site, slot):
            continue
        if isinstance(fault, Brownout):
            return FaultResult(error=fault.error, applied=[FaultKind.brownout])
        changed = True
        if isinstance(fault, MalformedToolResponse):
            value = _malformed(fault.style, value)
        elif isinstance(fault, StaleData):
            changed = len(earlier) >= fault.age
            if changed:
                value = earlier[-fault.age]
        elif isinstance(fault, SchemaDrift):
            value, changed = _drift(fault, value, site, slot)
        elif isinstance(fault, PoisonedRetrieval):
            value, changed = _poison(fault, value)
        elif isinstance(fault, PartialDataLoss):
            value, changed = _lose(fault, value, site, slot)
        if changed:
            applied.append(FaultKind(fault.kind))
    return FaultResult(value=value, applied=applied)


def describe_fault(fault: AnyFault) -> str:
    """One line: what the fault does to which calls."""
    share = f"{fault.rate:.0%}"
    where = (
        "model calls"
        if isinstance(fault, Brownout)
        else ("calls of " + ", ".join(fault.tools) if fault.tools else "tool calls")
    )
    if isinstance(fault, Brownout):
        what = f"fail with {fault.error.value}"
    elif isinstance(fault, MalformedToolResponse):
        what = f"return a malformed response ({fault.style.value})"
    elif isinstance(fault, StaleData):
        what = f"return the result from {fault.age} call(s) earlier"
    elif isinstance(fault, SchemaDrift):
        field = repr(fault.field) if fault.field else "a field"
        what = f"rename {field} to {fault.rename_to!r}" if fault.rename_to else f"lose {field}"
    elif isinstance(fault, PoisonedRetrieval):
        what = "put a misleading passage first"
    elif isinstance(fault, PartialDataLoss):
        what = f"lose {fault.share:.0%} of their items"
    else:  # pragma: no cover - the union is closed
        what = "change"
    return f"{share} of {where} {what}"
