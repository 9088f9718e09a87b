"""The experiment report: one pydantic model (its JSON is the machine-readable report).

``forklab.experiments.experiment.analysis.build`` builds it; ``render_text``, ``render_markdown``
and ``render_html`` render it, from the shared cells of ``tables``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from forklab.experiments.experiment.analysis.evidence import EvidenceRow
from forklab.experiments.experiment.analysis.guard import GuardPolicy
from forklab.experiments.experiment.analysis.pairs import SliceCounts
from forklab.experiments.experiment.analysis.power import PowerAnalysis
from forklab.experiments.experiment.analysis.slices import SliceEffect
from forklab.experiments.experiment.analysis.verdicts import WorldVerdict
from forklab.experiments.experiment.results import Check, InfraUsage, WorldStatus
from forklab.experiments.experiment.sequential import SequentialReport
from forklab.experiments.experiment.spec import ExperimentSpec, Role
from forklab.experiments.experiment.workspace_report import WorkspaceSection
from forklab.runtime.canon import digest


class ExperimentInfo(BaseModel):
    id: str
    hypothesis: str
    fingerprint: str
    spec_digest: str
    code_digest: str
    workload_bundle: str | None = Field(
        default=None,
        description="Digest of the workload bundle the code digest includes (None: built in).",
    )
    seed: int
    episodes: int
    workload: str
    params: dict[str, Any]


class WorldRow(BaseModel):
    name: str
    role: Role
    status: WorldStatus
    error: str | None
    episodes: int
    failures: int
    failure_rate: float
    world_seconds: float
    failure_ci_low: float
    failure_ci_high: float


class ComparisonRow(BaseModel):
    """``world`` against ``vs``; ``difference`` is the world's success rate minus the
    reference's, with a Newcombe interval, the exact McNemar p and its Holm adjustment
    across all comparisons. ``slices`` are the raw counts per recorded feature value;
    ``slice_effects`` bin numeric features into quantiles and add intervals."""

    world: str
    vs: str
    rescue: int
    harm: int
    unchanged: int
    net: int
    slices: list[SliceCounts]
    n: int
    difference: float
    ci_low: float
    ci_high: float
    confidence: float
    mcnemar_p: float
    holm_p: float
    slice_effects: list[SliceEffect]
    interaction_effects: list[SliceEffect]


class AnalysisSettings(BaseModel):
    confidence: float
    alpha: float
    power: float
    quantile_bins: int
    forks_per_checkpoint: int
    #: per world, the forks its majority votes did not run once decided (the twin's runs;
    #: None where nothing was counted)
    forks_saved: dict[str, int] | None = None


#: Bump when a stored report changes shape, so a reader can tell which one it holds.
REPORT_SCHEMA_VERSION = 2


class Report(BaseModel):
    schema_version: int = Field(
        default=REPORT_SCHEMA_VERSION, description="The report's JSON shape (bumped on change)."
    )
    experiment: ExperimentInfo
    worlds: list[WorldRow]
    comparisons: list[ComparisonRow]
    outcomes_digest: str
    checks: list[Check]
    valid: bool
    settings: AnalysisSettings
    verdicts: list[WorldVerdict]
    evidence: list[EvidenceRow]
    power: PowerAnalysis
    guard: GuardPolicy | None
    infra: InfraUsage | None
    #: A workload with files, on the durable path: per world, the workspace at the branch
    #: and at the end and what diverged (the manifests are files next to the report).
    workspaces: WorkspaceSection | None = None
    #: A spec with ``analysis.sequential``: each world's path through the looks, where and
    #: why it stopped, its design-valid p-value and interval, and the compute unspent.
    sequential: SequentialReport | None = None
    #: Features whose slices hold the same episodes (``identical_partitions``): every
    #: comparison's ``slice_effects`` keep each of them, the renderings show the first of
    #: a group and name the others in a note.
    identical_slices: list[list[str]] = Field(default_factory=list)


def experiment_fingerprint(spec: ExperimentSpec, code_digest: str) -> str:
    """sha256 over the canonical spec and the workload code digest."""
    return digest({"spec": spec.canonical(), "code_digest": code_digest})


def comparison_pairs(spec: ExperimentSpec) -> list[tuple[str, str]]:
    """Each world against the baseline, then the extra pairs the spec names."""
    base = spec.baseline.name
    pairs = [(w.name, base) for w in spec.worlds if w.role is not Role.baseline]
    pairs += [(c.world, c.vs) for c in spec.analysis.comparisons if (c.world, c.vs) not in pairs]
    return pairs
