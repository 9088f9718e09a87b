"""An experiment over a cohort logs to Braintrust when it is configured, durably on a real
dev server, through the real SDK against a local Braintrust stand-in: one root span (the
plan fingerprint the approver signed, the noise floor, the status) and one child span per
world (its verdict, rescues and harms, forks and tokens), after the ledger's rows; the
approval's nonce is not in it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_fixtures import AgentTestLab
from cohort_lab import cohort_spec, running_cohort_lab
from fake_braintrust import API_KEY, FakeBraintrust, fake_braintrust

from forklab.activities.experiment.evidence_log import BraintrustConfig, EvidenceActivities
from forklab.activities.stores.artifacts import LocalArtifactStore
from forklab.workflows.experiment.messages import Status


@pytest.fixture
def braintrust() -> Iterator[FakeBraintrust]:
    with fake_braintrust() as fake:
        yield fake


async def test_a_cohort_experiment_sends_its_spans(
    agent_lab: AgentTestLab, tmp_path: Path, braintrust: FakeBraintrust
) -> None:
    evidence = EvidenceActivities(
        LocalArtifactStore(tmp_path / "artifacts"),
        tmp_path / "outbox",
        BraintrustConfig(api_key=API_KEY, app_url=braintrust.url, project="cohorts"),
    )
    async with running_cohort_lab(agent_lab, tmp_path, evidence) as cohort:
        ids = await cohort.record(["slow", "slow", "medium"])
        spec = cohort_spec(
            {"workflow_ids": ids, "limit": 3},
            [{"name": "bigger", "role": "treatment", "model": "candidate"}],
        )
        handle = await cohort.start(spec)
        await cohort.approve(handle)
        result = await handle.result()
    assert result.status is Status.completed, result.error
    assert result.evidence_log is not None and result.evidence_log.startswith("sent"), (
        result.evidence_log
    )
    row = cohort.ledger.experiment(spec.id)
    assert row is not None  # the ledger first
    assert len(cohort.ledger.forks(spec.id, row.run_id)) == 18
    [experiment] = braintrust.experiments.values()
    spans = braintrust.spans(experiment["name"])
    (root,) = [s for s in spans if not s.get("span_parents")]
    worlds = [s for s in spans if s.get("span_parents")]
    assert all(s["span_parents"] == [root["span_id"]] for s in worlds)
    assert root["input"]["spec"]["id"] == spec.id
    assert root["metadata"]["plan_fingerprint"] == result.fingerprint
    assert root["metadata"]["approval"]["status"] == "approved"
    assert "nonce" not in root["metadata"]["approval"]
    assert result.report is not None
    assert root["output"]["flip_rate"] == result.report.flip_rate
    assert 0.0 <= root["scores"]["as_expected"] <= 1.0
    (bigger,) = worlds
    line = result.report.worlds[0]
    assert bigger["input"]["world"] == "bigger" and bigger["output"]["verdict"] == line.verdict
    assert bigger["output"]["rescues"] == line.rescues
    assert bigger["metrics"]["forks"] == 9 and bigger["metrics"]["tokens"] > 0
    assert bigger["scores"]["as_expected"] in (0.0, 1.0)
