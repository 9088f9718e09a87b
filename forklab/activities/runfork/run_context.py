"""What an activity knows about the run that called it, and the run log it writes.

The worker interceptor here reads the fork headers (lineage root, chain, call position)
into context variables for the effect ledger, and publishes each step's start and end to
the run log. Both stores are keyed by an identity no later run shares (namespace and
first run id, ``forklab.experiments.runfork.identity``), never by the bare workflow id.
The producer is the activity execution and the epoch its attempt, so an attempt that
outlived its successor (a zombie) cannot write after it.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from temporalio import activity
from temporalio.converter import default as default_converter
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from forklab.activities.stores.run_log import RunLog
from forklab.contracts.runfork import (
    CHAIN_HEADER,
    INTERNAL_PREFIX,
    LINEAGE_HEADER,
    MODEL_SEED_HEADER,
    STEP_DECISION,
    STEP_HEADER,
    TEAM_HEADER,
    TeamPart,
)
from forklab.experiments.runfork import identity

_lineage_root: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "forklab_lineage_root", default=None
)
_chain: contextvars.ContextVar[str | None] = contextvars.ContextVar("forklab_chain", default=None)
_call: contextvars.ContextVar[int | None] = contextvars.ContextVar("forklab_call", default=None)
_model_seed: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "forklab_model_seed", default=None
)
_team: contextvars.ContextVar[TeamPart | None] = contextvars.ContextVar(
    "forklab_team", default=None
)


def team_part() -> TeamPart | None:
    """The addresses of the team fork the calling run is a member of (None: it is none):
    a message the activity sends goes to the fork standing for its target."""
    return _team.get()


def model_seed() -> int | None:
    """The seed an experiment's fork asks this model call to sample with (None: the call
    is not one of an experiment's forks, the model samples as it likes)."""
    return _model_seed.get()


def _first_run_id() -> str:
    """The first run id of the calling chain; without the fork interceptor's header, the
    calling run's own id (a chain then has one stream per run, still never shared)."""
    return _chain.get() or activity.info().workflow_run_id or ""


def effect_scope() -> str:
    """The effect ledger's key of the calling run: its namespace (as the server says,
    never the caller) and its lineage root (its chain's own unless it is a fork)."""
    info = activity.info()
    root = _lineage_root.get() or identity.lineage_root(info.workflow_id or "", _first_run_id())
    return identity.effect_scope(info.workflow_namespace or "", root)


def run_stream() -> str:
    """The run log stream of the calling chain."""
    info = activity.info()
    return identity.run_stream(
        info.workflow_namespace or "", info.workflow_id or "", _first_run_id()
    )


def holder() -> str:
    info = activity.info()
    return f"{info.workflow_id}/{info.workflow_run_id}/{info.activity_id}"


class RunContextInterceptor(Interceptor):
    def __init__(self, log: RunLog) -> None:
        self._log = log

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _RunContextInbound(next, self._log)


class _RunContextInbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, log: RunLog) -> None:
        super().__init__(next)
        self._log = log

    async def _publish(self, seq: int, event: dict[str, Any]) -> None:
        info = activity.info()
        producer = f"{info.workflow_run_id}/{info.activity_id}"
        await asyncio.to_thread(self._log.append, run_stream(), producer, info.attempt, seq, event)

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        conv = default_converter().payload_converter
        root = input.headers.get(LINEAGE_HEADER)
        step = input.headers.get(STEP_HEADER)
        chain = input.headers.get(CHAIN_HEADER)
        seed = input.headers.get(MODEL_SEED_HEADER)
        _model_seed.set(conv.from_payload(seed, int) if seed is not None else None)
        _lineage_root.set(conv.from_payload(root, str) if root is not None else None)
        _chain.set(conv.from_payload(chain, str) if chain is not None else None)
        _call.set(conv.from_payload(step, int) if step is not None else None)
        team = input.headers.get(TEAM_HEADER)
        _team.set(TeamPart.model_validate(conv.from_payload(team)) if team is not None else None)
        info = activity.info()
        name = info.activity_type
        # the call's place in the scheduling order: its step number (the order calls
        # complete) is not known yet; `forklab watch` adds it from the run's history
        base = {"activity": name, "call": _call.get(), "attempt": info.attempt}
        if name.startswith(INTERNAL_PREFIX) and name != STEP_DECISION:
            return await super().execute_activity(input)
        if name == STEP_DECISION:
            d = input.args[0]
            base.update(
                kind="policy",
                call=d.index,
                tool=d.activity_type,
                decision=d.decision,
                policy=d.policy,
            )
            await self._publish(0, base)
            return await super().execute_activity(input)
        await self._publish(0, {**base, "kind": "step_started"})
        try:
            result = await super().execute_activity(input)
        except BaseException as exc:
            await self._publish(1, {**base, "kind": "step_failed", "error": str(exc)[:300]})
            raise
        await self._publish(1, {**base, "kind": "step_completed"})
        return result
