"""How long one run of the experiment's chain may grow before it continues as new.

A run's history grows by a few events per sandbox unit (prefix chunk or world batch), so
an experiment of many chunks would pass Temporal's limits in one run. The workflow keeps
each run under ``ExperimentInput.history_events``: it starts a unit only while the run
can still take that unit, drain the ones in flight, and then either continue as new or
finish (cleanup, analysis, readout, ledger) below the limit. Pure, so it is tested
without a server.
"""

from __future__ import annotations

#: The most events one unit adds: its activity's scheduled, started and completed events
#: and the workflow task (scheduled, started, completed) that takes its result. One task
#: often takes several results, so this is an upper bound.
EVENTS_PER_UNIT = 6
#: The most events a run records after its last unit: saving the progress and
#: continuing as new (7), or the final stages — cleanup, the progress record, analysis,
#: readout, ledger and evidence log (six activities of at most six events each), the
#: stages' search attributes and the completion; rounded up.
CLOSING_EVENTS = 64
#: The most events a sequential design's look adds after its wave's units: saving the
#: progress and the look's activity (six events each), rounded up. A run of such a design
#: keeps them free beside every unit it starts.
LOOK_EVENTS = 14
#: The most chunks' prefix checkpoints a run loads at once (``refs_window``): ~150 bytes
#: each, so one load stays ~150 KiB, far under Temporal's 2 MiB payload limit.
MAX_REFS = 1024


def room_for_unit(events: int, running: int, limit: int) -> bool:
    """Whether a run at ``events`` with ``running`` units in flight can start one more unit
    and still drain and close under ``limit``."""
    return events + EVENTS_PER_UNIT * (running + 1) + CLOSING_EVENTS < limit


def refs_window(events: int, limit: int, worlds: int) -> int:
    """How many chunks' prefix checkpoints a run at ``events`` loads at once: as many as
    it can still start world batches on (chunk-major, ``worlds`` a chunk) before its
    history is full, at least one and at most ``MAX_REFS``. So the load's size depends
    on the history limit, never on the experiment's size."""
    units = max(limit - events - CLOSING_EVENTS, 0) // EVENTS_PER_UNIT
    return max(1, min(MAX_REFS, units // max(worlds, 1) + 1))
