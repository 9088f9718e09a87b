"""The report as terminal text: aligned tables, one section after another."""

from __future__ import annotations

import json

from forklab.experiments.experiment.report.model import Report
from forklab.experiments.experiment.report.sequential_text import sequential_lines
from forklab.experiments.experiment.report.tables import (
    Table,
    comparisons_table,
    guard_counts_text,
    hypothesis_text,
    shown_slices,
    slices_table,
    validity_text,
    worlds_table,
)
from forklab.experiments.experiment.results import CheckKind
from forklab.experiments.visible_text import visible


def _indented(text: str, indent: int) -> str:
    """``text`` with every line after the first indented by ``indent`` spaces (blank ones
    left blank): no line of a hypothesis can pass for a line of the report."""
    first, *rest = text.splitlines() or [""]
    return "\n".join([first, *(" " * indent + line if line else "" for line in rest)])


def text_table(t: Table) -> list[str]:
    widths = [max([len(h), *(len(r[i]) for r in t.rows)]) for i, h in enumerate(t.headers)]
    out = [
        "  ".join(h.ljust(w) for h, w in zip(t.headers, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    out += [
        "  ".join(
            c.rjust(w) if i in t.numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in t.rows
    ]
    return out


def votes_text(report: Report) -> list[str]:
    """What majority votes that stop once decided saved, world by world."""
    s = report.settings
    if not s.forks_saved:
        return []
    n, k = report.experiment.episodes, s.forks_per_checkpoint
    parts = [
        f"{world} {saved:,} of {n * k:,} ({saved / (n * k):.1%})"
        for world, saved in s.forks_saved.items()
    ]
    return [
        f"forks saved by majority votes decided early (of {k} per checkpoint): " + ", ".join(parts)
    ]


def render_text(report: Report) -> str:
    e = report.experiment
    lines = [
        f"experiment {e.id}  ({e.workload}, seed {e.seed}, {e.episodes} episodes per world)",
        f"hypothesis  {_indented(e.hypothesis, 12)}",
        f"fingerprint {e.fingerprint}",
        *([f"workload bundle {e.workload_bundle}"] if e.workload_bundle else []),
        validity_text(report)[1],
        hypothesis_text(report)[1],
        "",
    ]
    lines += text_table(worlds_table(report))
    lines += votes_text(report)
    lines.append("")
    lines += text_table(comparisons_table(report))
    for c in report.comparisons:
        effects = c.slice_effects + c.interaction_effects
        if effects:
            shown, notes = shown_slices(report, effects)
            lines += ["", f"slices: {c.world} vs {c.vs}", *(f"  {n}" for n in notes)]
            lines += text_table(slices_table(report, shown))
    lines += ["", "validity checks"]
    lines += [
        f"  [{'PASS' if c.passed else 'FAIL'}] {c.name}: {c.reason}"
        for c in report.checks
        if c.kind is CheckKind.validity
    ]
    lines += ["", "verdicts"]
    lines += [f"  {v.world}: {v.verdict.value.upper()} ({v.reason})" for v in report.verdicts]
    if report.guard is not None:
        g = report.guard
        state = "VALIDATED" if g.validated else "NOT VALIDATED"
        lines.append(f"  guard policy for {g.world}: {state} ({g.validation})")
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
    if report.sequential is not None:
        head, *rest = sequential_lines(report.sequential)
        lines += ["", f"sequential design ({head})", *(f"  {t}" for t in rest)]
    if report.guard is not None:
        g = report.guard
        cap = "harms ≤ rescues per slice" if g.harm_cap is None else f"harm cap {g.harm_cap}"
        lines += ["", f"guard policy for {g.world} (learned on {g.basis}, {cap})"]
        lines += [f"  {g.words}", f"  rule {json.dumps(g.rule, separators=(', ', ': '))}"]
        lines += [f"  {g.validation}"]
        for label, ev in (("training", g.training), ("held-out", g.held_out)):
            lines += [f"  {label} episodes {ev.first_episode}..{ev.last_episode}:"]
            lines += [f"    {t}" for t in guard_counts_text(ev)]
    if report.workspaces is not None:
        ws = report.workspaces
        lines += ["", f"workspaces (files each world changed, of {ws.episodes} episodes)"]
        lines += [
            f"  {w.world}: {w.changed} changed, {w.added} added, {w.removed} removed in "
            f"{w.episodes_diverged} of {ws.episodes} episodes"
            + (f"; most: {', '.join(p.path for p in w.paths[:3])}" if w.paths else "")
            for w in ws.worlds
        ]
    lines += ["", f"outcomes digest {report.outcomes_digest}"]
    lines.append("VALID" if report.valid else "INVALID: a validity check failed")
    return visible("\n".join(lines))
