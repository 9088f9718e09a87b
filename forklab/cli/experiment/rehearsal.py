"""``forklab plan``'s rehearsal: the whole experiment on the local twin, for free, into a
report, with the code and bundle digests of the files ``forklab start`` would ship from
here. Reading those files is why this lives on the CLI side and not in ``forklab.experiments``.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from forklab.activities.experiment.runner_bundle import bundle_files, code_digest
from forklab.activities.experiment.twin import TwinRehearsal
from forklab.cli.experiment.workload_files import collect_workload
from forklab.experiments.experiment.bundle import WorkloadBundle, workload_sources
from forklab.experiments.experiment.spec import ExperimentSpec

if TYPE_CHECKING:  # (the analysis and the report import late; see ``Rehearsal``)
    from forklab.experiments.experiment.report.model import Report


def workload_code_digest(spec: ExperimentSpec, bundle: WorkloadBundle | None = None) -> str:
    """The code digest a durable run of ``spec`` records: the runtime plus the built-in
    workload, or plus ``bundle`` (the files ``forklab start`` would ship)."""
    runtime = bundle_files(spec.workload.name, [] if bundle is not None else None)
    return code_digest(runtime, bundle)


class Rehearsal:
    """A rehearsal under way: on entry the twin's processes start on every chunk of the
    experiment and the guard's held-out episodes (``TwinRehearsal``), so that whatever the
    caller imports meanwhile (the analysis and the renderings: their models, a fifth of
    a second) costs no time the twin would not take anyway; ``report`` then
    builds the report. The twin runs the workload as imported here; its code digest and
    bundle digest are those of the bundle ``forklab start`` would ship from here
    (``BundleError`` if it could not ship one)."""

    def __init__(
        self, spec: ExperimentSpec, processes: int | None = None, memo: bool = True
    ) -> None:
        self.spec = spec
        files = collect_workload(spec.workload.name)
        self._bundle = workload_sources(files) if files is not None else None
        self.digest = workload_code_digest(spec, self._bundle)
        self._twin = TwinRehearsal(spec, processes, memo)

    def __enter__(self) -> Rehearsal:
        self._twin.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._twin.__exit__(kind, exc, tb)

    def report(self) -> Report:
        from forklab.experiments.experiment.analysis.build import build_report

        return build_report(
            self.spec,
            self._twin.outcomes(self.digest),
            self.digest,
            held_out=self._twin.held_out,
            workload_bundle=self._bundle.digest if self._bundle is not None else None,
            forks_saved=self._twin.forks_saved,
        )


def rehearse(spec: ExperimentSpec, processes: int | None = None, memo: bool = True) -> Report:
    """The whole experiment on the twin, into its report (see ``Rehearsal``)."""
    with Rehearsal(spec, processes, memo) as rehearsal:
        return rehearsal.report()
