"""Rehearsal outcomes: every world of a spec on the local twin. The files' code digest is
given by the caller (``forklab/rehearsal.py`` reads them)."""

from __future__ import annotations

from experiments.engine import run_twin
from experiments.outcomes import ExperimentOutcomes, from_batch
from experiments.spec import ExperimentSpec

#: The snapshot name recorded for worlds that ran in the local twin.
TWIN_SNAPSHOT = "local-twin"


def rehearse_outcomes(
    spec: ExperimentSpec, code_digest: str, processes: int | None = None, memo: bool = True
) -> ExperimentOutcomes:
    """Run every world of the spec on the twin (``memo=False``: every episode in full)."""
    run = run_twin(spec, processes=processes, memo=memo)
    return from_batch(run.batch, code_digest, TWIN_SNAPSHOT, run.seconds)
