"""``forklab plan``'s rehearsal: the whole experiment on the local twin, for free, into a
report, with the code and bundle digests of the files ``forklab start`` would ship from
here. Reading those files is why this lives on the CLI side and not in ``forklab.experiments``.
"""

from __future__ import annotations

from forklab.activities.experiment.runner_bundle import bundle_files, code_digest
from forklab.activities.experiment.twin import rehearse_outcomes, twin_held_out
from forklab.cli.experiment.workload_files import collect_workload
from forklab.experiments.experiment.analysis.build import build_report
from forklab.experiments.experiment.bundle import WorkloadBundle, workload_sources
from forklab.experiments.experiment.report.model import Report
from forklab.experiments.experiment.spec import ExperimentSpec


def workload_code_digest(spec: ExperimentSpec, bundle: WorkloadBundle | None = None) -> str:
    """The code digest a durable run of ``spec`` records: the runtime plus the built-in
    workload, or plus ``bundle`` (the files ``forklab start`` would ship)."""
    runtime = bundle_files(spec.workload.name, [] if bundle is not None else None)
    return code_digest(runtime, bundle)


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
        held_out=twin_held_out(processes),
        workload_bundle=bundle.digest if bundle is not None else None,
    )
