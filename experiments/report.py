"""The experiment report: one pydantic model, rendered as a terminal table or JSON.

``experiments.analysis`` builds it; Markdown and HTML renderings live in
``render_markdown`` and ``render_html``.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from experiments.checks import Check, CheckKind
from experiments.evidence import EvidenceRow
from experiments.guard import GuardEvaluation, GuardPolicy
from experiments.outcomes import InfraUsage, WorldStatus
from experiments.pairing import SliceCounts
from experiments.power import PowerAnalysis
from experiments.runtime.canon import digest
from experiments.slices import SliceEffect, feature_text
from experiments.spec import ExperimentSpec, Role
from experiments.verdicts import WorldVerdict


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


class Report(BaseModel):
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


def experiment_fingerprint(spec: ExperimentSpec, code_digest: str) -> str:
    """sha256 over the canonical spec and the workload code digest."""
    return digest({"spec": spec.canonical(), "code_digest": code_digest})


def comparison_pairs(spec: ExperimentSpec) -> list[tuple[str, str]]:
    """Each world against the baseline, then the extra pairs the spec names."""
    base = spec.baseline.name
    pairs = [(w.name, base) for w in spec.worlds if w.role is not Role.baseline]
    pairs += [(c.world, c.vs) for c in spec.analysis.comparisons if (c.world, c.vs) not in pairs]
    return pairs


def pvalue_text(p: float) -> str:
    return "<1e-12" if p < 1e-12 else f"{p:.3g}"


def interval_text(low: float, high: float) -> str:
    return f"[{low:+.3f}, {high:+.3f}]"


def guard_counts_text(e: GuardEvaluation) -> list[str]:
    return [
        f"{label}: rescue {c.rescue}, harm {c.harm}, net {c.net:+d}, "
        f"intervened in {c.intervened} of {c.episodes}"
        for label, c in (("always", e.before), ("guarded", e.after))
    ]


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
    pct = f"{round(report.settings.confidence * 100)}%"
    lines = [
        f"experiment {e.id}  ({e.workload}, seed {e.seed}, {e.episodes} episodes per world)",
        f"hypothesis  {e.hypothesis}",
        f"fingerprint {e.fingerprint}",
        "",
    ]
    lines += _table(
        ["world", "role", "episodes", "failures", "failure rate", f"{pct} Wilson"],
        [
            [
                w.name,
                w.role.value,
                str(w.episodes),
                str(w.failures),
                f"{w.failure_rate:.1%}",
                f"[{w.failure_ci_low:.1%}, {w.failure_ci_high:.1%}]",
            ]
            for w in report.worlds
        ],
    )
    lines.append("")
    lines += _table(
        [
            "world",
            "vs",
            "rescue",
            "harm",
            "unchanged",
            "net",
            "success diff",
            f"{pct} CI",
            "McNemar p",
            "Holm p",
        ],
        [
            [
                c.world,
                c.vs,
                str(c.rescue),
                str(c.harm),
                str(c.unchanged),
                f"{c.net:+d}",
                f"{c.difference:+.3f}",
                interval_text(c.ci_low, c.ci_high),
                pvalue_text(c.mcnemar_p),
                pvalue_text(c.holm_p),
            ]
            for c in report.comparisons
        ],
    )
    for c in report.comparisons:
        effects = c.slice_effects + c.interaction_effects
        if not effects:
            continue
        lines += ["", f"slices: {c.world} vs {c.vs}"]
        lines += _table(
            ["feature", "value", "n", "rescue", "harm", "net", f"{pct} CI"],
            [
                [
                    s.feature,
                    feature_text(s.value),
                    str(s.n),
                    str(s.rescue),
                    str(s.harm),
                    f"{s.net:+d}",
                    interval_text(s.ci_low, s.ci_high),
                ]
                for s in effects
            ],
        )
    lines += ["", "validity checks"]
    lines += [
        f"  [{'PASS' if c.passed else 'FAIL'}] {c.name}: {c.reason}"
        for c in report.checks
        if c.kind is CheckKind.validity
    ]
    lines += ["", "verdicts"]
    lines += [f"  {v.world}: {v.verdict.value.upper()} ({v.reason})" for v in report.verdicts]
    lines += [
        f"  [{'PASS' if c.passed else 'FAIL'}] {c.name}: {c.reason}"
        for c in report.checks
        if c.kind is CheckKind.effect
    ]
    if report.evidence:
        lines += ["", "evidence per world-second (−log10 McNemar p per world-second)"]
        lines += [
            f"  {r.rank}. {r.world}: {r.information:.2f} in {r.world_seconds:.3f} s"
            + (f" = {r.information_per_second:.2f}/s" if r.information_per_second else "")
            for r in report.evidence
        ]
    p = report.power
    lines += ["", f"power (α {p.alpha:g}, power {p.power:g}, from the rehearsal's discordance)"]
    lines += [f"  {r.world}: {r.note}" for r in p.rows]
    lines += [f"  WARNING: {w}" for w in p.warnings]
    if report.guard is not None:
        g = report.guard
        cap = "harms ≤ rescues per slice" if g.harm_cap is None else f"harm cap {g.harm_cap}"
        lines += ["", f"guard policy for {g.world} (learned on {g.basis}, {cap})"]
        lines += [f"  {g.words}", f"  rule {_rule_json(g.rule)}"]
        lines += [f"  training episodes {g.training.first_episode}..{g.training.last_episode}:"]
        lines += [f"    {t}" for t in guard_counts_text(g.training)]
        h = g.held_out
        lines += [f"  held-out episodes {h.first_episode}..{h.last_episode}:"]
        lines += [f"    {t}" for t in guard_counts_text(h)]
    lines += ["", f"outcomes digest {report.outcomes_digest}"]
    lines.append("VALID" if report.valid else "INVALID: a validity check failed")
    return "\n".join(lines)


def _rule_json(rule: dict[str, Any]) -> str:
    return json.dumps(rule, separators=(", ", ": "))
