"""The report as one screen of terminal text: what ran, the verdict per world with its
interval, the noise and validity line, the guard and the spend. ``forklab demo`` ends with
it; the full report (every table, slice and check) stays in ``report.md``/``.html``.

Every figure comes from the report itself, so the screen cannot say more than the report.
"""

from __future__ import annotations

from forklab.experiments.experiment.report.model import ComparisonRow, Report
from forklab.experiments.experiment.report.render_text import text_table
from forklab.experiments.experiment.report.tables import (
    Table,
    confidence_label,
    hypothesis_text,
    interval_text,
)
from forklab.experiments.experiment.results import CheckKind
from forklab.experiments.experiment.spec import Role


def _verdicts_table(report: Report) -> Table:
    """One row per world: its failures, and for each compared world its expectation,
    verdict, paired difference with its interval, and rescues/harms."""
    pairs: dict[str, ComparisonRow] = {c.world: c for c in report.comparisons}
    verdicts = {v.world: v for v in report.verdicts}
    rows = []
    for w in report.worlds:
        c, v = pairs.get(w.name), verdicts.get(w.name)
        rows.append(
            [
                w.name,
                v.expected.value if v is not None else "—",
                v.verdict.value if v is not None else w.role.value,
                f"{w.failures}/{w.episodes} ({w.failure_rate:.1%})",
                f"{c.difference:+.3f} {interval_text(c.ci_low, c.ci_high)}" if c else "",
                f"{c.rescue}/{c.harm}" if c else "",
            ]
        )
    return Table(
        [
            "world",
            "expected",
            "verdict",
            "failed",
            f"success vs baseline, {confidence_label(report)} CI",
            "rescued/harmed",
        ],
        rows,
        frozenset({3}),
    )


def validity_noise_line(report: Report) -> str:
    """Can the numbers be trusted: the validity checks, and the noise the worlds share
    (a placebo is an A/A world: the pairs in which it differs from the baseline are noise)."""
    checks = [c for c in report.checks if c.kind is CheckKind.validity]
    failed = [c.name for c in checks if not c.passed]
    if failed:
        valid = (
            f"Invalid: {', '.join(failed)} failed ({len(failed)} of {len(checks)} validity "
            "checks); the verdicts are void."
        )
    else:
        valid = f"Valid: {len(checks)} of {len(checks)} validity checks passed."
    roles = {w.name: w.role for w in report.worlds}
    placebos = [c for c in report.comparisons if roles.get(c.world) is Role.placebo]
    if not placebos:
        return f"{valid} Noise: no placebo world, so no measured noise floor."
    noise = "; ".join(
        f"{c.world} differed from {c.vs} in {c.rescue + c.harm} of {c.n} episodes" for c in placebos
    )
    return f"{valid} Noise: {noise}."


def summary_lines(report: Report) -> list[str]:
    """The one-screen story of ``report``: at most a dozen lines plus one per world."""
    e = report.experiment
    lines = [
        f"{e.id}: workload {e.workload}, {len(report.worlds)} worlds × "
        f"{e.episodes} episodes, seed {e.seed}",
        hypothesis_text(report)[1],
        validity_noise_line(report),
        "",
        *text_table(_verdicts_table(report)),
    ]
    if report.guard is not None:
        g = report.guard
        lines += ["", f"Guard for {g.world}: {g.words}; {g.validation}."]
    if report.infra is not None:
        i = report.infra
        lines.append(
            f"Spent {i.world_seconds_spent:.1f} of {i.world_seconds_budget:g} world-seconds, "
            f"at most {i.peak_concurrent_sandboxes} of {i.max_concurrent_sandboxes} "
            f"sandboxes at once; {i.sandboxes_left} left after cleanup."
        )
    return lines
