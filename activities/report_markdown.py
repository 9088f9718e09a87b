"""The durable run's report as Markdown: provenance first, then the engine's report."""

from __future__ import annotations

from experiments.report import Report, render_text


def render_markdown(report: Report, provenance: dict[str, str]) -> str:
    e = report.experiment
    lines = [
        f"# ForkLab experiment `{e.id}`",
        "",
        f"> {e.hypothesis}",
        "",
        f"**{'VALID' if report.valid else 'INVALID'}** · {len(report.worlds)} worlds · "
        f"{e.episodes} episodes per world · outcomes digest `{report.outcomes_digest[:16]}`",
        "",
        "## Provenance",
        "",
        "| item | value |",
        "|---|---|",
    ]
    lines += [f"| {key} | {value} |" for key, value in provenance.items()]
    lines += [
        "",
        "## Worlds",
        "",
        "| world | role | status | episodes | failures | failure rate | world-seconds |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {w.name} | {w.role.value} | {w.status.value}"
        f"{' — ' + w.error if w.error else ''} | {w.episodes} | {w.failures} | "
        f"{w.failure_rate:.1%} | {w.world_seconds:.2f} |"
        for w in report.worlds
    ]
    lines += [
        "",
        "## Validity checks",
        "",
    ]
    lines += [f"- {'✅' if c.passed else '❌'} **{c.name}**: {c.reason}" for c in report.checks]
    lines += ["", "## Full report", "", "```text", render_text(report), "```", ""]
    return "\n".join(lines)
