"""The analysis: per-episode outcomes in, the full report out (twin and durable path alike).

Order matters only in one place: the Holm adjustment needs every comparison's p before
any verdict can be given, and verdicts need the validity checks before they can say
anything at all.
"""

from __future__ import annotations

from forklab.experiments.experiment.analysis.checks import validity_checks
from forklab.experiments.experiment.analysis.columns import FeatureColumns, as_bools
from forklab.experiments.experiment.analysis.evidence import rank_evidence
from forklab.experiments.experiment.analysis.guard import HeldOutRunner, guard_policy
from forklab.experiments.experiment.analysis.held_out_plan import guard_world
from forklab.experiments.experiment.analysis.pairs import (
    CONFIDENCE,
    PairedEffect,
    paired_effect,
    paired_table,
    slice_counts,
)
from forklab.experiments.experiment.analysis.power import PowerAnalysis, power_row, power_warnings
from forklab.experiments.experiment.analysis.slices import (
    Dimension,
    SliceEffect,
    dimensions,
    identical_partitions,
    slice_effects,
)
from forklab.experiments.experiment.analysis.verdicts import (
    effect_check,
    expected_direction,
    world_verdict,
)
from forklab.experiments.experiment.columnar import Bools, as_features
from forklab.experiments.experiment.outcomes import (
    ExperimentOutcomes,
    WorldOutcomes,
    outcomes_digest,
)
from forklab.experiments.experiment.report.model import (
    AnalysisSettings,
    ComparisonRow,
    ExperimentInfo,
    Report,
    WorldRow,
    comparison_pairs,
    experiment_fingerprint,
)
from forklab.experiments.experiment.results import InfraUsage, WorldStatus
from forklab.experiments.experiment.sequential import (
    SequentialReport,
    design_for,
    design_verdicts,
    sequential_report,
)
from forklab.experiments.experiment.spec import Direction, ExperimentSpec, Role, SpecError
from forklab.experiments.experiment.stats import holm_adjust, wilson_interval
from forklab.experiments.experiment.waves import STOPS


def _world_rows(spec: ExperimentSpec, out: ExperimentOutcomes) -> list[WorldRow]:
    roles = {w.name: w.role for w in spec.worlds}
    rows = []
    for w in out.worlds:
        n = len(w.outcomes)
        failures = n - w.successes
        low, high = wilson_interval(failures, n, CONFIDENCE) if n else (0.0, 1.0)
        rows.append(
            WorldRow(
                name=w.name,
                role=roles[w.name],
                status=w.status,
                error=w.error,
                episodes=n,
                failures=failures,
                failure_rate=failures / n if n else 0.0,
                world_seconds=round(w.world_seconds, 6),
                failure_ci_low=low,
                failure_ci_high=high,
            )
        )
    return rows


def _whole(world: WorldOutcomes, out: ExperimentOutcomes) -> bool:
    return world.status is WorldStatus.completed and len(world.outcomes) == len(out.episodes)


def _interaction_dims(
    spec: ExperimentSpec, dims: dict[str, Dimension]
) -> list[tuple[Dimension, Dimension]]:
    pairs = []
    for i, (a, b) in enumerate(spec.analysis.interactions):
        for name in (a, b):
            if name not in dims:
                known = ", ".join(dims) or "none"
                raise SpecError(
                    f"field analysis.interactions[{i}]: the workload records no feature "
                    f"{name!r}; use two of: {known}"
                )
        pairs.append((dims[a], dims[b]))
    return pairs


def comparison_rows(
    spec: ExperimentSpec,
    out: ExperimentOutcomes,
    dims: dict[str, Dimension],
    columns: FeatureColumns | None = None,
) -> list[ComparisonRow]:
    """Every comparison with its paired statistics and slices; Holm across all of them."""
    interactions = _interaction_dims(spec, dims)
    table = as_features(out.features)
    features = columns if columns is not None else FeatureColumns(table)
    arrays: dict[str, Bools] = {}
    rows: list[ComparisonRow] = []
    for world, vs in comparison_pairs(spec):
        a, b = out.world(vs), out.world(world)
        if not (_whole(a, out) and _whole(b, out)):
            continue  # the completion check reports it; pairs need both worlds whole
        ref = arrays.setdefault(vs, as_bools(a.outcomes))
        w = arrays.setdefault(world, as_bools(b.outcomes))
        effect = paired_effect(paired_table(ref, w), CONFIDENCE)
        singles: list[SliceEffect] = []
        for dim in dims.values():
            singles += slice_effects(ref, w, table, [dim], CONFIDENCE)
        crossed: list[SliceEffect] = []
        for pair in interactions:
            crossed += slice_effects(ref, w, table, list(pair), CONFIDENCE)
        rows.append(
            ComparisonRow(
                world=world,
                vs=vs,
                rescue=effect.rescue,
                harm=effect.harm,
                unchanged=effect.n - effect.rescue - effect.harm,
                net=effect.net,
                slices=slice_counts(ref, w, features),
                n=effect.n,
                difference=effect.difference,
                ci_low=effect.ci_low,
                ci_high=effect.ci_high,
                confidence=CONFIDENCE,
                mcnemar_p=effect.mcnemar_p,
                holm_p=1.0,
                slice_effects=singles,
                interaction_effects=crossed,
            )
        )
    adjusted = holm_adjust([c.mcnemar_p for c in rows])
    return [c.model_copy(update={"holm_p": p}) for c, p in zip(rows, adjusted, strict=True)]


