"""Where ``forklab cohort report`` finds a cohort report's Markdown: in the artifact store
the analysis wrote it to, or, for a report recorded before the Markdown moved there, in
the report itself (an experiment in flight across the upgrade replays its analysis'
recorded result, and a finished one's result is read back as it was recorded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from forklab.activities.stores.artifacts import LocalArtifactStore
from forklab.cli.errors import CliError
from forklab.cli.experiment.cohort_commands import report_markdown
from forklab.contracts.cohort import CohortReport
from forklab.workers.config import Settings
from forklab.workers.stores import artifact_store


def _report(**fields: Any) -> dict[str, Any]:
    return {
        "experiment_id": "exp",
        "runs": 2,
        "forks_per_world": 3,
        "missing_forks": 0,
        "flip_rate": 0.0,
        "flip_ci_low": 0.0,
        "flip_ci_high": 0.5,
        "worlds": [],
        "report_dir": "/nowhere",
        "report_sha256": "0" * 64,
        **fields,
    }


def _settings(tmp_path: Path) -> Settings:
    return Settings.load({"home": tmp_path / "home"}, env={})


def test_a_report_names_its_markdown_in_the_store(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    artifact = artifact_store(settings).put_bytes(b"# exp\n")
    report = CohortReport.model_validate(_report(markdown_artifact=artifact))
    assert report_markdown(settings, "exp", report) == "# exp\n"


def test_a_report_recorded_with_its_markdown_inline_still_reads(tmp_path: Path) -> None:
    # the JSON such a report was recorded as: the Markdown in it, no artifact named
    recorded = CohortReport.model_validate_json(json.dumps(_report(markdown="# old\n")))
    assert report_markdown(_settings(tmp_path), "exp", recorded) == "# old\n"


@pytest.mark.parametrize(
    "fields", [{}, {"markdown": "# both\n", "markdown_artifact": "a" * 64}], ids=["none", "both"]
)
def test_a_report_holds_its_markdown_one_way(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="holds its Markdown or names it in the artifact"):
        CohortReport.model_validate(_report(**fields))


def test_a_markdown_missing_from_this_hosts_store_is_one_sentence(tmp_path: Path) -> None:
    # written to another host's store: this one has never seen it
    elsewhere = LocalArtifactStore(tmp_path / "elsewhere").put_bytes(b"# exp\n")
    report = CohortReport.model_validate(_report(markdown_artifact=elsewhere))
    with pytest.raises(CliError) as info:
        report_markdown(_settings(tmp_path), "exp", report)
    text = str(info.value)
    assert text.startswith("experiment exp's report cannot be read from this host's artifact")
    assert "point FORKLAB_ARTIFACTS at the store its worker writes to" in text
    assert "\n" not in text
