"""The report as one self-contained HTML page: inline CSS and inline SVG charts.

Nothing is fetched when the page is viewed (no scripts, fonts, images or styles from
elsewhere), so it opens the same from an artifact store, an e-mail or a closed network.
"""

from __future__ import annotations

import json
import re
from html import escape

from forklab.experiments.experiment.analysis.guard import GuardPolicy
from forklab.experiments.experiment.analysis.verdicts import Verdict
from forklab.experiments.experiment.report.charts import (
    failure_rate_chart,
    rescue_harm_chart,
    slice_forest_chart,
)
from forklab.experiments.experiment.report.model import Report
from forklab.experiments.experiment.report.sequential_text import sequential_lines
from forklab.experiments.experiment.report.tables import (
    Table,
    comparisons_table,
    evidence_table,
    guard_verdict_row,
    hypothesis_text,
    power_table,
    shown_slices,
    slices_table,
    validity_text,
    worlds_table,
)
from forklab.experiments.experiment.sequential import SequentialReport
from forklab.experiments.experiment.spec import Role
from forklab.experiments.experiment.workspace_report import WorkspaceSection
from forklab.experiments.visible_text import visible

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2rem auto;max-width:1100px;
color:#111827;background:#f9fafb;padding:0 1rem}
h1{margin-bottom:.2rem}h2{margin-top:2rem;border-bottom:2px solid #e5e7eb;padding-bottom:.2rem}
.meta{color:#4b5563;font-size:.9rem}code{font-size:.85rem}
table{border-collapse:collapse;margin:.6rem 0;background:#fff;font-size:.9rem}
th,td{border:1px solid #e5e7eb;padding:.3rem .6rem;text-align:left}
th{background:#f3f4f6}td.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;padding:.1rem .5rem;border-radius:.8rem;color:#fff;font-weight:600}
.supported,.pass{background:#16a34a}.refuted,.fail{background:#dc2626}
.inconclusive{background:#ca8a04}.invalid{background:#7f1d1d}
.banner{padding:.5rem 1rem;border-radius:.4rem;color:#fff;font-weight:600;margin:.4rem 0}
.notjudged{background:#6b7280}
code.hash{display:inline-block;max-width:13ch;overflow:hidden;text-overflow:ellipsis;
white-space:nowrap;vertical-align:bottom}
.warn{background:#fef3c7;border-left:4px solid #d97706;padding:.4rem .8rem;margin:.4rem 0}
.chart{background:#fff;border:1px solid #e5e7eb;margin:.6rem 0;padding:.4rem}
.chart svg{width:100%;max-width:820px;height:auto}
pre{background:#111827;color:#f9fafb;padding:.7rem;border-radius:.4rem;overflow:auto}
.legend .badge{font-size:.75rem}details summary{cursor:pointer;color:#1d4ed8;margin:.4rem 0}
#readout{background:#fff;border:1px solid #e5e7eb;border-left:6px solid #0e7490;
border-radius:.4rem;padding:0 1rem .6rem}#readout h2{margin-top:.6rem}
"""


def _num(text: str) -> str:
    return f'<td class="num">{escape(text)}</td>'


def _table(headers: list[str], rows: list[list[str]], numeric: set[int]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(_num(c) if i in numeric else f"<td>{c}</td>" for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _shared(t: Table) -> str:
    """A shared table: text cells escaped here, numeric cells by ``_num``."""
    rows = [[c if i in t.numeric else escape(c) for i, c in enumerate(row)] for row in t.rows]
    return _table(t.headers, rows, set(t.numeric))


def _badge(text: str, css: str) -> str:
    return f'<span class="badge {css}">{escape(text)}</span>'


def _hash(value: str) -> str:
    """A digest, shortened on screen: the full value is the text (so copying it copies
    all of it) and the tooltip; CSS cuts what shows and never wraps it."""
    return f'<code class="hash" title="{escape(value)}">{escape(value)}</code>'


_HEX = re.compile(r"(?:[a-z]+:)?[0-9a-f]{24,}")


def _inline(markdown: str) -> str:
    """Markdown inline text as HTML: escaped, with `code` spans kept as code (digests
    shortened like every other hash on the page)."""

    def code(match: re.Match[str]) -> str:
        text = match.group(1)  # already escaped
        return _hash(text) if _HEX.fullmatch(text) else f"<code>{text}</code>"

    return re.sub(r"`([^`]+)`", code, escape(markdown))


def _guard_row(report: Report) -> list[list[str]]:
    row = guard_verdict_row(report)
    if row is None:
        return []
    css = Verdict.supported.value if report.guard and report.guard.validated else "refuted"
    return [[escape(row[0]), escape(row[1]), escape(row[2]), _badge(row[3], css), escape(row[4])]]


#: Where the readout section goes (``forklab.experiments.experiment.readout.render``):
#: right under the verdicts. Every text of the page is escaped, so no name, hypothesis or
#: error can write this comment and move the readout.
READOUT_PLACE = "<!-- forklab:readout -->"


def _provenance(report: Report, provenance: dict[str, str] | None) -> str:
    """Digests and, for a durable run, plan, snapshot, approval, spend and cleanup: what a
    reader checks after the findings, folded so it does not fill the first screen."""
    e = report.experiment
    rows = [["fingerprint", _hash(e.fingerprint)]]
    # a durable run's provenance names the bundle itself (and who shipped it): once
    if e.workload_bundle and "workload bundle" not in (provenance or {}):
        rows.append(["workload bundle", _hash(e.workload_bundle)])
    rows.append(["outcomes digest", _hash(report.outcomes_digest)])
    rows += [[escape(k), _inline(v)] for k, v in (provenance or {}).items()]
    what = (
        "the durable run: plan, snapshot, approval, budget, isolation, cleanup"
        if provenance is not None
        else "fingerprint and digests"
    )
    return "\n".join(
        [
            '<h2 id="provenance">Provenance</h2>',
            f"<details><summary>Show {what}</summary>",
            _table(["item", "value"], rows, set()),
            "</details>",
        ]
    )


def _slices(report: Report) -> list[str]:
    parts = ["<h2>Slices</h2>"]
    guard_vs = next((w.name for w in report.worlds if w.role is Role.baseline), "")
    for c in report.comparisons:
        effects, notes = shown_slices(report, c.slice_effects + c.interaction_effects)
        if not effects:
            continue
        parts.append(f"<h3>{escape(c.world)} vs {escape(c.vs)}</h3>")
        parts += [f'<p class="meta note">{escape(n)}</p>' for n in notes]
        learns = report.guard is not None and (c.world, c.vs) == (report.guard.world, guard_vs)
        title = f"{c.world} vs {c.vs}" + (": the slices the guard learns from" if learns else "")
        parts.append(f'<div class="chart">{slice_forest_chart(title, effects)}</div>')
        parts.append(_shared(slices_table(report, effects)))
    return parts


def render_html(report: Report, provenance: dict[str, str] | None = None) -> str:
    """The page reads top-down: what was tested, whether it is valid and what held (the
    verdicts, then the readout when one is added at ``READOUT_PLACE``), the figures behind
    them, and last, folded, the provenance: digests and, given ``provenance`` (a durable
    run's; values are Markdown inline text, as for ``render_markdown``), the run's own."""
    e = report.experiment
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>ForkLab report: {escape(e.id)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Experiment <code>{escape(e.id)}</code></h1>",
        f'<p class="meta">{escape(e.hypothesis)}</p>',
        f'<p class="meta">workload <code>{escape(e.workload)}</code>, seed {e.seed}, '
        f'{e.episodes} episodes per world · <a href="#provenance">provenance</a></p>',
    ]
    valid, validity = validity_text(report)
    parts.append(f'<p class="banner {"pass" if valid else "fail"}">{escape(validity)}</p>')
    supported, hypothesis = hypothesis_text(report)
    css = {True: "supported", False: "inconclusive", None: "notjudged"}[supported]
    parts.append(f'<p class="banner {css}">{escape(hypothesis)}</p>')
    parts.append('<h2 id="verdicts">Verdicts</h2>')
    parts.append(
        _table(
            ["world", "role", "expected", "verdict", "why"],
            [
                [
                    escape(v.world),
                    v.role.value,
                    v.expected.value,
                    _badge(v.verdict.value, v.verdict.value),
                    escape(v.reason),
                ]
                for v in report.verdicts
            ]
            + _guard_row(report),
            set(),
        )
    )
    parts.append(
        f'<p class="meta legend">{_badge("supported", Verdict.supported.value)} interval '
        "and Holm p on the expected side · "
        f"{_badge('refuted', Verdict.refuted.value)} the same on the other side · "
        f"{_badge('inconclusive', Verdict.inconclusive.value)} the interval crosses zero or "
        f"p is not small enough · {_badge('invalid', Verdict.invalid.value)} a validity "
        "check failed</p>"
    )
    parts.append(READOUT_PLACE)
    parts += [
        "<h2>Failure rate per world</h2>",
        f'<div class="chart">{failure_rate_chart(report.worlds)}</div>',
    ]
    parts.append(_shared(worlds_table(report)))
    parts += [
        "<h2>Rescues and harms per comparison</h2>",
        f'<div class="chart">{rescue_harm_chart(report.comparisons)}</div>',
    ]
    parts.append(_shared(comparisons_table(report)))
    parts += _slices(report)
    parts.append("<h2>Checks</h2>")
    parts.append(
        _table(
            ["check", "kind", "result", "reason"],
            [
                [
                    escape(c.name),
                    c.kind.value,
                    _badge("pass", "pass") if c.passed else _badge("fail", "fail"),
                    escape(c.reason),
                ]
                for c in report.checks
            ],
            set(),
        )
    )
    parts.append("<h2>Evidence per world-second</h2>")
    parts.append(
        '<p class="meta">Information is −log10 of the exact McNemar p against the baseline; '
        "the rate divides it by the world-seconds the world consumed.</p>"
    )
    parts.append(_shared(evidence_table(report)))
    p = report.power
    parts.append(f"<h2>Power (α {p.alpha:g}, power {p.power:g})</h2>")
    parts += [f'<p class="warn">{escape(w)}</p>' for w in p.warnings]
    parts.append(_shared(power_table(report)))
    if report.sequential is not None:
        parts += _sequential(report.sequential)
    if report.guard is not None:
        parts += _guard(report.guard)
    if report.workspaces is not None:
        parts.append(_workspaces(report.workspaces))
    parts.append(_provenance(report, provenance))
    parts.append("</body></html>")
    return visible("\n".join(parts) + "\n")  # a name or an error cannot reorder the page


def _sequential(s: SequentialReport) -> list[str]:
    """The design as signed, each world's path look by look (counts, statistic against the
    boundary, decision), where it stopped, and the compute saved."""
    head, *paths, saving = sequential_lines(s)
    rows = [
        [
            escape(p.world),
            str(lk.look),
            str(lk.episodes),
            str(lk.rescue),
            str(lk.harm),
            f"{lk.statistic:+.3f}",
            f"±{lk.boundary:.3f}",
            "" if lk.conditional_power is None else f"{lk.conditional_power:.3g}",
            escape(lk.decision.value),
        ]
        for p in s.worlds
        for lk in p.looks
    ]
    return [
        "<h2>Sequential design</h2>",
        f'<p class="meta">{escape(head)}.</p>',
        "<ul>",
        *(f"<li>{escape(t)}</li>" for t in paths),
        "</ul>",
        _table(
            [
                "world",
                "look",
                "episodes",
                "rescue",
                "harm",
                "Z",
                "boundary",
                "cond. power",
                "decision",
            ],
            rows,
            {1, 2, 3, 4, 5, 6, 7},
        ),
        f"<p>{escape(saving)}</p>",
    ]


def _guard(g: GuardPolicy) -> list[str]:
    parts = [
        f"<h2>Guard policy for <code>{escape(g.world)}</code></h2>",
        f"<p><strong>{escape(g.words)}</strong> (learned on {escape(g.basis)})</p>",
        f'<p class="{"meta" if g.validated else "warn"}">{escape(g.validation)}</p>',
        f"<pre>{escape(json.dumps(g.rule, indent=2))}</pre>",
    ]
    rows = []
    for label, ev in (("training", g.training), ("held-out", g.held_out)):
        for mode, k in (("always", ev.before), ("guarded", ev.after)):
            rows.append(
                [
                    f"{label} {ev.first_episode}..{ev.last_episode}",
                    mode,
                    str(k.intervened),
                    str(k.rescue),
                    str(k.harm),
                    f"{k.net:+d}",
                ]
            )
    parts.append(
        _table(["episodes", "policy", "intervened", "rescue", "harm", "net"], rows, {2, 3, 4, 5})
    )
    return parts


def _workspaces(section: WorkspaceSection) -> str:
    """The "Workspaces" section: per world, files at the branch and at the end, and what
    diverged (the manifests themselves are files next to the report)."""
    rows = [
        [
            escape(w.world),
            f"{w.files_at_branch} → {w.files_at_end}",
            f"{w.bytes_at_branch} → {w.bytes_at_end}",
            str(w.added),
            str(w.changed),
            str(w.removed),
            f"{w.episodes_diverged} of {section.episodes}",
            ", ".join(
                f"<code>{escape(p.path)}</code> ×{p.added + p.changed + p.removed}" for p in w.paths
            )
            or "none",
        ]
        for w in section.worlds
    ]
    files = ", ".join(f"<code>{escape(f)}</code>" for f in section.files)
    return "\n".join(
        [
            "<h2>Workspaces</h2>",
            f'<p class="meta">Every world forked each of {section.episodes} episodes from the '
            f"files its prefix left (manifest <code>{section.branch_manifest[:16]}</code>); "
            f"the manifests and diffs (path, size, md5, sha256) are next to this report: "
            f"{files}.</p>",
            _table(
                [
                    "world",
                    "files at branch → end",
                    "bytes at branch → end",
                    "added",
                    "changed",
                    "removed",
                    "episodes diverged",
                    "most changed paths",
                ],
                rows,
                {3, 4, 5},
            ),
        ]
    )
