"""What one experiment run knows, in a few plain objects, and the rules over its progress.

``RunState`` is everything the workflow's handlers and views read: the stage, the plan,
the approval gate, the budget ledger and the work done so far — as a ``ProgressTally``
(what decisions and views need, of a size that does not grow with the chunks) plus the
records made since the last save, which go to the artifact store. The workflow mutates
it as activities return; nothing here talks to Temporal, so the rules are tested without
a server.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from activities.models import (
    BatchOutcome,
    BatchStatus,
    CleanupResult,
    EpisodeChunk,
    PrefixRef,
    PrefixResult,
    SaveProgressInput,
)
from experiments.spec import ExperimentSpec
from workflows.approval_gate import ApprovalGate, Moment
from workflows.budget_ledger import BudgetLedger
from workflows.messages import Plan, Stage, Status
from workflows.tally import ProgressTally

#: The slowdown key of prefix units in the budget ledger.
PREFIX = "prefix"
#: Records a run holds before it saves them mid-run: a record is ~350 bytes, so a save's
#: input stays ~350 KB whatever the history limit (a run of 40,000 events makes ~6,600).
SAVE_EVERY = 1000


@dataclass(frozen=True)
class Unit:
    """One sandbox's work: the prefixes of a chunk (``world`` None) or a world over it."""

    chunk: EpisodeChunk
    world: str | None = None

    @property
    def key(self) -> str:
        """The unit's name in the budget ledger (one reservation per unit)."""
        return f"{self.world or PREFIX}#{self.chunk.index}"

    @property
    def label(self) -> str:
        what = self.world or "prefixes"
        return f"{what} · episodes {self.chunk.first}..{self.chunk.stop - 1}"


