"""What one experiment run knows, in a few plain objects, and the rules over its progress.

``RunState`` is everything the workflow's handlers and views read: the stage, the plan,
the approval gate, the budget ledger and the work done so far (prefix chunks and world
batches). The workflow mutates it as activities return; nothing here talks to Temporal,
so the rules are tested without a server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from activities.models import (
    BatchOutcome,
    BatchStatus,
    CleanupResult,
    EpisodeChunk,
    PrefixResult,
    Progress,
)
from experiments.spec import ExperimentSpec
from workflows.approval_gate import ApprovalGate, Moment
from workflows.budget_ledger import BudgetLedger
from workflows.messages import Plan, Stage, Status

#: The slowdown key of prefix units in the budget ledger.
PREFIX = "prefix"


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
    prefixes: dict[int, PrefixResult] = field(default_factory=dict)
    batches: dict[tuple[str, int], BatchOutcome] = field(default_factory=dict)
    cleanup: CleanupResult | None = None
    evidence_log: str | None = None
    #: Per world, the slowest pace (seconds per episode) a completed batch of it ran at;
    #: derived from ``batches``.
    paces: dict[str, float] = field(default_factory=dict)

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

    # --- the work ---------------------------------------------------------------------
    def chunks(self) -> list[EpisodeChunk]:
        assert self.plan is not None
        return self.plan.capacity.chunks

    def prefix_units(self) -> list[Unit]:
        return [Unit(c) for c in self.chunks() if c.index not in self.prefixes]

    def world_units(self) -> list[Unit]:
        """Chunk-major: every world advances over the same episodes."""
        names = [w.name for w in self.spec.worlds]
        return [
            Unit(c, name)
            for c in self.chunks()
            for name in names
            if (name, c.index) not in self.batches
        ]

    def need(self, unit: Unit) -> float:
        """The reservation ``unit`` needs, from its rehearsed rate and the slowdown seen."""
        assert self.plan is not None
        rehearsal = self.plan.rehearsal
        if unit.world is None:
            return self.ledger.need(PREFIX, rehearsal.prefix_seconds_per_episode, unit.chunk.size)
        # Once a batch of this world completed, its own pace; until then the slowest any
        # world's batch ran at. Not another world's slowdown times this world's rehearsed
        # rate: rates are microsecond samples, and one caught in a stall of the machine
        # multiplied that world's reservation by the stall (under load a world was skipped
        # as over budget while its batches cost what the others' did).
        pace = self.paces.get(unit.world, max(self.paces.values(), default=None))
        rate = rehearsal.world_seconds_per_episode[unit.world]
        return self.ledger.paced_need(rate, unit.chunk.size, pace)

    def blocked(self, unit: Unit) -> str | None:
        """Why ``unit`` cannot be useful any more (its chunk or world is already lost)."""
        if unit.world is None:
            return None
        if unit.chunk.index not in self.prefixes:
            return "its episodes' prefixes did not run"
        for (world, _), outcome in self.batches.items():
            if world == unit.world and outcome.status is not BatchStatus.completed:
                return f"the world is already {outcome.status.value}"
        return None

    def skip(self, unit: Unit, reason: str) -> None:
        """Record ``unit`` as skipped: its world's batch, or every world's for a prefix."""
        worlds = [unit.world] if unit.world else [w.name for w in self.spec.worlds]
        for world in worlds:
            self.batches[(world, unit.chunk.index)] = BatchOutcome(
                world=world, chunk=unit.chunk, status=BatchStatus.skipped, error=reason
            )
        self.ledger.skip(len(worlds))

    def record_prefix(self, prefix: PrefixResult) -> None:
        assert self.plan is not None
        self.prefixes[prefix.chunk.index] = prefix
        rate = self.plan.rehearsal.prefix_seconds_per_episode
        self.ledger.observe(PREFIX, prefix.seconds, rate, prefix.chunk.size)

    def record_batch(self, outcome: BatchOutcome) -> None:
        self.batches[(outcome.world, outcome.chunk.index)] = outcome
        self._observe(outcome)

    def _observe(self, outcome: BatchOutcome) -> None:
        if outcome.status is BatchStatus.completed:
            pace = outcome.seconds / max(outcome.chunk.size, 1)
            self.paces[outcome.world] = max(self.paces.get(outcome.world, 0.0), pace)

    def progress_record(self) -> Progress:
        return Progress(
            chunks=len(self.chunks()),
            prefixes=[self.prefixes[i] for i in sorted(self.prefixes)],
            batches=[self.batches[k] for k in sorted(self.batches, key=lambda k: (k[1], k[0]))],
        )

    def restore(self, progress: Progress) -> None:
        self.prefixes = {p.chunk.index: p for p in progress.prefixes}
        self.batches = {(b.world, b.chunk.index): b for b in progress.batches}
        self.paces = {}
        for outcome in progress.batches:
            self._observe(outcome)
