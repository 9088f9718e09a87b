"""The workload API: a deterministic agent + environment over a JSON-serialisable dict.

A workload class is instantiated once per experiment with its validated params and
then drives every episode. State is a plain ``dict`` of JSON values that the methods
mutate in place; the fork engine copies it through canonical JSON, so anything that is
not JSON (sets, tuples, objects) is not allowed in state.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from experiments.runtime.crn import Shocks

State = dict[str, Any]
#: A feature value; ``None`` only for a feature declared optional (e.g. ``str | None``).
Feature = bool | int | float | str | None


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

    def features(self, state: State) -> dict[str, Feature]:
        """Pre-decision features, read at the boundary before any intervention: exactly
        the names of ``feature_types``, every episode."""
        return {}

    def intervene(self, state: State, name: str, params: Mapping[str, Any], shocks: Shocks) -> None:
        raise NotImplementedError
