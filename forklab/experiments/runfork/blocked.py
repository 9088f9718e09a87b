"""What a call a fork refuses says, in one place: the activity that records the refusal
fails with it (so the workflow sees the call fail, as for any failed call), and a fork of
that fork, which inherits the refusal, raises the same. Local activities and child
workflows a fork's policy refuses (``acting``) are refused the same way."""

from __future__ import annotations

from forklab.experiments.runfork.policy import ToolPolicy

#: ``StepDecisionInput.acting`` of a refused local activity (its input is not recorded,
#: so ``replay`` cannot serve it either)
LOCAL_ACTIVITY = "local activity"
#: ``StepDecisionInput.acting`` of a refused child workflow
CHILD_WORKFLOW = "child workflow"


def blocked_message(index: int, tool: str, policy: ToolPolicy, acting: str | None = None) -> str:
    """Why step ``index`` (a call of ``tool``) did not run on a fork under ``policy``; for
    a local activity or child workflow (``acting``), why ``tool`` did not."""
    if acting is not None:
        why = (
            "is a local activity, whose input is not recorded to replay"
            if acting == LOCAL_ACTIVITY and policy is not ToolPolicy.block
            else "is blocked on this fork"
        )
        return f"{acting} {tool} {why} (policy {policy.value})"
    why = (
        "is blocked on this fork"
        if policy is ToolPolicy.block
        else "has no exact recorded call to replay"
    )
    return f"step {index} ({tool}) {why} (policy {policy.value})"
