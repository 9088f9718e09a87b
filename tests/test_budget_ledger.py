"""The budget ledger's rules, without a server: reservations, spend, concurrency, skips."""

from __future__ import annotations

import pytest

from forklab.experiments.experiment.budget import START_ALLOWANCE
from forklab.workflows.experiment.budget_ledger import BudgetLedger, BudgetRefused
from forklab.workflows.experiment.messages import BudgetUse


def ledger(max_seconds: float = 100.0, concurrent: int = 2, safety: float = 2.0) -> BudgetLedger:
    use = BudgetUse(max_world_seconds=max_seconds, max_concurrent_sandboxes=concurrent)
    return BudgetLedger(use, safety_factor=safety)


def test_a_reservation_holds_budget_until_settled_and_charges_at_most_itself() -> None:
    book = ledger()
    book.reserve("a", 30.0)
    assert book.remaining() == 70.0 and book.use.reserved_world_seconds == 30.0
    assert book.settle("a", 12.5) == 12.5
    assert book.remaining() == 87.5 and book.use.reserved_world_seconds == 0.0
    book.reserve("b", 10.0)
    assert book.settle("b", 99.0) == 10.0  # the reservation is also the unit's time limit
    assert book.use.spent_world_seconds == 22.5 and book.running == 0


def test_a_reservation_that_does_not_fit_is_refused_and_changes_nothing() -> None:
    book = ledger(max_seconds=50.0)
    book.reserve("a", 40.0)
    assert book.refusal(11.0) == "budget: needs up to 11.0 world-seconds, 10.0 left"
    assert book.refusal(10.0) is None
    with pytest.raises(BudgetRefused, match=r"needs up to 11\.0"):
        book.reserve("b", 11.0)
    assert book.running == 1 and book.use.reserved_world_seconds == 40.0
    with pytest.raises(ValueError, match="already holds"):
        book.reserve("a", 1.0)


def test_concurrency_counts_open_reservations_and_the_peak() -> None:
    book = ledger(concurrent=2)
    assert book.has_room()
    book.reserve("a", 1.0)
    book.reserve("b", 1.0)
    assert not book.has_room() and book.use.peak_concurrent_sandboxes == 2
    book.settle("a", 1.0)
    assert book.has_room() and book.running == 1
    assert book.use.peak_concurrent_sandboxes == 2


def test_a_dead_attempt_is_charged_and_a_renewal_needs_budget() -> None:
    book = ledger(max_seconds=30.0)
    book.reserve("a", 20.0)
    assert book.charge_dead_attempt("a", 15.0) == 15.0  # burnt by an attempt that died
    assert book.use.spent_world_seconds == 15.0 and book.use.reserved_world_seconds == 5.0
    refusal = book.renew("a")  # the next attempt needs 20 again, only 15 are left
    assert refusal == "budget: needs up to 15.0 world-seconds, 10.0 left"
    assert book.use.reserved_world_seconds == 5.0
    book2 = ledger(max_seconds=60.0)
    book2.reserve("a", 20.0)
    book2.charge_dead_attempt("a", 50.0)  # never more than the reservation held
    assert book2.use.spent_world_seconds == 20.0 and book2.use.reserved_world_seconds == 0.0
    assert book2.renew("a") is None and book2.use.reserved_world_seconds == 20.0
    assert book2.settle("a", 3.0) == 3.0
    assert book2.use.spent_world_seconds == 23.0 and book2.remaining() == 37.0


def test_slowdown_grows_later_reservations_of_the_same_kind_only() -> None:
    book = ledger(safety=2.0)
    planned = book.need("world", rate=0.01, episodes=100)
    assert planned == pytest.approx(2.0 * 0.01 * 100 + START_ALLOWANCE)
    book.observe("world", seconds=8.0, rate=0.01, episodes=100)  # 8x slower than rehearsed
    assert book.need("world", rate=0.01, episodes=100) == pytest.approx(2.0 * 8 * 0.01 * 100)
    assert book.need("prefix", rate=0.01, episodes=100) == pytest.approx(planned)
    book.observe("world", seconds=1.0, rate=0.01, episodes=100)  # faster: never shrinks
    assert book.slowdowns["world"] == pytest.approx(8.0)


def test_skips_are_counted() -> None:
    book = ledger()
    book.skip(3)
    book.skip(1)
    assert book.use.skipped_batches == 4
