"""The HTML report is self-contained and renders its charts in a real headless browser."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from experiments.plan import rehearse
from experiments.report.render_html import render_html
from experiments.spec import parse_spec
from tests.helpers import ROOT, assert_self_contained

RECOVERY = ROOT / "experiments" / "recovery-counter.yaml"
#: The bar colours of the rescues-vs-harms chart (used nowhere else on the page).
RESCUE_GREEN = (0x05, 0x96, 0x69)
HARM_RED = (0xE1, 0x1D, 0x48)


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed; run scripts/ensure-chromium.sh (make test does)")
    return found


def _report_html() -> str:
    return render_html(rehearse(parse_spec(RECOVERY.read_text(), str(RECOVERY))))


def test_html_references_nothing_outside_the_page() -> None:
    page = _report_html()
    assert page.count("<svg") == 3  # failure rates, rescues vs harms, guard slices
    assert_self_contained(page)
    assert "apply refresh only when obs_repeated is true" in page
    assert "inconclusive" in page and "McNemar p" in page


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
