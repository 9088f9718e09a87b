"""Which of the parent's recorded calls a fork's call is: matched by what the call is,
not by when it happened.

A workflow that fans out (``asyncio.gather`` over activities, a research bot's parallel
searches, a DSL's parallel branches) schedules its calls in code order and sees them
complete in another. Steps are numbered in completion order (``steps.py``), so "the
fork's k-th call" and "the parent's step k" are not the same call. A call is therefore
identified by its **key**: its activity type, the sha256 of its input, and its
**ordinal** — it is the k-th call with that type and input the run scheduled (two
identical searches in one level are told apart by the order the code scheduled them,
which a deterministic workflow repeats). Under an ``approximate`` boundary inputs may
drift, so the key drops the digest and the ordinal counts calls of the type.

A fork at step N inherits the parent's steps 1..N (the first N calls to complete). The
parent's calls that were still running at that point (``in_flight``: scheduled before
the N-th completion, completed after it or never) run live on the fork, like everything
after the boundary. Any other call the fork makes before it has asked for every
inherited one is not the parent's: the prefix diverged.

Pure: the fork interceptor keeps one :class:`PrefixMatcher` per fork run.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from forklab.experiments.runfork.steps import Step


class CallKey(NamedTuple):
    activity_type: str
    #: "" under an approximate boundary (inputs may drift)
    input_sha256: str
    #: 1 for the first call of this type (and input) the run scheduled, 2 for the next, …
    ordinal: int


def call_position(step: Step) -> int:
    """Where ``step`` came in its run's scheduling order (records made before positions
    were recorded are numbered in step order, which was then the scheduling order)."""
    return step.call if step.call is not None else step.index


def keyed(steps: list[Step], with_input: bool) -> dict[CallKey, Step]:
    """``steps`` (the calls of one run, or a part of them) by key, ordinals counted in
    scheduling order."""
    seen: Counter[tuple[str, str]] = Counter()
    out: dict[CallKey, Step] = {}
    for s in sorted(steps, key=call_position):
        what = (s.activity_type, s.input_sha256 if with_input else "")
        seen[what] += 1
        out[CallKey(*what, seen[what])] = s
    return out


def in_flight(steps: list[Step], at_step: int) -> list[Step]:
    """The calls after step ``at_step`` a fork may make before it has asked for all of
    steps 1..at_step: those the parent scheduled by the time ``at_step`` calls had
    completed. Results stripped: they run live (or by policy), never served from here."""
    return [
        s.model_copy(update={"result_b64": None})
        for s in steps
        if s.index > at_step and s.scheduled_after is not None and s.scheduled_after <= at_step
    ]


class Divergence(ValueError):
    """A fork's call that is neither inherited nor one the parent had in flight at the
    boundary, made while inherited calls are still owed. The message names the step."""


def stalled_message(step: Step) -> str:
    """Why a fork that never asks for inherited ``step`` cannot reach its fork point."""
    return (
        f"at step {step.index} ({step.activity_type}) the parent had made this call by now "
        "and the fork has nothing left to wait for without it: its code took another path "
        "before the fork point"
    )


class PrefixMatcher:
    """The inherited steps of one fork, handed out by key, and delivered in the parent's
    completion order."""

    def __init__(self, prefix: list[Step], flying: list[Step], exact: bool) -> None:
        self.exact = exact
        # the whole run's ordinals: inherited and in-flight calls interleave
        both = keyed([*prefix, *flying], with_input=exact)
        inherited_ids = {id(s) for s in prefix}
        self._owed = {k: s for k, s in both.items() if id(s) in inherited_ids}
        self._owed_at = {s.index: k for k, s in self._owed.items()}
        self._flying = {k for k, s in both.items() if id(s) not in inherited_ids}
        self._ranks = sorted(s.index for s in prefix)
        self._delivered = 0
        self._seen: Counter[tuple[str, str]] = Counter()
        #: inherited steps asked for plus results handed over: moves whenever the fork
        #: gets nearer its fork point
        self.progress = 0

    def key(self, activity_type: str, input_sha256: str) -> CallKey:
        """The key of the fork's next call of this type and input (counts it)."""
        what = (activity_type, input_sha256 if self.exact else "")
        self._seen[what] += 1
        return CallKey(*what, self._seen[what])

    @property
    def owed(self) -> int:
        """Inherited steps the fork has not asked for yet."""
        return len(self._owed)

    def first_owed(self) -> Step | None:
        """The earliest inherited step the fork has not asked for (None: it asked for
        all)."""
        return min(self._owed.values(), key=lambda s: s.index, default=None)

    def take(self, key: CallKey) -> Step | None:
        """The inherited step with this key (once), or None."""
        step = self._owed.pop(key, None)
        if step is not None:
            del self._owed_at[step.index]
            self.progress += 1
        return step

    def check_live(self, key: CallKey) -> None:
        """Raise :class:`Divergence` unless a call with ``key`` that is not inherited may
        run now: every inherited step was asked for, or the parent had it in flight."""
        if not self._owed or key in self._flying:
            return
        # name the inherited step the fork most likely meant: the first owed one of the
        # same type, else the first owed one
        owed = sorted(self._owed.values(), key=lambda s: s.index)
        same = [s for s in owed if s.activity_type == key.activity_type]
        if same and self.exact:
            raise Divergence(
                f"at step {same[0].index} ({key.activity_type}) the fork's input differs "
                "from the parent's (an exact boundary inherits only identical calls)"
            )
        if same:
            raise Divergence(
                f"at step {same[0].index} ({key.activity_type}) the fork makes more calls "
                "of that type than the parent had made by then"
            )
        s = owed[0]
        raise Divergence(
            f"at step {s.index} the parent called {s.activity_type} "
            f"and the fork calls {key.activity_type}"
        )

    def turn_of(self, step: Step) -> bool:
        """Whether ``step`` is the next inherited step in the parent's completion order."""
        return self._delivered < len(self._ranks) and self._ranks[self._delivered] == step.index

    def delivered(self) -> None:
        self._delivered += 1
        self.progress += 1

    def next_unasked(self) -> Step | None:
        """The inherited step whose result is to be handed over next, while the fork has
        not asked for it yet (None: it has, or every result was handed over). A fork of
        the parent's code asks for it as soon as the results before it have arrived; one
        that has nothing else to wait for and still does not ask never will."""
        if self.all_delivered:
            return None
        key = self._owed_at.get(self._ranks[self._delivered])
        return self._owed[key] if key is not None else None

    @property
    def last_handed_over(self) -> int | None:
        """The last inherited step handed over (None: none yet)."""
        return self._ranks[self._delivered - 1] if self._delivered else None

    @property
    def all_delivered(self) -> bool:
        """Every inherited step has been handed over: the fork is at its fork point."""
        return self._delivered == len(self._ranks)
