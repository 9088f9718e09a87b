"""Shipping the user's scorer and feature functions of a cohort spec where the operator
runs ``forklab cohort start``: their packages are bundled as a workload's are
(``collect_workload``: the whole top-level package, or a top-level module with its
siblings, found on the import path without importing anything) and shipped through the
artifact store; the workflow gets the bundle's digest, and a worker runs the functions
from it in boxes (``forklab.activities.runfork.cohort_code``)."""

from __future__ import annotations

from forklab.activities.experiment.workload_bundles import WorkloadBundleError, ship_workload
from forklab.activities.runfork.cohort_code import user_functions
from forklab.activities.stores.artifacts import ArtifactError
from forklab.activities.stores.outages import StoreUnavailableError
from forklab.cli.errors import CliError
from forklab.cli.experiment.specfile import SPEC_EXIT
from forklab.cli.experiment.workload_files import collect_workload
from forklab.experiments.cohort.spec import CohortExperimentSpec
from forklab.experiments.experiment.bundle import BundleError, WorkloadBundle
from forklab.workers.config import Settings
from forklab.workers.stores import artifact_store


def ship_cohort_code(
    settings: Settings, spec: CohortExperimentSpec, source: str = "spec"
) -> WorkloadBundle | None:
    """The bundle of the spec's own scorer and feature functions, shipped (None when it
    names only ForkLab's shipped scorers). A function that cannot be bundled stops here,
    with one sentence naming the field, before anything starts."""
    files: dict[str, bytes] = {}
    for field, name in user_functions(spec).items():
        try:
            found = collect_workload(name)
        except BundleError as exc:
            raise CliError(f"{source}: field {field}: {exc}", SPEC_EXIT) from None
        files.update(found or {})
    if not files:
        return None
    try:
        return ship_workload(artifact_store(settings), files)
    except BundleError as exc:
        raise CliError(
            f"{source}: the bundle of your scorer and features: {exc}", SPEC_EXIT
        ) from None
    except (ArtifactError, StoreUnavailableError, WorkloadBundleError) as exc:
        raise CliError(f"cannot ship the bundle of your scorer and features: {exc}") from None
