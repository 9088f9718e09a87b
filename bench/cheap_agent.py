"""The cheap agent of ``bench/cohort_scale.py``: a lookup, then an "answer" (the model's
stand-in, no model server, no tokens) whose success is a pure function of the calling
workflow's id and the task's difficulty, so each fork of a run draws its own outcome and a
run's forks disagree about as often as the difficulty says."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow


@activity.defn(name="lookup")
async def lookup(task: str) -> dict[str, Any]:
    return {"task": task, "difficulty": int(task.rsplit("-", 1)[-1]) % 5}


@activity.defn(name="answer")
async def answer(found: dict[str, Any]) -> dict[str, Any]:
    """Succeeds with probability 0.9, 0.7, 0.5, 0.3 or 0.1 by difficulty, drawn from the
    hash of the calling workflow's id (a fork has its own id, so its own draw)."""
    draw = int(hashlib.sha256(activity.info().workflow_id.encode()).hexdigest()[:8], 16) / 2**32
    return {"ok": draw < 0.9 - 0.2 * int(found["difficulty"])}


@workflow.defn(name="CheapAgent")
class CheapAgentWorkflow:
    @workflow.run
    async def run(self, task: str) -> dict[str, Any]:
        found = await workflow.execute_activity(
            lookup, task, start_to_close_timeout=timedelta(seconds=30)
        )
        said = await workflow.execute_activity(
            answer, found, start_to_close_timeout=timedelta(seconds=30)
        )
        return {"score": 1.0 if said.get("ok") else 0.0}


ACTIVITIES = [lookup, answer]
