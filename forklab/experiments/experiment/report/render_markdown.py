"""The report as Markdown (GitHub-flavoured tables), for terminals, PRs and the ledger."""

from __future__ import annotations

import json

from forklab.experiments.experiment.report.model import Report
from forklab.experiments.experiment.report.sequential_text import sequential_lines
from forklab.experiments.experiment.report.tables import (
    Table,
    comparisons_table,
    evidence_table,
    guard_counts_text,
    guard_verdict_row,
    hypothesis_text,
    power_table,
    shown_slices,
    slices_table,
    validity_text,
    worlds_table,
)
from forklab.experiments.experiment.workspace_report import workspace_markdown
from forklab.experiments.visible_text import visible


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def _quoted(text: str) -> list[str]:
    """``text`` as a block quote, every line of it: a hypothesis of several lines cannot
    step out of its quote and pass for a section of the report (a forged verdict)."""
    return [f"> {line}" if line else ">" for line in text.splitlines()] or [">"]


def _shared(t: Table) -> list[str]:
    return table(t.headers, t.rows)


#: The heading after the verdicts, before which the readout section goes
#: (``forklab.experiments.experiment.readout.render``).
READOUT_BEFORE = "## Worlds"


def render_markdown(report: Report, provenance: dict[str, str] | None = None) -> str:
    """In the HTML page's order: verdicts first (the readout goes right after them), the
    figures, and the provenance last: digests and, given ``provenance`` (a durable run's
    plan, snapshot, approval, spend, cleanup; values are Markdown inline text), the run's."""
    e = report.experiment
    lines = [
        f"# Experiment `{e.id}`",
        "",
        *_quoted(e.hypothesis),
        "",
        f"Workload `{e.workload}`, seed {e.seed}, {e.episodes} episodes per world.",
        "",
        f"- **{validity_text(report)[1]}**",
        f"- **{hypothesis_text(report)[1]}**",
        "",
    ]
    lines += ["## Verdicts", ""]
    rows = [
        [v.world, v.role.value, v.expected.value, f"**{v.verdict.value}**", v.reason]
        for v in report.verdicts
    ]
    guard = guard_verdict_row(report)
    if guard is not None:
        rows.append([*guard[:3], f"**{guard[3]}**", guard[4]])
    lines += table(["world", "role", "expected", "verdict", "why"], rows)
    if not report.valid:
        lines += ["", "The verdicts above are void: the experiment failed a validity check."]
    lines += ["", READOUT_BEFORE, ""]
    lines += _shared(worlds_table(report))
    lines += ["", "## Paired comparisons", ""]
    lines += _shared(comparisons_table(report))
    lines += ["", "## Slices", ""]
    for c in report.comparisons:
        effects, notes = shown_slices(report, c.slice_effects + c.interaction_effects)
        if not effects:
            continue
        lines += [f"### {c.world} vs {c.vs}", ""]
        lines += [*(f"*{n}*" for n in notes), *([""] if notes else [])]
        lines += _shared(slices_table(report, effects))
        lines.append("")
    lines += ["## Checks", ""]
    lines += table(
        ["check", "kind", "result", "reason"],
        [
            [c.name, c.kind.value, "pass" if c.passed else "**FAIL**", c.reason]
            for c in report.checks
        ],
    )
    lines += ["", "## Evidence per world-second", ""]
    lines += _shared(evidence_table(report))
    p = report.power
    lines += ["", f"## Power (α {p.alpha:g}, power {p.power:g})", ""]
    lines += _shared(power_table(report))
    lines += [f"\n**Warning:** {w}" for w in p.warnings]
    if report.sequential is not None:
        head, *rest = sequential_lines(report.sequential)
        lines += ["", "## Sequential design", "", head + ".", "", *(f"- {t}" for t in rest)]
    if report.guard is not None:
        g = report.guard
        lines += ["", f"## Guard policy for `{g.world}`", "", f"**{g.words}**", ""]
        lines += [g.validation[0].upper() + g.validation[1:] + ".", ""]
        lines += ["```json", json.dumps(g.rule, indent=2), "```", ""]
        for label, ev in (("Training", g.training), ("Held-out", g.held_out)):
            lines.append(f"{label} episodes {ev.first_episode}..{ev.last_episode}:")
            lines += [f"- {t}" for t in guard_counts_text(ev)]
            lines.append("")
    if report.workspaces is not None:
        lines += ["", *workspace_markdown(report.workspaces)]
    lines += ["", "## Provenance", ""]
    items = [["fingerprint", f"`{e.fingerprint}`"]]
    # a durable run's provenance names the bundle itself (and who shipped it): once
    if e.workload_bundle and "workload bundle" not in (provenance or {}):
        items.append(["workload bundle", f"`{e.workload_bundle}`"])
    items.append(["outcomes digest", f"`{report.outcomes_digest}`"])
    items += [[k, v] for k, v in (provenance or {}).items()]
    lines += table(["item", "value"], items)
    return visible("\n".join(lines).rstrip() + "\n")
