"""How a failed attempt is charged and whether it may run again (no server needed)."""

from __future__ import annotations

from temporalio.api.enums.v1 import TimeoutType
from temporalio.exceptions import ApplicationError, TimeoutError

from forklab.workflows.experiment.attempts import failed_attempt
from forklab.workflows.experiment.budget_ledger import BudgetLedger
from forklab.workflows.experiment.messages import BudgetUse

LAG = 4.0


def timeout(*details: object) -> TimeoutError:
    return TimeoutError(
        "activity heartbeat timeout",
        type=TimeoutType.TIMEOUT_TYPE_HEARTBEAT,
        last_heartbeat_details=list(details),
    )


def test_a_worker_that_died_before_its_first_beat_spent_nothing() -> None:
    assert failed_attempt(timeout(), held=30.0, lag=LAG).burnt == 0.0


def test_a_box_that_dies_with_its_worker_is_charged_its_last_beat_plus_the_lag() -> None:
    failed = failed_attempt(timeout({"charged": 7.5, "dies_with_worker": True}), 30.0, LAG)
    assert (failed.burnt, failed.final) == (11.5, False)
    assert (
        failed_attempt(timeout({"charged": 29.0, "dies_with_worker": True}), 30.0, LAG).burnt
        == 30.0
    )


def test_a_box_that_may_outlive_its_worker_is_charged_its_whole_reservation() -> None:
    assert (
        failed_attempt(timeout({"charged": 1.0, "dies_with_worker": False}), 30.0, LAG).burnt
        == 30.0
    )
    assert (
        failed_attempt(timeout({"charged": "junk", "dies_with_worker": True}), 30.0, LAG).burnt
        == 30.0
    )
    unknown = ApplicationError("boom", type="RuntimeError")
    assert failed_attempt(unknown, 30.0, LAG).burnt == 30.0


def test_a_deterministic_failure_is_final() -> None:
    err = ApplicationError("bad", {"charged": 2.0, "dies_with_worker": True}, non_retryable=True)
    failed = failed_attempt(err, 30.0, LAG)
    assert failed.final and failed.burnt == 6.0


def test_a_dead_attempt_is_charged_then_the_reservation_renewed_in_full() -> None:
    ledger = BudgetLedger(BudgetUse(max_world_seconds=100, max_concurrent_sandboxes=2), 1.0)
    ledger.reserve("boost#0", 30.0)
    failed = failed_attempt(timeout({"charged": 10.0, "dies_with_worker": True}), 30.0, LAG)
    ledger.charge_dead_attempt("boost#0", failed.burnt)
    assert ledger.renew("boost#0") is None
    assert ledger.open["boost#0"].seconds == 30.0
    ledger.settle("boost#0", 12.0)
    assert ledger.use.spent_world_seconds == 14.0 + 12.0  # the dead attempt, then the live one
    assert ledger.use.reserved_world_seconds == 0.0
    # a second dead attempt the budget cannot cover again is refused, not run
    ledger.reserve("boost#1", 60.0)
    ledger.charge_dead_attempt("boost#1", 60.0)
    assert ledger.renew("boost#1") is not None


def test_the_failed_attempts_sandbox_is_named_when_its_last_beat_had_one() -> None:
    beat = {"charged": 2.0, "dies_with_worker": False, "sandbox_id": "sbx-1"}
    assert failed_attempt(timeout(beat), 30.0, LAG).sandbox_id == "sbx-1"
    assert failed_attempt(ApplicationError("x", beat), 30.0, LAG).sandbox_id == "sbx-1"
    assert failed_attempt(timeout({"charged": 1.0}), 30.0, LAG).sandbox_id is None
    assert failed_attempt(timeout(), 30.0, LAG).sandbox_id is None


def test_an_attempt_that_gave_up_waiting_for_a_store_is_charged_what_ran() -> None:
    """Waiting out a store outage is not compute: a settled beat (no sandbox running) is
    charged exactly, even from a backend whose boxes may outlive their worker."""
    for dies in (True, False):
        beat = {"charged": 2.5, "dies_with_worker": dies, "settled": True}
        err = ApplicationError("store unreachable", beat, type="StoreUnavailable")
        assert failed_attempt(err, 30.0, LAG).burnt == 2.5
    nan = {"charged": float("nan"), "dies_with_worker": True, "settled": True}
    assert failed_attempt(ApplicationError("x", nan), 30.0, LAG).burnt == 30.0
