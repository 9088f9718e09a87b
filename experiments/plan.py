"""Rehearsal: the whole experiment on the local twin, for free, into a report."""

from __future__ import annotations

from experiments.analysis import build_report
from experiments.bundle import bundle_files, code_digest
from experiments.engine import run_twin
from experiments.guard import HeldOutRunner, twin_held_out
from experiments.outcomes import ExperimentOutcomes, InfraUsage, from_batch
from experiments.report import Report
from experiments.spec import ExperimentSpec

#: The snapshot name recorded for worlds that ran in the local twin.
TWIN_SNAPSHOT = "local-twin"


def workload_code_digest(spec: ExperimentSpec) -> str:
    return code_digest(bundle_files(spec.workload.name))


def rehearse_outcomes(
    spec: ExperimentSpec, code_digest: str, processes: int | None = None
) -> ExperimentOutcomes:
    """Run every world of the spec on the twin."""
    run = run_twin(spec, processes=processes)
    return from_batch(run.batch, code_digest, TWIN_SNAPSHOT, run.seconds)


def analyse(
    spec: ExperimentSpec,
    outcomes: ExperimentOutcomes,
    code_digest: str,
    infra: InfraUsage | None = None,
    held_out: HeldOutRunner = twin_held_out,
) -> Report:
    """The analysis shared by the twin and the durable path (``infra`` and a sandboxed
    ``held_out`` runner only there)."""
    return build_report(spec, outcomes, code_digest, infra, held_out)


def rehearse(spec: ExperimentSpec, processes: int | None = None) -> Report:
    digest = workload_code_digest(spec)
    return analyse(spec, rehearse_outcomes(spec, digest, processes), digest)
