"""The worker's analysis pool starts with the worker: its processes are spawned and ready
to render a report before the first analysis, and one that cannot start stops the worker
before it takes work."""

from __future__ import annotations

import sys
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest

from workers.worker import cpu_pool, start_pool


def _renderer_loaded() -> bool:
    return "matplotlib.backends.backend_svg" in sys.modules


async def test_a_started_pool_renders_its_first_chart_with_matplotlib_loaded() -> None:
    with cpu_pool() as cpu:
        await start_pool(cpu)
        assert cpu.submit(_renderer_loaded).result(timeout=60)


async def test_a_pool_that_cannot_start_stops_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broken matplotlib (first on the path the spawned processes import from)."""
    broken = tmp_path / "matplotlib"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('matplotlib is broken here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with cpu_pool() as cpu, pytest.raises(BrokenProcessPool):
        await start_pool(cpu)
