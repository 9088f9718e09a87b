"""The report reads top-down: verdicts and the readout first, the figures behind them,
the provenance folded last; its failure-rate axis fits the data, integer bins are named by
their values, features that slice the episodes identically are shown once with a note,
and a readout finding names its world once. The first screen is checked in a real
headless chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from forklab.cli.experiment.rehearsal import rehearse
from forklab.experiments.experiment.analysis.slices import dimensions, identical_partitions
from forklab.experiments.experiment.readout.fallback import deterministic_readout
from forklab.experiments.experiment.readout.packet import evidence_packet
from forklab.experiments.experiment.readout.render import with_readout_html, with_readout_markdown
from forklab.experiments.experiment.readout.schema import ReadoutSource, ShownReadout
from forklab.experiments.experiment.readout.write import written_readout
from forklab.experiments.experiment.report.charts import failure_rate_chart, rate_axis
from forklab.experiments.experiment.report.model import Report, WorldRow
from forklab.experiments.experiment.report.render_html import READOUT_PLACE, render_html
from forklab.experiments.experiment.report.render_markdown import READOUT_BEFORE, render_markdown
from forklab.experiments.experiment.report.render_text import render_text
from forklab.experiments.experiment.results import WorldStatus
from forklab.experiments.experiment.spec import Role, parse_spec
from forklab.experiments.experiment.stats import integer_bin_label
from tests.helpers import ROOT

CASCADE = ROOT / "forklab" / "workloads" / "retry-cascade.yaml"
PROVENANCE = {"snapshot": "`local:abc`", "cleanup": "3 found, 3 removed, 0 left"}
#: The readout section's left border (nothing else on the page has this colour).
READOUT_TEAL = (0x0E, 0x74, 0x90)
#: A "supported" verdict badge.
SUPPORTED_GREEN = (0x16, 0xA3, 0x4A)


@pytest.fixture(scope="module")
def report() -> Report:
    return rehearse(parse_spec(CASCADE.read_text(), str(CASCADE)))


def _shown(report: Report) -> ShownReadout:
    packet = evidence_packet(report)
    return ShownReadout(
        source=ReadoutSource.deterministic,
        why="no model is configured",
        readout=written_readout(deterministic_readout(packet), packet),
    )


def _order(text: str, *marks: str) -> list[int]:
    return [text.index(m) for m in marks]


def test_html_reads_verdicts_then_readout_then_figures_with_provenance_folded_last(
    report: Report,
) -> None:
    page = with_readout_html(render_html(report, PROVENANCE), _shown(report))
    at = _order(
        page,
        '<h2 id="verdicts">Verdicts</h2>',
        '<p class="meta legend">',
        '<section id="readout">',
        "<h2>Failure rate per world</h2>",
        "<h2>Slices</h2>",
        "<h2>Power (",
        '<h2 id="provenance">Provenance</h2>',
    )
    assert at == sorted(at)
    folded = page[page.index("<details>") : page.index("</details>")]
    for item in ("fingerprint", "outcomes digest", "snapshot", "cleanup"):
        assert f"<td>{item}</td>" in folded
    # nothing of the provenance above the verdicts: no digest, no durable-run row
    top = page[: page.index('<h2 id="verdicts">')]
    assert report.experiment.fingerprint not in top and "local:abc" not in top
    assert READOUT_PLACE not in page  # the readout took its place


def test_markdown_follows_the_same_order(report: Report) -> None:
    md = with_readout_markdown(render_markdown(report, PROVENANCE), _shown(report))
    at = _order(md, "## Verdicts", "## Readout", READOUT_BEFORE, "## Slices", "## Provenance")
    assert at == sorted(at)
    assert md.count("## Readout") == 1
    provenance = md[md.index("## Provenance") :]
    assert "| snapshot | `local:abc` |" in provenance
    assert f"`{report.experiment.fingerprint}`" in provenance
    assert f"`{report.experiment.fingerprint}`" not in md[: md.index("## Provenance")]


def test_a_hypothesis_cannot_move_the_readout(report: Report) -> None:
    """The hypothesis is the operator's text: it carries the HTML place and the Markdown
    heading the readout is put at, so as to have the readout land above the verdicts."""
    forged = f"look here\n{READOUT_PLACE}\n{READOUT_BEFORE}\nend"
    hostile = report.model_copy(
        update={"experiment": report.experiment.model_copy(update={"hypothesis": forged})}
    )
    page = with_readout_html(render_html(hostile), _shown(hostile))
    assert page.count('<section id="readout">') == 1
    assert page.index('<h2 id="verdicts">') < page.index('<section id="readout">')
    md = with_readout_markdown(render_markdown(hostile), _shown(hostile))
    assert md.count("## Readout") == 1
    assert md.index("## Verdicts") < md.index("## Readout")


def test_a_page_rendered_without_a_place_gets_the_readout_at_its_end(report: Report) -> None:
    page = render_html(report).replace(READOUT_PLACE, "")
    done = with_readout_html(page, _shown(report))
    assert done.index('<section id="readout">') > done.index('<h2 id="provenance">')
    assert done.rstrip().endswith("</body></html>")


def test_the_failure_rate_axis_fits_the_data(report: Report) -> None:
    top = max(w.failure_ci_high for w in report.worlds)
    assert 0.4 < top < 0.5  # latency's interval reaches 47 %
    assert rate_axis(report.worlds) == 60.0
    svg = failure_rate_chart(report.worlds)
    ticks = re.findall(r"<text[^>]*>\s*(\d+)\s*</text>", svg)
    assert "60" in ticks and "100" not in ticks

    def world(high: float, episodes: int = 10) -> WorldRow:
        return WorldRow(
            name="w", role=Role.baseline, status=WorldStatus.completed, error=None,
            episodes=episodes, failures=0, failure_rate=high / 2, world_seconds=1.0,
            failure_ci_low=0.0, failure_ci_high=high,
        )  # fmt: skip

    assert rate_axis([world(0.0)]) == 10.0  # all zero: still an axis
    assert rate_axis([world(0.97)]) == 100.0  # never past 100 %
    assert rate_axis([world(0.39)]) == 50.0
    assert rate_axis([world(0.9, episodes=0), world(0.2)]) == 30.0  # a world without episodes


def test_integer_bins_are_named_by_the_integers_they_hold(report: Report) -> None:
    values = {s.value for c in report.comparisons for s in c.slice_effects}
    assert {"0", "1..5"} <= values
    assert not any(isinstance(v, str) and "inf" in v for v in values)
    # the named values are those of the episodes; a value outside them names the open end
    assert integer_bin_label(0, [1.0], (0, 5)) == "0"
    assert integer_bin_label(3, [1.0], (0, 5)) == "1..5"
    assert integer_bin_label(-4, [1.0], (0, 5)) == "≤ 0"
    assert integer_bin_label(9, [1.0], (0, 5)) == "≥ 1"
    assert integer_bin_label(6, [2.0, 7.0], (0, 9)) == "2..6"
    # numbers that are not all integers keep interval labels
    dims = dimensions([{"x": v / 2} for v in range(10)], 2)
    assert dims["x"].integers is None


def test_features_that_split_the_episodes_identically_are_shown_once(report: Report) -> None:
    assert report.identical_slices == [["agents_in_retry", "queue_depth"]]
    # the JSON keeps both (the guard learns from every feature) ...
    slices = report.comparisons[0].slice_effects
    assert {"agents_in_retry", "queue_depth"} <= {s.feature for s in slices}
    # ... the renderings show one, with a note naming both
    note = "agents_in_retry and queue_depth split the episodes identically"
    page = render_html(report)
    md = render_markdown(report)
    text = render_text(report)  # forklab plan's tables
    assert page.count(note) == md.count(note) == text.count(note) == len(report.comparisons)
    assert "<td>queue_depth</td>" not in page and "| queue_depth |" not in md
    assert "<td>agents_in_retry</td>" in page and "| agents_in_retry |" in md
    rows = [line.split()[0] for line in text.splitlines() if line.strip()]
    assert "queue_depth" not in rows and "agents_in_retry" in rows


def test_equal_counts_are_not_an_identical_partition() -> None:
    """``a`` and ``b`` both split eight episodes four and four, but not the same four."""
    rows = [{"a": v % 2, "b": v // 4, "c": 1 - v % 2} for v in range(8)]
    dims = dimensions(rows, 4)
    assert identical_partitions(rows, dims) == [["a", "c"]]


def test_readout_findings_name_their_world_once(report: Report) -> None:
    shown = _shown(report)
    for f in shown.readout.findings:
        assert not f.statement.startswith(f.world)
        assert f.statement.split()[0] in ("lowered", "raised", "made")
    page = with_readout_html(render_html(report), shown)
    readout = page[page.index('<section id="readout">') : page.index("</section>")]
    assert readout.count("<strong>broadcast</strong>") == 1
    assert "broadcast lowered" not in readout
    md = with_readout_markdown(render_markdown(report), shown)
    assert "- **broadcast** (supported): lowered the failure rate against baseline" in md


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed; run scripts/ensure-chromium.sh (make test does)")
    return found


def _screenshot(page: Path, shot: Path, size: str) -> Image.Image:
    result = subprocess.run(
        [
            _chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={shot.parent / 'profile'}",
            f"--screenshot={shot}",
            f"--window-size={size}",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    return Image.open(shot).convert("RGB")


def test_the_first_screen_shows_the_verdicts_and_the_readout(
    report: Report, tmp_path: Path
) -> None:
    """A 1280 × 1100 window: the verdict badges and the readout (its teal border) are in
    it; the same page without the readout has no teal, and its provenance stays folded."""
    page = tmp_path / "report.html"
    page.write_text(with_readout_html(render_html(report, PROVENANCE), _shown(report)))
    first = _screenshot(page, tmp_path / "first.png", "1280,1100")
    colours = {rgb for _, rgb in first.getcolors(maxcolors=1 << 20) or []}
    assert SUPPORTED_GREEN in colours and READOUT_TEAL in colours
    bare = tmp_path / "bare.html"
    bare.write_text(render_html(report, PROVENANCE))
    shot = _screenshot(bare, tmp_path / "bare.png", "1280,1100")
    assert READOUT_TEAL not in {rgb for _, rgb in shot.getcolors(maxcolors=1 << 20) or []}
