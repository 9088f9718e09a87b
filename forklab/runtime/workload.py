"""The workload API: a deterministic agent + environment over a JSON-serialisable dict.

A workload class is instantiated once per experiment with its validated params and
then drives every episode. State is a plain ``dict`` of JSON values that the methods
mutate in place; the fork engine copies it through canonical JSON, so anything that is
not JSON (sets, tuples, objects) is not allowed in state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from forklab.runtime.crn import Block, Shocks

if TYPE_CHECKING:
    from pathlib import Path  # (a box imports this file: no ``pathlib`` at run time)

State = dict[str, Any]
#: A feature value; ``None`` only for a feature declared optional (e.g. ``str | None``).
Feature = bool | int | float | str | None
#: One field of many episodes' states, one entry per episode, for the optional batch
#: methods: a one-dimensional numpy array of bool, int or float on the local twin. This
#: file runs in sandboxes, where numpy is not installed, so the type cannot be named
#: here; a workload uses the arrays only through their operators and indexing
#: (``a & b``, ``~a``, ``a += m``, ``a[m] = b[m]``) and imports nothing for them.
Column = Any
#: Many episodes of one world: the workload's own fields, each a ``Column`` of equal length.
Columns = dict[str, Column]


class WorkloadError(ValueError):
    """Bad params or intervention for a workload. ``field`` names what to fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class Workload:
    """Base class for workloads. Subclass it and override the methods marked below.

    Life of an episode: ``initial_state`` → ``step`` until ``cursor(state) ==
    boundary(state)`` (the prefix, run once) → checkpoint → per world: ``intervene``
    → ``step`` until ``done`` → ``outcome`` (True means the episode succeeded).
    """

    #: Registered name, e.g. ``"counter-recovery"``.
    name: ClassVar[str] = ""
    #: Params and their defaults; a spec may only set keys listed here.
    default_params: ClassVar[Mapping[str, Any]] = {}
    #: Intervention names and their default params (``intervene`` gets these defaults
    #: overlaid with the spec's params).
    interventions: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    #: Every feature ``features`` returns and its type: bool, int, float or str, or one of
    #: them ``| None`` for a feature that may have no value in some episodes.
    feature_types: ClassVar[Mapping[str, Any]] = {}
    #: Longest continuation, in steps, a world may take before it is declared stuck.
    max_steps: ClassVar[int] = 100_000
    #: True when an episode's state includes files (a workspace): the runner then gives
    #: each episode its own folder, ``self.workspace``, empty at ``initial_state``; the
    #: prefix writes there, the folder is frozen with the checkpoint at the boundary, and
    #: every world continues in its own copy-on-write view of it (docs/workspaces.md).
    has_workspace: ClassVar[bool] = False
    #: The folder of the episode (or world replicate) being run, while a method runs;
    #: None for a workload without ``has_workspace``.
    workspace: Path | None = None

    def __init__(self, params: Mapping[str, Any] | None = None) -> None:
        params = dict(params or {})
        unknown = sorted(set(params) - set(self.default_params))
        if unknown:
            known = ", ".join(sorted(self.default_params)) or "none"
            raise WorkloadError(
                f"workload.params.{unknown[0]}",
                f"unknown param for workload {self.name}; known params: {known}",
            )
        self.params: dict[str, Any] = {**self.default_params, **params}
        self.check_params()

    def check_params(self) -> None:
        """Raise ``WorkloadError`` naming the param when ``self.params`` is invalid."""

    def intervention_params(self, name: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """Validate an intervention and return its params merged with the defaults."""
        if name not in self.interventions:
            known = ", ".join(sorted(self.interventions)) or "none"
            raise WorkloadError(
                "intervention.name",
                f"unknown intervention {name!r} for workload {self.name}; choose one of: {known}",
            )
        defaults = self.interventions[name]
        unknown = sorted(set(params) - set(defaults))
        if unknown:
            raise WorkloadError(
                f"intervention.params.{unknown[0]}",
                f"unknown param for intervention {name}; known: {', '.join(defaults) or 'none'}",
            )
        return {**defaults, **params}

    # --- to override -------------------------------------------------------------
    def initial_state(self, episode_seed: int, shocks: Shocks) -> State:
        raise NotImplementedError

    def boundary(self, state: State) -> int:
        """The requested fork boundary (a cursor value) for this episode."""
        raise NotImplementedError

    def cursor(self, state: State) -> int:
        """Where the episode is: a counter that grows by at least one per ``step``."""
        raise NotImplementedError

    def step(self, state: State, shocks: Shocks) -> None:
        raise NotImplementedError

    def done(self, state: State) -> bool:
        raise NotImplementedError

    def outcome(self, state: State) -> bool:
        raise NotImplementedError

    def schedule_shocks(self, state: State, shocks: Shocks) -> None:
        """Draw the episode's exogenous shocks that lie after the boundary (optional).

        Called in every world on the checkpoint, before any intervention. Each world
        reports a fingerprint of every exogenous draw it made; a world that ends
        earlier than another would otherwise have drawn fewer shocks. Drawing the
        whole schedule here makes the fingerprints comparable (the values are memoised,
        so ``step`` sees the very same numbers). Workloads that draw every shock of
        every tick unconditionally need not override this.
        """

    def world_blocks(self, state: State) -> Sequence[tuple[Block[Any], int, int]]:
        """The block runs ``(block, start, stop)`` every world will draw with
        ``shocks.exogenous_blocks`` when continued from this checkpoint state (optional).

        A hint for speed only. On the durable path each world runs in a process of its
        own, which would work out the episode's runs again for every world; with this
        hint a world group's sandbox works them out once per episode before it forks its
        worlds (``forklab.runtime.world_group``). A world still asks for whatever it
        draws: a run it asks for that the hint did not name is made as usual, and a named
        run it never asks for is never used, so a wrong hint costs time, never a result.
        Default: none (nothing is worked out ahead).
        """
        return ()

    def features(self, state: State) -> dict[str, Feature]:
        """Pre-decision features, read at the boundary before any intervention: exactly
        the names of ``feature_types``, every episode."""
        return {}

    def intervene(self, state: State, name: str, params: Mapping[str, Any], shocks: Shocks) -> None:
        raise NotImplementedError

    # --- optional: many episodes of one world at once (the local twin only) ---------
    # A workload may also simulate a whole chunk of episodes at once, over columns
    # (docs/workloads.md, "Optional: batch methods"). Nothing here is required: without
    # ``batch_ok`` the twin runs the methods above, episode by episode, as sandboxes
    # always do. The batch methods must give exactly what those give, episode by
    # episode; they count only for the class that defines ``batch_ok`` (a subclass that
    # overrides any workload method without defining ``batch_ok`` again runs the scalar
    # methods), and the twin compares a few episodes of every chunk with the scalar
    # methods and refuses the run when they differ.

    def batch_ok(self) -> bool:
        """True when, with these params, the batch methods stand for the methods above
        and no run draws any randomness from ``shocks`` (batch methods get none: their
        worlds report no shock fingerprint). Default False: the scalar methods run."""
        return False

    def batch_initial(self, episode_seeds: Sequence[int]) -> Mapping[str, Sequence[Any] | Any]:
        """``initial_state`` of every episode seed, as fields: each a sequence of bool, int
        or float with one entry per seed, or one such value shared by every episode."""
        raise NotImplementedError

    def batch_boundary(self, cols: Columns) -> Column | int:
        """``boundary`` of every episode (an int column, or one int for all)."""
        raise NotImplementedError

    def batch_cursor(self, cols: Columns) -> Column | int:
        """``cursor`` of every episode (an int column, or one int for all)."""
        raise NotImplementedError

    def batch_done(self, cols: Columns) -> Column | bool:
        """``done`` of every episode (a bool column, or one bool for all)."""
        raise NotImplementedError

    def batch_step(self, cols: Columns, active: Column) -> None:
        """``step`` every episode where the bool column ``active`` is True, in place; the
        others must not change."""
        raise NotImplementedError

    def batch_intervene(
        self, cols: Columns, name: str, params: Mapping[str, Any], where: Column
    ) -> None:
        """``intervene`` in every episode where the bool column ``where`` is True."""
        raise NotImplementedError

    def batch_outcome(self, cols: Columns) -> Column | bool:
        """``outcome`` of every episode (a bool column, or one bool for all)."""
        raise NotImplementedError

    def batch_state(self, cols: Columns, index: int) -> State:
        """Episode ``index``'s state as the scalar methods hold it (the checkpoint is its
        canonical JSON, and ``features`` reads it): plain Python values, no numpy."""
        raise NotImplementedError