def build_report(
    spec: ExperimentSpec,
    out: ExperimentOutcomes,
    code_digest: str,
    infra: InfraUsage | None = None,
    *,
    held_out: HeldOutRunner,
    workload_bundle: str | None = None,
    forks_saved: dict[str, int] | None = None,
) -> Report:
    """The report. The guard's held-out episodes run in ``held_out`` (a sandbox on the
    durable path, the twin for ``forklab plan``). ``workload_bundle`` is the digest of
    the workload's bundle (None for a built-in workload); ``forks_saved``: per world, the
    forks its decided majority votes did not run."""
    settings = AnalysisSettings(
        confidence=CONFIDENCE,
        alpha=spec.analysis.alpha,
        power=spec.analysis.power,
        quantile_bins=spec.analysis.quantile_bins,
        forks_per_checkpoint=spec.analysis.forks_per_checkpoint,
        forks_saved=forks_saved or None,
    )
    features = as_features(out.features)
    columns = FeatureColumns(features)
    dims = dimensions(features, spec.analysis.quantile_bins)
    comparisons = comparison_rows(spec, out, dims, columns)
    sequential = _sequential(spec, out)
    checks = validity_checks(spec, out, code_digest, infra, _design_stops(spec, sequential))
    failed = [c.name for c in checks if not c.passed]
    base = spec.baseline.name
    vs_base = {c.world: c for c in comparisons if c.vs == base}
    verdicts = []
    power_rows = []
    for w in spec.worlds:
        row = vs_base.get(w.name)
        if w.role is Role.baseline or row is None:
            continue
        expected = expected_direction(spec, w.name, w.role)
        effect = _effect_of(row)
        verdicts.append(
            world_verdict(w.name, w.role, expected, effect, row.holm_p, settings.alpha, failed)
        )
        if expected is not Direction.none and row.n:
            power_rows.append(
                power_row(
                    w.name,
                    base,
                    expected,
                    row.harm,
                    row.rescue,
                    row.n,
                    settings.alpha,
                    settings.power,
                )
            )
    if sequential is not None:
        verdicts = design_verdicts(sequential, failed)
    checks.append(effect_check(verdicts))
    seconds = {w.name: w.world_seconds for w in out.worlds}
    evidence = rank_evidence(
        [(c.world, c.vs, c.mcnemar_p, seconds[c.world]) for c in vs_base.values()]
    )
    gated = guard_world(spec)
    guard = None
    if gated is not None and gated.name in vs_base:
        training = vs_base[gated.name]
        partitions = [[s for s in training.slice_effects if s.feature == name] for name in dims]
        partitions += _split_by_feature(training.interaction_effects)
        world_out = out.world(gated.name)
        guard = guard_policy(
            spec,
            partitions,
            out.world(base).outcomes,
            world_out.outcomes,
            world_out.intervened,
            held_out,
        )
    return Report(
        experiment=ExperimentInfo(
            id=spec.id,
            hypothesis=spec.hypothesis.text,
            fingerprint=experiment_fingerprint(spec, code_digest),
            spec_digest=spec.digest(),
            code_digest=code_digest,
            workload_bundle=workload_bundle,
            seed=spec.seed,
            episodes=spec.episodes,
            workload=spec.workload.name,
            params=dict(sorted(spec.workload.params.items())),
        ),
        worlds=_world_rows(spec, out),
        comparisons=comparisons,
        outcomes_digest=outcomes_digest(out, [w.name for w in spec.worlds]),
        checks=checks,
        valid=not failed,
        settings=settings,
        verdicts=verdicts,
        evidence=evidence,
        power=PowerAnalysis(
            alpha=settings.alpha,
            power=settings.power,
            rows=power_rows,
            warnings=power_warnings(power_rows, settings.alpha, settings.power),
        ),
        guard=guard,
        infra=infra,
        sequential=sequential,
        identical_slices=identical_partitions(features, dims),
    )


def _sequential(spec: ExperimentSpec, out: ExperimentOutcomes) -> SequentialReport | None:
    """The design's paths through the outcomes. On the twin every world holds every
    episode, so this *rehearses* the design: the paths and the saving are those a durable
    run of these very episodes takes. On the durable path a world the design stopped
    holds the episodes up to its stop; a world that failed has no path."""
    design = design_for(spec)
    if design is None:
        return None
    ran = (WorldStatus.completed, WorldStatus.stopped)
    return sequential_report(
        spec, design, {w.name: w.outcomes for w in out.worlds if w.status in ran}
    )


def _design_stops(spec: ExperimentSpec, seq: SequentialReport | None) -> dict[str, int]:
    """The episodes a sequential design gave each world it stopped (the baseline runs as
    long as any other world): what a durable run of the design must have run."""
    if seq is None:
        return {}
    # a path whose counts end before the design decided (``continue``) was not stopped
    stops = {p.world: p.episodes for p in seq.worlds if p.stopped in STOPS}
    if seq.baseline_episodes < seq.design.episodes:
        stops[spec.baseline.name] = seq.baseline_episodes
    return stops


def _effect_of(row: ComparisonRow) -> PairedEffect:
    """The paired effect a comparison row already holds (each table is computed once)."""
    return PairedEffect(
        n=row.n,
        rescue=row.rescue,
        harm=row.harm,
        net=row.net,
        difference=row.difference,
        ci_low=row.ci_low,
        ci_high=row.ci_high,
        confidence=row.confidence,
        mcnemar_p=row.mcnemar_p,
    )


def _split_by_feature(effects: list[SliceEffect]) -> list[list[SliceEffect]]:
    groups: dict[str, list[SliceEffect]] = {}
    for s in effects:
        groups.setdefault(s.feature, []).append(s)
    return list(groups.values())
