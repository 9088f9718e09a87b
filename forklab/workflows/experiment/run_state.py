"""What one experiment run knows, in a few plain objects, and the rules over its progress.

``RunState`` is everything the workflow's handlers and views read: the stage, the plan,
the approval gate, the budget ledger and the work done so far — as a ``ProgressTally``
(what decisions and views need, of a size that does not grow with the chunks) plus the
records made since the last save, which go to the artifact store. The workflow mutates
it as activities return; nothing here talks to Temporal, so the rules are tested without
a server.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from forklab.contracts.experiment import (
    BatchOutcome,
    BatchStatus,
    CleanupResult,
    EpisodeChunk,
    GroupOutcome,
    LookResult,
    PrefixRef,
    PrefixResult,
    SaveProgressInput,
)
from forklab.experiments.experiment.spec import ExperimentSpec, Role
from forklab.experiments.experiment.waves import STOPS
from forklab.workflows.experiment.approval_gate import ApprovalGate, Moment
from forklab.workflows.experiment.budget_ledger import BudgetLedger
from forklab.workflows.experiment.messages import Plan, Stage, Status
from forklab.workflows.experiment.tally import ProgressTally

#: The slowdown key of prefix units in the budget ledger.
PREFIX = "prefix"
#: Records a run holds before it saves them mid-run: a record is ~350 bytes, so a save's
#: input stays ~350 KB whatever the history limit (a run of 40,000 events makes ~6,600).
SAVE_EVERY = 1000


@dataclass(frozen=True)
class Unit:
    """One sandbox's work: the prefixes of a chunk (no ``worlds``) or a group of worlds
    over it, each world in a process of its own (``forklab.runtime.world_group``)."""

    chunk: EpisodeChunk
    worlds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.worlds, tuple):  # a str would be taken as its letters
            raise TypeError("a unit's worlds are a tuple of world names")

    @property
    def key(self) -> str:
        """The unit's name in the budget ledger (one reservation per unit)."""
        return f"{'+'.join(self.worlds) or PREFIX}#{self.chunk.index}"

    @property
    def label(self) -> str:
        what = ", ".join(self.worlds) or "prefixes"
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
    #: each judged world's verdict, once the analysis is done (``AnalysisResult.verdicts``)
    verdicts: list[str] = field(default_factory=list)

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
    def _chunks(self, start: int, wave: int | None) -> Iterator[EpisodeChunk]:
        """The plan's chunks from ``start`` on; with ``wave``, only that wave's."""
        assert self.plan is not None
        capacity = self.plan.capacity
        if wave is None:
            return capacity.chunks(start)
        first, stop = capacity.wave(wave)
        return (capacity.chunk(i) for i in range(max(start, first), stop))

    def prefix_units(self, wave: int | None = None) -> Iterator[Unit]:
        """The chunks (of ``wave``, if given) whose prefixes did not run yet and that some
        world has not recorded (a prefix skipped for budget recorded its chunk as skipped
        for every world), made one at a time."""
        done = self.tally.prefixes
        worlds = [self.tally.world(w.name).recorded for w in self.spec.worlds]
        start = max(done.first_missing(), min(w.first_missing() for w in worlds))
        return (
            Unit(c)
            for c in self._chunks(start, wave)
            if c.index not in done and not all(c.index in w for w in worlds)
        )

    def world_units(self, wave: int | None = None) -> Iterator[Unit]:
        """Chunk-major: every world advances over the same episodes. For each chunk (of
        ``wave``, if given), the worlds that have not recorded it, in groups of
        ``group_size`` (spec order). Made one at a time, from the first chunk some world
        has not recorded. A world its sequential design stopped is not among them, nor the
        baseline once no other world runs."""
        assert self.plan is not None
        running = self.design_running()
        names = [w.name for w in self.spec.worlds if w.name in running]
        worlds = [self.tally.world(n).recorded for n in names]
        start = min((w.first_missing() for w in worlds), default=0)
        size = self.group_size()
        for c in self._chunks(start, wave):
            left = tuple(
                n for n, recorded in zip(names, worlds, strict=True) if c.index not in recorded
            )
            for i in range(0, len(left), size):
                yield Unit(c, left[i : i + size])

    def live_worlds(self) -> list[str]:
        """The worlds other than the baseline that may still run: none of their batches
        (nor the baseline's) failed or was skipped, and their sequential design has not
        stopped them."""
        if self.tally.world(self.spec.baseline.name).stopped is not None:
            return []  # no pairs without the baseline: nothing left to decide
        return [
            w.name
            for w in self.spec.worlds
            if w.role is not Role.baseline
            and self.tally.world(w.name).stopped is None
            and self.tally.design_stop(w.name) is None
        ]

    def design_running(self) -> set[str]:
        """The worlds a sequential design still runs: the live ones, and the baseline
        while any of them runs (every pair needs it). Every world without a design."""
        if self.spec.analysis.sequential is None:
            return {w.name for w in self.spec.worlds}
        live = set(self.live_worlds())
        return live | {self.spec.baseline.name} if live else live

    def record_look(self, result: LookResult) -> None:
        """Record a look's decisions. A world stopped here starts no more work: the
        world-episodes it leaves and what they would cost at its own pace are counted
        unspent; so are the baseline's once no other world runs."""
        assert self.plan is not None
        self.tally.looks.append(result)
        episodes = self.spec.episodes
        stopped = [(w.world, w.episodes) for w in result.worlds if w.decision in STOPS]
        base = self.spec.baseline.name
        if not self.live_worlds() and result.worlds and self.tally.world(base).stopped is None:
            end = max(w.episodes for w in result.worlds)
            if end < episodes:
                stopped.append((base, end))
        rates = self.plan.rehearsal.world_seconds_per_episode
        for world, ran in stopped:
            pace = self.tally.world(world).pace
            left = episodes - ran
            self.ledger.forgo(left, left * (pace if pace is not None else rates.get(world, 0.0)))

    def group_size(self) -> int:
        """How many worlds of a chunk share one sandbox. As many as keep every slot busy:
        all of them when the chunks alone fill the ``max_concurrent_sandboxes``, fewer
        when an experiment has fewer chunks than slots. One, for a workload with files
        (a sandbox's workspace is one world's copy-on-write view)."""
        assert self.plan is not None
        worlds = len(self.spec.worlds)
        if self.plan.rehearsal.workspace:
            return 1
        slots = self.spec.budget.max_concurrent_sandboxes
        groups = min(worlds, max(1, math.ceil(slots / max(self.plan.capacity.prefix_chunks, 1))))
        return math.ceil(worlds / groups)

    def need(self, unit: Unit) -> float:
        """The reservation ``unit`` needs, from its rehearsed rate and the slowdown seen."""
        assert self.plan is not None
        rehearsal = self.plan.rehearsal
        if not unit.worlds:
            if rehearsal.prefixes is not None:
                return 0.0  # run by the rehearsal: taking them over spends no compute
            return self.ledger.need(PREFIX, rehearsal.prefix_seconds_per_episode, unit.chunk.size)
        return sum(self.shares(unit))

    def shares(self, unit: Unit) -> list[float]:
        """Each world's share of a group's reservation, in its order (each its own limit
        in the sandbox).

        Once a batch of the world completed, its own pace; until then the slowest any
        world's batch ran at. Not another world's slowdown times this world's rehearsed
        rate: rates are microsecond samples, and one caught in a stall of the machine
        multiplied that world's reservation by the stall (under load a world was skipped
        as over budget while its batches cost what the others' did)."""
        assert self.plan is not None
        paces = self.paces
        slowest = max(paces.values(), default=None)
        rates = self.plan.rehearsal.world_seconds_per_episode
        return [
            self.ledger.paced_need(rates[world], unit.chunk.size, paces.get(world, slowest))
            for world in unit.worlds
        ]

    def blocked(self, unit: Unit) -> str | None:
        """Why ``unit`` cannot be useful any more (its chunk, or every world of it, is
        already lost); a group some of whose worlds stopped runs without them
        (``without_stopped``)."""
        if not unit.worlds:
            return None
        if unit.chunk.index not in self.tally.prefixes:
            return "its episodes' prefixes did not run"
        stopped = [self.tally.world(w).stopped for w in unit.worlds]
        if None in stopped:
            return None
        if len(stopped) == 1:
            return f"the world is already {stopped[0]}"
        return "every world of the group is already failed or skipped"

    def without_stopped(self, unit: Unit) -> Unit:
        """``unit`` without the worlds that already stopped, each of whose batches of the
        chunk is recorded as skipped (not worth running)."""
        live = []
        for world in unit.worlds:
            stopped = self.tally.world(world).stopped
            if stopped is None:
                live.append(world)
            else:
                self.skip(Unit(unit.chunk, (world,)), f"the world is already {stopped.value}")
        return Unit(unit.chunk, tuple(live)) if len(live) < len(unit.worlds) else unit

    def needs_refs(self, unit: Unit) -> bool:
        """Whether ``unit`` is a world batch whose chunk's checkpoints this run has not
        loaded (its prefix ran in an earlier run)."""
        return bool(unit.worlds) and unit.chunk.index not in self.refs

    def skip(self, unit: Unit, reason: str) -> None:
        """Record ``unit`` as skipped: its worlds' batches, or every world's for a prefix
        (worlds that already recorded the chunk are left as they are)."""
        worlds = list(unit.worlds) or [w.name for w in self.spec.worlds]
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

    def record_batch(self, outcome: BatchOutcome, sandbox: bool = True) -> bool:
        """Record ``outcome``; False (nothing recorded) if its world already recorded its
        chunk. ``sandbox``: count its sandbox (a group's is counted with its first world)."""
        if not self.tally.add_batch(outcome, sandbox):
            return False
        self.new_batches.append(outcome)
        return True

    def record_group(self, group: GroupOutcome) -> None:
        """Record each world's outcome of a group's sandbox."""
        for index, outcome in enumerate(group.outcomes):
            self.record_batch(outcome, sandbox=index == 0)

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
