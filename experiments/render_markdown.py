"""The report as Markdown (GitHub-flavoured tables), for terminals, PRs and the ledger."""

from __future__ import annotations

import json

from experiments.report import Report, guard_counts_text, interval_text, pvalue_text
from experiments.slices import feature_text


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def render_markdown(report: Report, provenance: dict[str, str] | None = None) -> str:
    """``provenance``, given for a durable run (plan, snapshot, approval, spend, cleanup;
    values are Markdown inline text), becomes a "Durable run" section before the verdicts."""
    e = report.experiment
    pct = f"{round(report.settings.confidence * 100)}%"
    status = "valid" if report.valid else "**INVALID**: a validity check failed"
    lines = [
        f"# Experiment `{e.id}`",
        "",
        f"> {e.hypothesis}",
        "",
        f"Workload `{e.workload}`, seed {e.seed}, {e.episodes} episodes per world. "
        f"Experiment {status}.",
        "",
        f"Fingerprint `{e.fingerprint}`  ",
        f"Outcomes digest `{report.outcomes_digest}`",
        "",
    ]
    if provenance is not None:
        lines += ["## Durable run", ""]
        lines += table(["item", "value"], [[k, v] for k, v in provenance.items()])
        lines.append("")
    lines += ["## Verdicts", ""]
    lines += table(
        ["world", "role", "expected", "verdict", "why"],
        [
            [v.world, v.role.value, v.expected.value, f"**{v.verdict.value}**", v.reason]
            for v in report.verdicts
        ],
    )
    lines += ["", "## Worlds", ""]
    lines += table(
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
    lines += ["", "## Paired comparisons", ""]
    lines += table(
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
    lines += ["", "## Slices", ""]
    for c in report.comparisons:
        effects = c.slice_effects + c.interaction_effects
        if not effects:
            continue
        lines += [f"### {c.world} vs {c.vs}", ""]
        lines += table(
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
    lines += table(
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
    )
    p = report.power
    lines += ["", f"## Power (α {p.alpha:g}, power {p.power:g})", ""]
    lines += table(
        ["world", "episodes", "needed", "note"],
        [[r.world, str(r.episodes), str(r.needed or "—"), r.note] for r in p.rows],
    )
    lines += [f"\n**Warning:** {w}" for w in p.warnings]
    if report.guard is not None:
        g = report.guard
        lines += ["", f"## Guard policy for `{g.world}`", "", f"**{g.words}**", ""]
        lines += ["```json", json.dumps(g.rule, indent=2), "```", ""]
        for label, ev in (("Training", g.training), ("Held-out", g.held_out)):
            lines.append(f"{label} episodes {ev.first_episode}..{ev.last_episode}:")
            lines += [f"- {t}" for t in guard_counts_text(ev)]
            lines.append("")
    if not report.valid:
        lines += ["", "The verdicts above are void: the experiment failed a validity check."]
    return "\n".join(lines).rstrip() + "\n"
