"""Running one suite through ``braintrust.Eval`` and reading back which cases failed."""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import braintrust
from autoevals import ExactMatch
from braintrust.framework import EvalCase
from pydantic import BaseModel

PROJECT = "forklab-evals"


class Case(BaseModel):
    name: str
    input: dict[str, Any]
    expected: dict[str, Any]


class SuiteResult(BaseModel):
    suite: str
    cases: int
    failed: list[str]

    @property
    def passed(self) -> bool:
        return not self.failed


def run_suite(
    suite: str,
    cases: list[Case],
    task: Callable[[dict[str, Any]], dict[str, Any]],
    send: bool = False,
) -> SuiteResult:
    """Every case's ``task(input)`` must equal its ``expected`` (autoevals' ExactMatch).

    Sent, the suite goes through a private state whose logger flushes synchronously and
    raises: the SDK's shared logger drops a batch it cannot send, prints about it (with
    the server's words) and lets the run report an upload that never happened.

    The SDK's own output (a progress bar per suite, drawn with carriage returns, and a
    summary) is dropped: the caller prints one line per suite, and what goes wrong is
    raised, not printed."""
    state = _raising_state() if send else None
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        result = braintrust.Eval(
            PROJECT,
            experiment_name=suite,
            data=[
                EvalCase(input=c.input, expected=c.expected, metadata={"case": c.name})
                for c in cases
            ],
            task=task,
            scores=[ExactMatch],
            no_send_logs=not send,
            summarize_scores=False,
            state=state,
        )
        if state is not None:
            state.global_bg_logger().flush()  # raises when Braintrust did not take every row
    failed = [
        str(r.metadata.get("case")) if isinstance(r.metadata, Mapping) else repr(r.input)
        for r in result.results
        if r.error is not None or r.scores.get("ExactMatch") != 1
    ]
    return SuiteResult(suite=suite, cases=len(result.results), failed=failed)


def _raising_state() -> Any:
    """A ``BraintrustState`` whose HTTP logger raises instead of dropping a batch."""
    from braintrust.logger import BraintrustState, _HTTPBackgroundLogger

    state = BraintrustState()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated
    logger = state.global_bg_logger()
    if not isinstance(logger, _HTTPBackgroundLogger):
        raise TypeError("this braintrust SDK has no HTTP background logger to flush synchronously")
    logger.sync_flush = True
    logger.num_tries = 1
    return state
