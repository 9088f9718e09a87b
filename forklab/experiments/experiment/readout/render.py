"""The readout section of the report, in Markdown and in HTML.

The prose is ForkLab's (``write``), but it carries names from the spec and the guard's
rule, and the reasons a model's claims were refused quote what the model sent: all of it
is escaped for where it lands, so no part can become markup (a ``<script>``, a
``javascript:`` link, raw HTML, a heading or a table row of the report's own).
"""

from __future__ import annotations

import html

from forklab.experiments.experiment.readout.schema import ReadoutSource, ShownReadout
from forklab.experiments.experiment.report.render_html import READOUT_PLACE
from forklab.experiments.experiment.report.render_markdown import READOUT_BEFORE
from forklab.experiments.visible_text import visible

#: Markdown's inline markup characters, written with a backslash so they stay text;
#: ``<``, ``>`` and ``&`` become entities (no raw HTML, no autolink).
_MARKDOWN = str.maketrans({c: "\\" + c for c in "\\`*[]|"})


def _origin(shown: ShownReadout) -> str:
    if shown.source is ReadoutSource.model:
        return (
            f"Claims by model {shown.model}, each checked against the evidence packet; "
            "the sentences are ForkLab's, from the packet's figures."
        )
    return f"Deterministic readout: {shown.why}."


def _line(text: str) -> str:
    """Text as one visible line of Markdown: a line break in it would let it start a
    heading or a table of the report's own, a control character rewrite the reader's
    terminal, markup a link or a script."""
    flat = visible(" ".join(text.split())).translate(_MARKDOWN)
    return html.escape(flat, quote=False)


def readout_markdown(shown: ShownReadout) -> str:
    r = shown.readout
    lines = ["## Readout", "", f"*{_line(_origin(shown))}*", "", _line(r.summary), ""]
    lines += [
        f"- **{_line(f.world)}** ({f.verdict.value}): {_line(f.statement)}" for f in r.findings
    ]
    if r.caveats:
        lines += ["", *[f"> {_line(c)}" for c in r.caveats]]
    if shown.problems:
        lines += ["", "Why the model's readout was rejected:", ""]
        lines += [f"- {_line(p)}" for p in shown.problems]
    return "\n".join(lines) + "\n"


def readout_html(shown: ShownReadout) -> str:
    r = shown.readout
    e = html.escape
    items = "".join(
        f'<li><strong>{e(f.world)}</strong> <span class="badge {e(f.verdict.value)}">'
        f"{e(f.verdict.value)}</span> {e(f.statement)}</li>"
        for f in r.findings
    )
    parts = [
        '<section id="readout"><h2>Readout</h2>',
        f"<p><em>{e(_origin(shown))}</em></p>",
        f"<p>{e(r.summary)}</p>",
        f"<ul>{items}</ul>",
        *(f"<blockquote>{e(c)}</blockquote>" for c in r.caveats),
    ]
    if shown.problems:
        parts.append("<p>Why the model's readout was rejected:</p><ul>")
        parts += [f"<li>{e(p)}</li>" for p in shown.problems]
        parts.append("</ul>")
    parts.append("</section>")
    return "".join(parts)


def with_readout_markdown(markdown: str, shown: ShownReadout) -> str:
    """The readout section right after the verdicts (before ``READOUT_BEFORE``, a heading
    no text of the report can write: every other line is the report's own, quoted or a
    table row); at the end of a report without that heading."""
    section = readout_markdown(shown)
    marker = f"\n{READOUT_BEFORE}\n"
    head, sep, tail = markdown.partition(marker)
    if not sep:
        return markdown.rstrip("\n") + "\n\n" + section
    return head.rstrip("\n") + "\n\n" + section + "\n" + READOUT_BEFORE + "\n" + tail


def with_readout_html(page: str, shown: ShownReadout) -> str:
    """The readout section at the page's ``READOUT_PLACE``, right under the verdicts (a
    page rendered before there was one: just before the closing ``</body>``)."""
    head, sep, tail = page.partition(READOUT_PLACE)
    if sep:
        return head + readout_html(shown) + tail
    head, sep, tail = page.rpartition("</body>")
    if not sep:
        return page + readout_html(shown)
    return head + readout_html(shown) + "\n" + sep + tail
