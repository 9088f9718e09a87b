"""Small helpers shared by tests (no fixtures with side effects here)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from forklab.cli.main import dispatch
from forklab.experiments.experiment.spec import ExperimentSpec

ROOT = Path(__file__).resolve().parent.parent


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = dispatch(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def plan_json(capsys: pytest.CaptureFixture[str], spec: Path) -> dict[str, Any]:
    code, out, err = run_cli(capsys, "plan", str(spec), "--json")
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def assert_self_contained(page: str) -> None:
    """The HTML page fetches nothing when viewed: no external sources, links, imports or
    scripts."""
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    assert "@import" not in page and "<script" not in page
    assert not re.search(r"url\((?!#)", page)  # only in-page references such as clip paths


def restart_spec(spec_id: str, seed: int, episodes: int) -> ExperimentSpec:
    """A retry-cascade experiment of two worlds: baseline and ``restart``."""
    return ExperimentSpec.model_validate(
        {
            "id": spec_id,
            "hypothesis": {"text": "h"},
            "seed": seed,
            "episodes": episodes,
            "workload": {"name": "retry-cascade"},
            "worlds": [
                {"name": "baseline", "role": "baseline"},
                {"name": "restart", "role": "treatment", "intervention": {"name": "restart"}},
            ],
        }
    )
