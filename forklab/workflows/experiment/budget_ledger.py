"""The budget ledger: reservations, spend, concurrency and skips of one experiment.

A plain object over the serialisable ``BudgetUse`` (what status and result show) plus the
observed slowdowns, so the workflow's budget rules are tested without a server. The rule
it enforces: a unit of sandbox work starts only under an open *reservation* that fits in
what is left (``max − spent − reserved``) and only while fewer than
``max_concurrent_sandboxes`` reservations are open; when the unit ends, its reservation is
*settled*: released, and the seconds it spent charged (never more than it reserved, since
the reservation is also the unit's wall-clock limit).

A unit whose attempt died (worker killed, sandbox lost) has spent time nobody measured:
``charge_dead_attempt`` charges it to the open reservation, and ``renew`` tops the
reservation up again for the next attempt only if the budget still covers it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from forklab.experiments.experiment.budget import paced_reservation, revised_reservation, slowdown
from forklab.workflows.experiment.messages import BudgetUse


class Reservation(BaseModel):
    """One open reservation: the unit it pays for and the world-seconds it holds."""

    model_config = ConfigDict(extra="forbid")

    key: str
    seconds: float
    #: What the reservation held when it was opened (``renew`` restores this much).
    full: float


class BudgetRefused(Exception):
    """A reservation that does not fit: the message says how much was needed and left."""


class BudgetLedger:
    """Reservations, spend, concurrency and skips over one ``BudgetUse``."""

    def __init__(
        self, use: BudgetUse, safety_factor: float, slowdowns: dict[str, float] | None = None
    ) -> None:
        self.use = use
        self.safety_factor = safety_factor
        #: Per kind of unit ("prefix", "world"): how many times slower than rehearsed the
        #: slowest completed unit ran; later reservations of that kind grow accordingly.
        self.slowdowns: dict[str, float] = dict(slowdowns or {})
        self.open: dict[str, Reservation] = {}

    # --- questions --------------------------------------------------------------------
    def remaining(self) -> float:
        """World-seconds neither spent nor held by an open reservation."""
        u = self.use
        return u.max_world_seconds - u.spent_world_seconds - u.reserved_world_seconds

    @property
    def running(self) -> int:
        """Open reservations: units running (or about to) in a sandbox."""
        return len(self.open)

    def has_room(self) -> bool:
        """Whether one more unit may run now without exceeding the concurrency limit."""
        return self.running < self.use.max_concurrent_sandboxes

    def need(self, kind: str, rate: float, episodes: int) -> float:
        """The reservation a unit of ``kind`` over ``episodes`` needs: the rehearsed
        ``rate`` times the safety factor, grown by the slowdown seen so far."""
        return revised_reservation(self.safety_factor, rate, episodes, self.slowdowns.get(kind))

    def paced_need(self, rate: float, episodes: int, pace: float | None) -> float:
        """The reservation a unit over ``episodes`` needs when units like it were seen to
        run at ``pace`` seconds per episode (None: not seen yet; as rehearsed)."""
        return paced_reservation(self.safety_factor, rate, episodes, pace)

    def refusal(self, need: float) -> str | None:
        """Why a reservation of ``need`` cannot be opened now (None: it fits)."""
        left = self.remaining()
        if need > left:
            return f"budget: needs up to {need:.1f} world-seconds, {max(left, 0.0):.1f} left"
        return None

    # --- changes ----------------------------------------------------------------------
    def reserve(self, key: str, seconds: float) -> Reservation:
        """Open a reservation of ``seconds`` for the unit ``key``; raises ``BudgetRefused``
        when it does not fit, and ``ValueError`` when ``key`` already holds one."""
        if key in self.open:
            raise ValueError(f"unit {key} already holds a reservation")
        refusal = self.refusal(seconds)
        if refusal is not None:
            raise BudgetRefused(refusal)
        held = Reservation(key=key, seconds=seconds, full=seconds)
        self.open[key] = held
        self.use.reserved_world_seconds += seconds
        self.use.peak_concurrent_sandboxes = max(self.use.peak_concurrent_sandboxes, self.running)
        return held

    def settle(self, key: str, spent: float) -> float:
        """Close ``key``'s reservation; charge what the unit spent, at most what it held.
        Returns the seconds charged."""
        held = self.open.pop(key)
        charged = min(max(spent, 0.0), held.seconds)
        self.use.reserved_world_seconds -= held.seconds
        self.use.spent_world_seconds += charged
        return charged

    def charge_dead_attempt(self, key: str, seconds: float) -> float:
        """Charge ``seconds`` burnt by an attempt of ``key`` that died (at most what the
        reservation still holds); the reservation keeps only the rest. Returns the charge."""
        held = self.open[key]
        charged = min(max(seconds, 0.0), held.seconds)
        held.seconds -= charged
        self.use.reserved_world_seconds -= charged
        self.use.spent_world_seconds += charged
        return charged

    def renew(self, key: str) -> str | None:
        """Top ``key``'s reservation up to its full size for another attempt. Returns None
        when done, or why the budget cannot cover it (the reservation is then unchanged)."""
        held = self.open[key]
        top_up = held.full - held.seconds
        refusal = self.refusal(top_up)
        if refusal is not None:
            return refusal
        held.seconds = held.full
        self.use.reserved_world_seconds += top_up
        return None

    def skip(self, batches: int) -> None:
        """Count ``batches`` world batches that were skipped, never started."""
        self.use.skipped_batches += batches

    def forgo(self, episodes: int, seconds: float) -> None:
        """Count work a sequential design stopped before it started: ``episodes``
        world-episodes, worth ``seconds`` world-seconds, stay unspent."""
        self.use.unspent_world_episodes += episodes
        self.use.unspent_world_seconds += seconds

    def observe(self, kind: str, seconds: float, rate: float, episodes: int) -> None:
        """Record how a completed unit of ``kind`` ran against its rehearsed ``rate``."""
        seen = slowdown(seconds, rate, episodes)
        self.slowdowns[kind] = max(self.slowdowns.get(kind, 0.0), seen)
