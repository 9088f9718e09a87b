"""The worker's analysis pool starts with the worker: its processes are spawned and ready
to render a report before the first analysis, and one that cannot start stops the worker
before it takes work."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from forklab.workers.experiment.worker import AnalysisPoolError, cpu_pool, start_pool
from tests.helpers import run_cli


def _renderer_loaded() -> bool:
    return "matplotlib.backends.backend_svg" in sys.modules


async def test_a_started_pool_renders_its_first_chart_with_matplotlib_loaded() -> None:
    with cpu_pool() as cpu:
        await start_pool(cpu)
        assert cpu.submit(_renderer_loaded).result(timeout=60)


def _break_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A matplotlib that fails to import, first on the path spawned processes import from."""
    broken = tmp_path / "broken" / "matplotlib"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('matplotlib is broken here')\n")
    monkeypatch.syspath_prepend(str(broken.parent))


async def test_a_pool_that_cannot_start_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _break_matplotlib(tmp_path, monkeypatch)
    with cpu_pool() as cpu, pytest.raises(AnalysisPoolError, match="could not start"):
        await start_pool(cpu)


def test_forklab_worker_with_a_broken_install_stops_before_it_connects(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One sentence, exit 1, and not the "cannot connect" of a missing server."""
    _break_matplotlib(tmp_path, monkeypatch)
    monkeypatch.setenv("FORKLAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FORKLAB_ADDRESS", "127.0.0.1:9")  # nothing listens: never reached
    code, _, err = run_cli(capsys, "worker")
    assert code == 1, err
    assert "the worker's analysis processes could not start" in err
    assert "cannot connect" not in err
