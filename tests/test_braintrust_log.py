"""The Braintrust evidence log through the real ``braintrust`` SDK against a local server
speaking its endpoints: the span tree and scores it receives, and an outage that queues
the trace (reported in status) without failing or losing the experiment."""

from __future__ import annotations

from collections.abc import AsyncIterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import pytest
from fake_braintrust import API_KEY, FakeBraintrust, fake_braintrust
from orchestration_lab import Lab, lab_settings, make_spec
from temporalio.testing import WorkflowEnvironment

from forklab.experiments.experiment.evidence_scores import SCORE_NAMES
from forklab.workers.config import ConfigError
from forklab.workers.experiment.providers import BRAINTRUST_WITH_KEY, braintrust_config
from forklab.workers.experiment.worker import build_worker
from forklab.workflows.experiment.messages import ExperimentResult, Status
from tests.helpers import run_cli


@pytest.fixture
async def bt_lab(
    temporal_env: WorkflowEnvironment,
    cpu: Executor,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[Lab, FakeBraintrust]]:
    with fake_braintrust() as fake:
        monkeypatch.setenv("BRAINTRUST_API_KEY", API_KEY)
        monkeypatch.setenv("BRAINTRUST_APP_URL", fake.url)
        settings = lab_settings(temporal_env, tmp_path / "home")
        async with build_worker(temporal_env.client, settings, cpu):
            yield Lab(client=temporal_env.client, settings=settings), fake


async def _run(lab: Lab, **fields: Any) -> ExperimentResult:
    spec = make_spec(**fields)
    handle, token = await lab.start(spec)
    await lab.approve(handle, token)
    result = await handle.result()
    assert result.status is Status.completed, result.error
    return result


