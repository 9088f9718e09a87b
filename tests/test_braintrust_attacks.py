"""A hostile Braintrust server against the real SDK and a real worker: one that quotes the
API key back in its errors, one that names another experiment and stores nothing. The
local ledger stays the record; Braintrust's answers change nothing ForkLab records."""

from __future__ import annotations

from collections.abc import AsyncIterator
from concurrent.futures import Executor
from pathlib import Path

import pytest
from fake_braintrust import API_KEY, FakeBraintrust, fake_braintrust
from orchestration_lab import Lab, lab_settings, make_spec
from temporalio.testing import WorkflowEnvironment

from workers.worker import build_worker
from workflows.messages import ExperimentResult, Status


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


async def _run(lab: Lab) -> ExperimentResult:
    handle, token = await lab.start(make_spec())
    await lab.approve(handle, token)
    result = await handle.result()
    assert result.status is Status.completed, result.error
    return result


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
