"""The report's tables as plain-text cells, shared by the terminal, Markdown and HTML
renderings so that the three always show the same columns and the same figures."""

from __future__ import annotations

from dataclasses import dataclass

from forklab.experiments.experiment.analysis.guard import GuardEvaluation
from forklab.experiments.experiment.analysis.slices import SliceEffect, feature_text
from forklab.experiments.experiment.analysis.verdicts import Verdict, hypothesis_headline
from forklab.experiments.experiment.report.model import Report
from forklab.experiments.experiment.results import CheckKind


@dataclass(frozen=True)
class Table:
    headers: list[str]
    rows: list[list[str]]
    #: Column indexes that hold numbers (right-aligned where the format allows).
    numeric: frozenset[int]


def pvalue_text(p: float) -> str:
    return "<1e-12" if p < 1e-12 else f"{p:.3g}"


def interval_text(low: float, high: float) -> str:
    return f"[{low:+.3f}, {high:+.3f}]"


def confidence_label(report: Report) -> str:
    return f"{round(report.settings.confidence * 100)}%"


def validity_text(report: Report) -> tuple[bool, str]:
    """The experiment's validity (its validity checks), apart from what it found."""
    failed = [c.name for c in report.checks if c.kind is CheckKind.validity and not c.passed]
    if not failed:
        return True, "Valid: every validity check passed."
    return False, (f"Invalid: {', '.join(failed)} failed; the effects below are not evidence.")


def hypothesis_text(report: Report) -> tuple[bool | None, str]:
    """Whether the effects support the hypothesis (every prediction held), and the
    headline counting its predictions; ``None`` when the experiment is invalid and so
    cannot support anything."""
    headline = hypothesis_headline(report.valid, [(v.world, v.verdict) for v in report.verdicts])
    if not report.valid:
        return None, headline
    held = bool(report.verdicts) and all(v.verdict is Verdict.supported for v in report.verdicts)
    return held, headline


def guard_verdict_row(report: Report) -> list[str] | None:
    """The guard policy's row for a verdict table: did its rule validate on held-out
    episodes (world, role, expected, verdict, why)."""
    g = report.guard
    if g is None:
        return None
    verdict = "validated" if g.validated else "not validated"
    return [f"guard on {g.world}", "guard policy", "beats always and never", verdict, g.validation]


def guard_counts_text(e: GuardEvaluation) -> list[str]:
    return [
        f"{label}: rescue {c.rescue}, harm {c.harm}, net {c.net:+d}, "
        f"intervened in {c.intervened} of {c.episodes}"
        for label, c in (("always", e.before), ("guarded", e.after))
    ]


def worlds_table(report: Report) -> Table:
    return Table(
        [
            "world",
            "role",
            "episodes",
            "failures",
            "failure rate",
            f"{confidence_label(report)} Wilson",
        ],
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
        frozenset({2, 3, 4, 5}),
    )


def comparisons_table(report: Report) -> Table:
    return Table(
        [
            "world",
            "vs",
            "rescue",
            "harm",
            "unchanged",
            "net",
            "success diff",
            f"{confidence_label(report)} CI",
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
        frozenset(range(2, 10)),
    )


def slices_table(report: Report, effects: list[SliceEffect]) -> Table:
    return Table(
        ["feature", "value", "n", "rescue", "harm", "net", f"{confidence_label(report)} CI"],
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
        frozenset({2, 3, 4, 5, 6}),
    )


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def shown_slices(report: Report, effects: list[SliceEffect]) -> tuple[list[SliceEffect], list[str]]:
    """The slices a rendering shows of ``effects``, and a note per group of features that
    split the episodes identically (``Report.identical_slices``): only the first of a
    group is shown, under a note naming them all, rather than the same rows twice."""
    present = {s.feature for s in effects}
    groups = [g for g in report.identical_slices if g[0] in present]
    hidden = {name for g in groups for name in g[1:]}
    notes = [
        f"{_names(g)} split the episodes identically: their slices are the same, "
        f"shown once as {g[0]}."
        for g in groups
    ]
    return [s for s in effects if s.feature not in hidden], notes


def evidence_table(report: Report) -> Table:
    return Table(
        ["rank", "world", "−log10 p", "world-seconds", "per world-second"],
        [
            [
                str(r.rank),
                r.world,
                f"{r.information:.2f}",
                f"{r.world_seconds:.3f}",
                "n/a" if r.information_per_second is None else f"{r.information_per_second:.2f}",
            ]
            for r in report.evidence
        ],
        frozenset({0, 2, 3, 4}),
    )


def power_table(report: Report) -> Table:
    return Table(
        ["world", "episodes", "needed", "note"],
        [[r.world, str(r.episodes), str(r.needed or "—"), r.note] for r in report.power.rows],
        frozenset({1, 2}),
    )