def _tree(fake: FakeBraintrust, experiment: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    spans = fake.spans(experiment)
    roots = [s for s in spans if not s.get("span_parents")]
    assert len(roots) == 1, spans
    root = roots[0]
    children = [s for s in spans if s.get("span_parents")]
    assert all(c["span_parents"] == [root["span_id"]] for c in children)
    assert all(c["root_span_id"] == root["root_span_id"] for c in children)
    return root, children


async def test_span_tree_and_scores(bt_lab: tuple[Lab, FakeBraintrust]) -> None:
    lab, fake = bt_lab
    # a positive control that is no control: boosting lowers failures, so its pre-registered
    # increase fails to show and its check scores 0
    worlds = make_spec().model_dump(mode="json")["worlds"]
    control = {"name": "control", "role": "positive_control", "intervention": {"name": "boost"}}
    result = await _run(lab, worlds=[*worlds, control])
    assert result.evidence_log is not None and result.evidence_log.startswith("sent"), (
        result.evidence_log
    )
    run_id = lab.ledger.experiment(result.experiment_id)
    assert run_id is not None  # the local ledger is written as well
    [experiment] = fake.experiments.values()
    root, children = _tree(fake, experiment["name"])

    assert root["input"]["hypothesis"] == "boosting wins more episodes"
    assert root["input"]["spec"]["id"] == result.experiment_id
    meta = root["metadata"]
    assert meta["plan_fingerprint"] == result.plan_fingerprint
    assert meta["budget"]["max_world_seconds"] == 300
    assert meta["approval"]["status"] == "approved" and "token_sha256" not in meta["approval"]
    scores = root["scores"]
    assert set(scores) <= set(SCORE_NAMES)
    assert {"completion", "workload_identity", "common_snapshot", "common_random_numbers"} <= set(
        scores
    )
    assert {"placebo_fidelity", "infrastructure_fit", "intervention_effect"} <= set(scores)
    assert all(0.0 <= v <= 1.0 for v in scores.values())
    assert scores["completion"] == 1.0 and scores["common_snapshot"] == 1.0
    assert scores["positive_control_direction"] == 0.0

    assert sorted(c["input"]["world"] for c in children) == [
        "baseline",
        "boost",
        "control",
        "placebo",
    ]
    # the local backend's sandbox ids: one per chunk (24 episodes in batches of 12), the
    # worlds of a chunk in one (two chunks fill the two slots); test_daytona_flow matches
    # them against the ids Daytona handed out
    ran = [c["metadata"]["sandbox_ids"] for c in children]
    assert all(len(ids) == len(set(ids)) == 2 for ids in ran)
    assert all(ids == ran[0] for ids in ran) and all(i.startswith("lsb-") for i in ran[0])
    for child in children:
        assert child["metadata"]["snapshot_id"] == result.snapshot_id
        assert child["metadata"]["inherited_checkpoint_digests"]
        assert child["metrics"]["world_seconds"] > 0
        assert child["output"]["episodes"] == 24
        assert child["scores"]["completion"] == 1.0
        assert all(0.0 <= v <= 1.0 for v in child["scores"].values())
    # each world's score is its part of the experiment's check; the failed control makes
    # the run invalid, so the treatment claims no effect, but the placebo still held
    by_world = {c["input"]["world"]: c["scores"] for c in children}
    assert by_world["control"]["positive_control_direction"] == 0.0
    assert by_world["placebo"]["placebo_fidelity"] == scores["placebo_fidelity"] == 1.0
    assert by_world["boost"]["intervention_effect"] == scores["intervention_effect"] == 0.0
    boost = next(c for c in children if c["input"]["world"] == "boost")
    summary = next(w for w in result.worlds if w.name == "boost")
    assert boost["output"]["failures"] == summary.failures
    assert boost["metadata"]["outcomes_digest"] == summary.outcomes_digest


async def test_outage_queues_and_the_next_run_sends(
    bt_lab: tuple[Lab, FakeBraintrust],
) -> None:
    lab, fake = bt_lab
    fake.down = True
    first = await _run(lab)  # Braintrust down: the experiment still completes
    assert first.evidence_log is not None and first.evidence_log.startswith("queued"), (
        first.evidence_log
    )
    assert "503" in first.evidence_log and "1 trace(s) queued" in first.evidence_log
    assert lab.ledger.experiment(first.experiment_id) is not None  # nothing lost locally
    outbox = lab.settings.home / "braintrust-outbox"
    assert len(list(outbox.glob("*.json"))) == 1

    fake.down = False
    fake.fail_logs(500)  # the next run's first upload fails too: still queued
    second = await _run(lab)
    assert second.evidence_log is not None and second.evidence_log.startswith("queued")
    assert len(list(outbox.glob("*.json"))) == 2

    third = await _run(lab)
    assert third.evidence_log is not None and third.evidence_log.startswith("sent")
    assert list(outbox.glob("*.json")) == []
    names = sorted(e["name"] for e in fake.experiments.values())
    ids = sorted(r.experiment_id for r in (first, second, third))
    assert [n.rsplit("-", 1)[0] for n in names] == ids
    for experiment in fake.experiments.values():
        _, children = _tree(fake, experiment["name"])
        assert len(children) == 3


def test_a_braintrust_setting_without_the_key_is_refused() -> None:
    assert braintrust_config({}) is None
    on = braintrust_config({"BRAINTRUST_API_KEY": "k", "FORKLAB_BRAINTRUST_PROJECT": "p"})
    assert on is not None and on.project == "p"
    for var in BRAINTRUST_WITH_KEY:
        with pytest.raises(ConfigError, match=f"{var} is set but BRAINTRUST_API_KEY is not"):
            braintrust_config({var: "https://bt.internal", "BRAINTRUST_API_KEY": " "})


def test_the_worker_refuses_a_url_without_the_key_before_it_connects(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("BRAINTRUST_API_KEY", raising=False)
    monkeypatch.setenv("BRAINTRUST_APP_URL", "https://bt.internal")
    monkeypatch.setenv("FORKLAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FORKLAB_ADDRESS", "127.0.0.1:9")  # nothing listens: never reached
    code, _, err = run_cli(capsys, "worker")
    assert code == 2, err
    assert "BRAINTRUST_APP_URL is set but BRAINTRUST_API_KEY is not" in err
    assert "cannot connect" not in err


# --- a hostile server: it quotes the API key back, or names another experiment and
# stores nothing. The local ledger stays the record; its answers change nothing ForkLab
# records.


def _ledger_matches(lab: Lab, result: ExperimentResult) -> None:
    """The ledger row and world rows are this run's own, as the workflow reported them."""
    record = lab.ledger.experiment(result.experiment_id)
    assert record is not None and record.status == result.status.value
    assert record.plan_fingerprint == result.plan_fingerprint
    rows = {w.world: w for w in lab.ledger.worlds(result.experiment_id, record.run_id)}
    for w in result.worlds:
        assert (rows[w.name].episodes, rows[w.name].failures) == (w.episodes, w.failures)


async def test_a_server_quoting_the_key_back_never_gets_it_into_the_result(
    bt_lab: tuple[Lab, FakeBraintrust],
) -> None:
    lab, fake = bt_lab
    fake.echo_key = True
    fake.fail_logs(500)
    result = await _run(lab)
    said = result.evidence_log or ""
    assert said.startswith("queued") and "<BRAINTRUST_API_KEY>" in said, said
    assert API_KEY not in said
    assert API_KEY not in result.model_dump_json()
    _ledger_matches(lab, result)


async def test_another_experiments_id_and_rows_never_stored_change_nothing_recorded(
    bt_lab: tuple[Lab, FakeBraintrust],
) -> None:
    lab, fake = bt_lab
    fake.experiment_id = "exp-someone-else"
    fake.drop_rows = True
    result = await _run(lab)
    # ForkLab cannot see that nothing was stored: it says "sent" (and names its own
    # experiment, not the id the server gave); the ledger is the record either way
    said = result.evidence_log or ""
    assert said.startswith("sent") and "exp-someone-else" not in said, said
    assert fake.rows == {}
    _ledger_matches(lab, result)
