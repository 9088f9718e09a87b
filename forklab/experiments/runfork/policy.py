"""Per-tool policies on a fork, and the decision each one makes for a live call."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum

DEFAULT_KEY = "*"


class ToolPolicy(StrEnum):
    #: an exact inherited call (same tool, same request digest) returns the recorded
    #: result; a new or changed call runs live
    auto = "auto"
    #: must be served from the record; a miss raises ``fork_tool_blocked``
    replay = "replay"
    #: never runs on the fork: ``fork_tool_blocked``
    block = "block"
    #: always runs
    live = "live"


class Decision(StrEnum):
    serve_recorded = "serve_recorded"
    run_live = "run_live"
    blocked = "blocked"


class PolicyError(ValueError):
    pass


def parse_policies(items: Iterable[str]) -> dict[str, ToolPolicy]:
    """``TOOL=POLICY`` strings to a map with a ``*`` default (``auto`` when not given)."""
    out: dict[str, ToolPolicy] = {}
    for item in items:
        tool, sep, value = item.partition("=")
        if not sep or not tool.strip():
            raise PolicyError(
                f"tool policy {item!r} is not TOOL=POLICY (e.g. charge_customer=block)"
            )
        try:
            out[tool.strip()] = ToolPolicy(value.strip())
        except ValueError:
            choices = ", ".join(p.value for p in ToolPolicy)
            raise PolicyError(f"tool policy {item!r}: {value!r} is not one of {choices}") from None
    out.setdefault(DEFAULT_KEY, ToolPolicy.auto)
    return out


def unknown_tools(policies: Mapping[str, ToolPolicy], tools: Iterable[str]) -> list[str]:
    """The tools ``policies`` name (``*`` aside) that are not among ``tools``, the ones the
    run called: a misspelt name would leave the tool under the default policy."""
    known = set(tools)
    return sorted(t for t in policies if t != DEFAULT_KEY and t not in known)


def policy_for(tool: str, policies: Mapping[str, ToolPolicy]) -> ToolPolicy:
    return policies.get(tool, policies.get(DEFAULT_KEY, ToolPolicy.auto))


def uses_records(policies: Mapping[str, ToolPolicy]) -> bool:
    """Whether any policy (the default included) serves calls from the parent's record."""
    return any(p in (ToolPolicy.auto, ToolPolicy.replay) for p in policies.values()) or (
        DEFAULT_KEY not in policies
    )


def decide(tool: str, policies: Mapping[str, ToolPolicy], recorded: bool) -> Decision:
    """What a fork does with a live call of ``tool``; ``recorded`` says whether the lineage
    holds an exact inherited call (same tool and request digest) with a result."""
    policy = policy_for(tool, policies)
    if policy is ToolPolicy.block:
        return Decision.blocked
    if policy is ToolPolicy.live:
        return Decision.run_live
    if recorded:
        return Decision.serve_recorded
    return Decision.blocked if policy is ToolPolicy.replay else Decision.run_live
