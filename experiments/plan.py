"""Rehearsal: the whole experiment on the local twin, for free, into a report."""

from __future__ import annotations

from experiments.analysis.build import build_report
from experiments.bundle import (
    WorkloadBundle,
    bundle_files,
    code_digest,
    collect_workload,
    workload_sources,
)
from experiments.engine import run_twin
from experiments.outcomes import ExperimentOutcomes, from_batch
from experiments.report.model import Report
from experiments.spec import ExperimentSpec

#: The snapshot name recorded for worlds that ran in the local twin.
TWIN_SNAPSHOT = "local-twin"


def workload_code_digest(spec: ExperimentSpec, bundle: WorkloadBundle | None = None) -> str:
    """The code digest a durable run of ``spec`` records: the runtime plus the built-in
    workload, or plus ``bundle`` (the files ``forklab start`` would ship)."""
    runtime = bundle_files(spec.workload.name, [] if bundle is not None else None)
    return code_digest(runtime, bundle)


def rehearse_outcomes(
    spec: ExperimentSpec, code_digest: str, processes: int | None = None, memo: bool = True
) -> ExperimentOutcomes:
    """Run every world of the spec on the twin (``memo=False``: every episode in full)."""
    run = run_twin(spec, processes=processes, memo=memo)
    return from_batch(run.batch, code_digest, TWIN_SNAPSHOT, run.seconds)


def rehearse(spec: ExperimentSpec, processes: int | None = None, memo: bool = True) -> Report:
    """The twin runs the workload as imported here; its code digest and bundle digest are
    those of the bundle ``forklab start`` would ship from here (``BundleError`` if it
    could not ship one)."""
    files = collect_workload(spec.workload.name)
    bundle = workload_sources(files) if files is not None else None
    digest = workload_code_digest(spec, bundle)
    out = rehearse_outcomes(spec, digest, processes, memo)
    return build_report(
        spec,
        out,
        digest,
        processes=processes,
        workload_bundle=bundle.digest if bundle is not None else None,
    )
