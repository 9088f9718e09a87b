"""The experiment report: one pydantic model, rendered as a terminal table or JSON."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from experiments.checks import Check, basic_checks, failure_rate
from experiments.outcomes import ExperimentOutcomes, WorldStatus, outcomes_digest
from experiments.pairing import SliceCounts, pair_counts, slice_counts
from experiments.runtime.canon import digest
from experiments.spec import ExperimentSpec, Role


class ExperimentInfo(BaseModel):
    id: str
    hypothesis: str
    fingerprint: str
    spec_digest: str
    code_digest: str
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


class ComparisonRow(BaseModel):
    world: str
    vs: str
    rescue: int
    harm: int
    unchanged: int
    net: int
    slices: list[SliceCounts]


class Report(BaseModel):
    experiment: ExperimentInfo
    worlds: list[WorldRow]
    comparisons: list[ComparisonRow]
    outcomes_digest: str
    checks: list[Check]
    valid: bool


def experiment_fingerprint(spec: ExperimentSpec, code_digest: str) -> str:
    """sha256 over the canonical spec and the workload code digest."""
    return digest({"spec": spec.canonical(), "code_digest": code_digest})


def comparison_pairs(spec: ExperimentSpec) -> list[tuple[str, str]]:
    """Each world against the baseline, then the extra pairs the spec names."""
    base = spec.baseline.name
    pairs = [(w.name, base) for w in spec.worlds if w.role is not Role.baseline]
    pairs += [(c.world, c.vs) for c in spec.analysis.comparisons if (c.world, c.vs) not in pairs]
    return pairs


def build_report(spec: ExperimentSpec, out: ExperimentOutcomes, code_digest: str) -> Report:
    roles = {w.name: w.role for w in spec.worlds}
    rows = []
    for w in out.worlds:
        n = len(w.outcomes)
        rows.append(
            WorldRow(
                name=w.name,
                role=roles[w.name],
                status=w.status,
                error=w.error,
                episodes=n,
                failures=n - sum(w.outcomes),
                failure_rate=failure_rate(w.outcomes),
                world_seconds=round(w.world_seconds, 6),
            )
        )
    comparisons = []
    for world, vs in comparison_pairs(spec):
        a, b = out.world(vs), out.world(world)
        if a.status is not WorldStatus.completed or b.status is not WorldStatus.completed:
            continue
        counts = pair_counts(a.outcomes, b.outcomes)
        comparisons.append(
            ComparisonRow(
                world=world,
                vs=vs,
                rescue=counts.rescue,
                harm=counts.harm,
                unchanged=counts.unchanged,
                net=counts.net,
                slices=slice_counts(a.outcomes, b.outcomes, out.features),
            )
        )
    checks = basic_checks(spec, out)
    return Report(
        experiment=ExperimentInfo(
            id=spec.id,
            hypothesis=spec.hypothesis.text,
            fingerprint=experiment_fingerprint(spec, code_digest),
            spec_digest=spec.digest(),
            code_digest=code_digest,
            seed=spec.seed,
            episodes=spec.episodes,
            workload=spec.workload.name,
            params=dict(sorted(spec.workload.params.items())),
        ),
        worlds=rows,
        comparisons=comparisons,
        outcomes_digest=outcomes_digest(out, [w.name for w in spec.worlds]),
        checks=checks,
        valid=all(c.passed for c in checks),
    )


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += [
        "  ".join(
            c.rjust(w) if c[:1].isdigit() or c[:1] in "+-" else c.ljust(w)
            for c, w in zip(r, widths, strict=True)
        )
        for r in rows
    ]
    return out


def render_text(report: Report) -> str:
    e = report.experiment
    lines = [
        f"experiment {e.id}  ({e.workload}, seed {e.seed}, {e.episodes} episodes per world)",
        f"hypothesis  {e.hypothesis}",
        f"fingerprint {e.fingerprint}",
        "",
    ]
    lines += _table(
        ["world", "role", "episodes", "failures", "failure rate"],
        [
            [w.name, w.role.value, str(w.episodes), str(w.failures), f"{w.failure_rate:.1%}"]
            for w in report.worlds
        ],
    )
    lines.append("")
    lines += _table(
        ["world", "vs", "rescue", "harm", "unchanged", "net"],
        [
            [c.world, c.vs, str(c.rescue), str(c.harm), str(c.unchanged), f"{c.net:+d}"]
            for c in report.comparisons
        ],
    )
    for c in report.comparisons:
        if not c.slices:
            continue
        lines += ["", f"slices: {c.world} vs {c.vs}"]
        lines += _table(
            ["feature", "value", "rescue", "harm", "unchanged"],
            [
                [s.feature, str(s.value).lower(), str(s.rescue), str(s.harm), str(s.unchanged)]
                for s in c.slices
            ],
        )
    lines += ["", "validity checks"]
    lines += [f"  [{'PASS' if c.passed else 'FAIL'}] {c.name}: {c.reason}" for c in report.checks]
    lines += ["", f"outcomes digest {report.outcomes_digest}"]
    lines.append("VALID" if report.valid else "INVALID: a validity check failed")
    return "\n".join(lines)
