"""The durable run's Markdown report: the engine's Markdown with the run's provenance."""

from __future__ import annotations

from experiments.render_markdown import render_markdown as engine_markdown
from experiments.render_markdown import table
from experiments.report import Report


def render_markdown(report: Report, provenance: dict[str, str]) -> str:
    """Insert a "Durable run" section (plan, snapshot, approval, spend, cleanup) before the
    report's first section."""
    head, sep, rest = engine_markdown(report).partition("\n## ")
    section = [
        "## Durable run",
        "",
        *table(["item", "value"], [[k, v] for k, v in provenance.items()]),
    ]
    return head + "\n" + "\n".join(section) + "\n" + sep + rest
