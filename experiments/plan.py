"""Rehearsal: the whole experiment on the local twin, for free, into a report."""

from __future__ import annotations

from experiments.analysis.build import build_report
from experiments.bundle import bundle_files, code_digest
from experiments.engine import run_twin
from experiments.outcomes import ExperimentOutcomes, from_batch
from experiments.report.model import Report
from experiments.spec import ExperimentSpec

#: The snapshot name recorded for worlds that ran in the local twin.
TWIN_SNAPSHOT = "local-twin"


def workload_code_digest(spec: ExperimentSpec) -> str:
    return code_digest(bundle_files(spec.workload.name))


def rehearse_outcomes(
    spec: ExperimentSpec, code_digest: str, processes: int | None = None, memo: bool = True
) -> ExperimentOutcomes:
    """Run every world of the spec on the twin (``memo=False``: every episode in full)."""
    run = run_twin(spec, processes=processes, memo=memo)
    return from_batch(run.batch, code_digest, TWIN_SNAPSHOT, run.seconds)


def rehearse(spec: ExperimentSpec, processes: int | None = None, memo: bool = True) -> Report:
    digest = workload_code_digest(spec)
    out = rehearse_outcomes(spec, digest, processes, memo)
    return build_report(spec, out, digest, processes=processes)
