"""What a run keeps of the progress so far: the little its decisions and views need.

The records themselves (one per prefix chunk and world batch) go to the artifact store
(``forklab.activities.experiment.progress``); a run holds only those it made since its last save.
What it decides with — which units are left, whether a world already stopped, each world's pace,
the counts the status shows — is kept here in a form whose size does not grow with the
chunks done: sets of chunk indices as sorted ``[first, stop)`` spans (chunks complete in
order, so a set is one span plus the few in flight), counts, and the first lines of what
was skipped. A continued run inherits it in its ``Carry``.
"""

from __future__ import annotations

from bisect import bisect_right

from pydantic import BaseModel, ConfigDict, Field

from forklab.contracts.experiment import (
    BatchOutcome,
    BatchStatus,
    LookResult,
    PrefixResult,
    WorldLook,
)
from forklab.experiments.experiment.waves import STOPS

#: Skipped batches the result lists (the stored progress has every one, and the budget
#: counts them all).
MAX_SKIPPED_LINES = 20


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _first(span: tuple[int, int]) -> int:
    return span[0]


class ChunkSet(Model):
    """A set of chunk indices as sorted, disjoint, non-adjacent ``[first, stop)`` spans."""

    spans: list[tuple[int, int]] = Field(default_factory=list)

    def __contains__(self, index: int) -> bool:
        at = bisect_right(self.spans, index, key=_first) - 1
        return at >= 0 and self.spans[at][0] <= index < self.spans[at][1]

    def add(self, index: int) -> None:
        if index in self:
            return
        at = bisect_right(self.spans, index, key=_first)  # the spans before: [0, at)
        first, stop = index, index + 1
        if at > 0 and self.spans[at - 1][1] == index:
            at -= 1
            first = self.spans.pop(at)[0]
        if at < len(self.spans) and self.spans[at][0] == stop:
            stop = self.spans.pop(at)[1]
        self.spans.insert(at, (first, stop))

    def count(self) -> int:
        return sum(stop - first for first, stop in self.spans)

    def first_missing(self) -> int:
        """The smallest index not in the set."""
        return self.spans[0][1] if self.spans and self.spans[0][0] == 0 else 0


class WorldTally(Model):
    """One world's batches so far."""

    recorded: ChunkSet = Field(default_factory=ChunkSet)
    completed: int = 0
    failed: int = 0
    skipped: int = 0
    #: The status of the world's first batch that did not complete: its later batches
    #: are not worth running.
    stopped: BatchStatus | None = None
    #: The slowest pace (seconds per episode) a completed batch of the world ran at.
    pace: float | None = None


class ProgressTally(Model):
    """The progress so far, compactly (see the module doc)."""

    #: The stored progress holding every record up to the last save (None: none yet).
    digest: str | None = None
    prefixes: ChunkSet = Field(default_factory=ChunkSet)
    worlds: dict[str, WorldTally] = Field(default_factory=dict)
    #: Sandboxes that ran (prefixes, and batches not skipped), and those of them that fell
    #: back from bubblewrap with a private network, with the first one's reason.
    sandboxes: int = 0
    fallbacks: int = 0
    fallback_note: str | None = None
    skipped_lines: list[str] = Field(default_factory=list)
    #: A sequential design's looks decided so far, in order; each holds the worlds that ran
    #: into it: a few KB for a few worlds, at most 50 looks × 31 worlds (~300 KB) at worst.
    looks: list[LookResult] = Field(default_factory=list)

    def world(self, name: str) -> WorldTally:
        return self.worlds.setdefault(name, WorldTally())

    def design_stop(self, name: str) -> WorldLook | None:
        """The look at which the sequential design stopped world ``name`` (None: it runs
        on, or there is no design)."""
        for look in reversed(self.looks):
            for w in look.worlds:
                if w.world == name:
                    return w if w.decision in STOPS else None
        return None

    def _ran(self, isolated: bool, note: str | None, confinement: str | None) -> None:
        self.sandboxes += 1
        if not isolated or confinement not in (None, "bubblewrap"):
            self.fallbacks += 1
            if self.fallback_note is None:
                self.fallback_note = note or "no reason given"

    def add_prefix(self, prefix: PrefixResult) -> None:
        self.prefixes.add(prefix.chunk.index)
        if not prefix.rehearsed:  # (one taken over from the rehearsal had no sandbox)
            self._ran(prefix.network_isolated, prefix.note, prefix.confinement)

    def add_batch(self, outcome: BatchOutcome, sandbox: bool = True) -> bool:
        """Count ``outcome`` (and its sandbox, with ``sandbox``: the worlds of a group
        share one); False (nothing counted) if its world already recorded its chunk."""
        w = self.world(outcome.world)
        if outcome.chunk.index in w.recorded:
            return False
        w.recorded.add(outcome.chunk.index)
        if outcome.status is BatchStatus.completed:
            w.completed += 1
            pace = outcome.seconds / max(outcome.chunk.size, 1)
            w.pace = max(w.pace or 0.0, pace)
        else:
            w.failed += int(outcome.status is BatchStatus.failed)
            w.skipped += int(outcome.status is BatchStatus.skipped)
            w.stopped = w.stopped or outcome.status
        if outcome.status is BatchStatus.skipped:
            if len(self.skipped_lines) < MAX_SKIPPED_LINES:
                c = outcome.chunk
                self.skipped_lines.append(
                    f"{outcome.world} episodes {c.first}..{c.stop - 1}: {outcome.error}"
                )
        elif sandbox:
            self._ran(outcome.network_isolated, outcome.note, outcome.confinement)
        return True
