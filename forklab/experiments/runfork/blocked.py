"""What a call a fork refuses says, in one place: the activity that records the refusal
fails with it (so the workflow sees an ``ActivityError``, as for any failed call), and a
fork of that fork, which inherits the refusal, raises the same."""

from __future__ import annotations

from forklab.experiments.runfork.policy import ToolPolicy


def blocked_message(index: int, tool: str, policy: str) -> str:
    """Why step ``index`` (a call of ``tool``) did not run on a fork under ``policy``."""
    why = (
        "is blocked on this fork"
        if policy == ToolPolicy.block.value
        else "has no exact recorded call to replay"
    )
    return f"step {index} ({tool}) {why} (policy {policy})"
