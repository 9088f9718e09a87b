"""The HTML report is self-contained and renders its charts in a real headless browser."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from forklab.cli.experiment.rehearsal import rehearse
from forklab.experiments.experiment.analysis.slices import SliceEffect
from forklab.experiments.experiment.report.charts import difference_axis
from forklab.experiments.experiment.report.model import Report
from forklab.experiments.experiment.report.render_html import render_html
from forklab.experiments.experiment.spec import parse_spec
from tests.helpers import ROOT, assert_self_contained

RECOVERY = ROOT / "forklab" / "workloads" / "recovery-counter.yaml"
#: The bar colours of the rescues-vs-harms chart (used nowhere else on the page).
RESCUE_GREEN = (0x05, 0x96, 0x69)
HARM_RED = (0xE1, 0x1D, 0x48)
#: The banner colours of the header (validity, hypothesis).
VALID_GREEN = (0x16, 0xA3, 0x4A)
NOT_SUPPORTED_AMBER = (0xCA, 0x8A, 0x04)


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed; run scripts/ensure-chromium.sh (make test does)")
    return found


def _report() -> Report:
    return rehearse(parse_spec(RECOVERY.read_text(), str(RECOVERY)))


def _report_html() -> str:
    return render_html(_report())


def test_html_references_nothing_outside_the_page() -> None:
    report = _report()
    page = render_html(report)
    # failure rates, rescues vs harms, and one slice chart for every comparison
    assert len(report.comparisons) == 3
    assert page.count("<svg") == 2 + 3
    assert_self_contained(page)
    assert "apply refresh only when obs_repeated is true" in page
    assert "inconclusive" in page and "McNemar p" in page


def test_html_header_separates_valid_from_supported() -> None:
    page = render_html(_report())
    assert '<p class="banner pass">Valid: every validity check passed.</p>' in page
    assert (
        '<p class="banner inconclusive">Hypothesis partly supported: 1 of 2 predictions '
        "supported; refresh inconclusive.</p>" in page
    )
    assert "every validity check passed" not in page.split("Hypothesis")[1]


def test_html_hashes_are_short_on_screen_and_whole_when_copied() -> None:
    report = _report()
    page = render_html(report, {"snapshot": f"`local:{report.experiment.code_digest}`"})
    for value in (
        report.experiment.fingerprint,
        report.outcomes_digest,
        f"local:{report.experiment.code_digest}",
    ):
        assert f'<code class="hash" title="{value}">{value}</code>' in page
    assert "code.hash{display:inline-block;max-width:13ch;overflow:hidden" in page
    assert "white-space:nowrap" in page


def test_slice_axes_fit_the_data_and_keep_zero() -> None:
    def effect(low: float, high: float) -> SliceEffect:
        return SliceEffect(
            feature="f", value=1, rescue=1, harm=0, unchanged=0, net=1, n=1,
            difference=(low + high) / 2, ci_low=low, ci_high=high, clause={},
        )  # fmt: skip

    low, high = difference_axis([effect(0.01, 0.05), effect(0.02, 0.04)])
    assert low < 0.0 < 0.01 and 0.05 < high < 0.1  # zero in view, no [-1, 1] squash
    low, high = difference_axis([effect(-0.9, 0.95)])
    assert (low, high) == (-1.0, 1.0)


def test_html_renders_charts_in_headless_chromium(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(_report_html(), encoding="utf-8")
    shot = tmp_path / "shot.png"
    profile = tmp_path / "profile"
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
            f"--user-data-dir={profile}",
            f"--screenshot={shot}",
            "--window-size=1280,2000",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 2000)
    colours = image.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50, f"screenshot looks blank: {len(colours)} colours"
    present = {rgb for _, rgb in colours}
    assert RESCUE_GREEN in present and HARM_RED in present
    # the header's two banners: valid (green) apart from "hypothesis not supported" (amber)
    assert VALID_GREEN in present and NOT_SUPPORTED_AMBER in present