@dataclass
class RunState:
    spec: ExperimentSpec
    gate: ApprovalGate
    ledger: BudgetLedger
    origin_run_id: str
    runs: int = 1
    status: Status = Status.running
    stage: Stage = Stage.starting
    message: str = "starting"
    error: str | None = None
    plan: Plan | None = None
    tally: ProgressTally = field(default_factory=ProgressTally)
    #: Records made since the last save (``unsaved``): at most the units of one run.
    new_prefixes: list[PrefixResult] = field(default_factory=list)
    new_batches: list[BatchOutcome] = field(default_factory=list)
    #: The prefix checkpoints of chunks this run may start world batches on: its own
    #: prefixes and the windows it loaded of earlier runs' (``load_prefix_refs``).
    refs: dict[int, PrefixRef] = field(default_factory=dict)
    cleanup: CleanupResult | None = None
    evidence_log: str | None = None

    def moment(self, now: datetime, fresh_nonce: str) -> Moment:
        """The run as the approval gate sees it at ``now``."""
        return Moment(
            now=now,
            status=self.status,
            stage=self.stage,
            fingerprint=self.plan.fingerprint if self.plan else None,
            experiment_id=self.spec.id,
            fresh_nonce=fresh_nonce,
        )

    @property
    def paces(self) -> dict[str, float]:
        """Per world, the slowest pace (seconds per episode) a completed batch ran at."""
        return {n: w.pace for n, w in self.tally.worlds.items() if w.pace is not None}

    # --- the work ---------------------------------------------------------------------
    def prefix_units(self) -> Iterator[Unit]:
        """The chunks whose prefixes did not run yet and that some world has not recorded
        (a prefix skipped for budget recorded its chunk as skipped for every world), made
        one at a time."""
        assert self.plan is not None
        done = self.tally.prefixes
        worlds = [self.tally.world(w.name).recorded for w in self.spec.worlds]
        start = max(done.first_missing(), min(w.first_missing() for w in worlds))
        return (
            Unit(c)
            for c in self.plan.capacity.chunks(start)
            if c.index not in done and not all(c.index in w for w in worlds)
        )

    def world_units(self) -> Iterator[Unit]:
        """Chunk-major: every world advances over the same episodes. Made one at a time,
        from the first chunk some world has not recorded."""
        assert self.plan is not None
        names = [w.name for w in self.spec.worlds]
        worlds = [self.tally.world(n).recorded for n in names]
        start = min(w.first_missing() for w in worlds)
        return (
            Unit(c, name)
            for c in self.plan.capacity.chunks(start)
            for name, recorded in zip(names, worlds, strict=True)
            if c.index not in recorded
        )

    def need(self, unit: Unit) -> float:
        """The reservation ``unit`` needs, from its rehearsed rate and the slowdown seen."""
        assert self.plan is not None
        rehearsal = self.plan.rehearsal
        if unit.world is None:
            if rehearsal.prefixes is not None:
                return 0.0  # run by the rehearsal: taking them over spends no compute
            return self.ledger.need(PREFIX, rehearsal.prefix_seconds_per_episode, unit.chunk.size)
        # Once a batch of this world completed, its own pace; until then the slowest any
        # world's batch ran at. Not another world's slowdown times this world's rehearsed
        # rate: rates are microsecond samples, and one caught in a stall of the machine
        # multiplied that world's reservation by the stall (under load a world was skipped
        # as over budget while its batches cost what the others' did).
        paces = self.paces
        pace = paces.get(unit.world, max(paces.values(), default=None))
        rate = rehearsal.world_seconds_per_episode[unit.world]
        return self.ledger.paced_need(rate, unit.chunk.size, pace)

    def blocked(self, unit: Unit) -> str | None:
        """Why ``unit`` cannot be useful any more (its chunk or world is already lost)."""
        if unit.world is None:
            return None
        if unit.chunk.index not in self.tally.prefixes:
            return "its episodes' prefixes did not run"
        stopped = self.tally.world(unit.world).stopped
        if stopped is not None:
            return f"the world is already {stopped.value}"
        return None

    def needs_refs(self, unit: Unit) -> bool:
        """Whether ``unit`` is a world batch whose chunk's checkpoints this run has not
        loaded (its prefix ran in an earlier run)."""
        return unit.world is not None and unit.chunk.index not in self.refs

    def skip(self, unit: Unit, reason: str) -> None:
        """Record ``unit`` as skipped: its world's batch, or every world's for a prefix
        (worlds that already recorded the chunk are left as they are)."""
        worlds = [unit.world] if unit.world else [w.name for w in self.spec.worlds]
        skipped = 0
        for world in worlds:
            skipped += self.record_batch(
                BatchOutcome(
                    world=world, chunk=unit.chunk, status=BatchStatus.skipped, error=reason
                )
            )
        self.ledger.skip(skipped)

    def record_prefix(self, prefix: PrefixResult) -> None:
        assert self.plan is not None
        self.new_prefixes.append(prefix)
        self.tally.add_prefix(prefix)
        self.refs[prefix.chunk.index] = prefix.ref()
        if not prefix.rehearsed:
            rate = self.plan.rehearsal.prefix_seconds_per_episode
            self.ledger.observe(PREFIX, prefix.seconds, rate, prefix.chunk.size)

    def record_batch(self, outcome: BatchOutcome) -> bool:
        """Record ``outcome``; False (nothing recorded) if its world already recorded its
        chunk."""
        if not self.tally.add_batch(outcome):
            return False
        self.new_batches.append(outcome)
        return True

    # --- the stored progress ----------------------------------------------------------
    @property
    def unsaved(self) -> int:
        """Records made since the last save."""
        return len(self.new_prefixes) + len(self.new_batches)

    def save_input(self) -> SaveProgressInput:
        """The records since the last save, to append to the stored progress."""
        assert self.plan is not None
        return SaveProgressInput(
            previous=self.tally.digest,
            chunks=self.plan.capacity.prefix_chunks,
            prefixes=sorted(self.new_prefixes, key=lambda p: p.chunk.index),
            batches=sorted(self.new_batches, key=lambda b: (b.chunk.index, b.world)),
        )

    def saved(self, digest: str, saved: SaveProgressInput) -> None:
        """``saved``'s records are stored under ``digest``: drop them from the run's memory,
        keeping those recorded while the save ran (the lists only grow at their end)."""
        self.tally.digest = digest
        del self.new_prefixes[: len(saved.prefixes)]
        del self.new_batches[: len(saved.batches)]
