"""Early-stopping majority votes over a run's k forks in one world
(``cohort.stop_when_decided``), with the rule of ``forklab.runtime.vote``: once the forks
that finished decide the majority, the forks after them change nothing and are not run.

The experiment starts fork f of a run in a world only when forks 0..f-1 have finished
and their majority is still open (forks below (k + 1) / 2 start at once: they cannot
decide it), so the forks it runs are exactly the first forks, in order, that a vote over
all k stops at. The baseline runs every fork: two of its forks' disagreement is the
noise floor, and stopping would bias it (a run whose first two forks agree would show no
third).

The rate test reads every world, the baseline too, *as voted* (``as_voted``): the forks
in order until the majority is decided, and the decided majority in place of the forks
after that. Both worlds of a run then go through the same function of their forks, so if
the world changes nothing the two voted rows are still exchangeable and the sign-flip
test keeps its error rate; the majority view is unchanged (a decided majority is the full
vote's). Pure.
"""

from __future__ import annotations

from forklab.experiments.cohort.matrix import FAILURE, MISSING, SAVED, SUCCESS
from forklab.runtime.vote import vote_decided


def first_deciding_fork(forks: int) -> int:
    """The first fork index whose start could follow a decided majority."""
    return (forks + 1) // 2


def vote_of(row: str, forks: int) -> bool | None:
    """The majority of ``forks`` from the outcomes in ``row`` so far, once decided."""
    return vote_decided(row.count(SUCCESS), row.count(FAILURE), forks)


def as_voted(row: str, forks: int) -> str:
    """``row`` as an early-stopping vote sees it: its outcomes in order until the majority
    is decided, then that majority for every later fork (run or saved). A row with a
    missing fork is left as it is (its run leaves every comparison)."""
    if MISSING in row:
        return row
    for i in range(len(row)):
        decided = vote_of(row[: i + 1], forks)
        if decided is not None:
            return row[: i + 1] + (SUCCESS if decided else FAILURE) * (len(row) - i - 1)
    return row


def saved_forks(rows: list[str]) -> int:
    return sum(row.count(SAVED) for row in rows)
