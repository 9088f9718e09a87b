"""``forklab cohort start|status|approve|report`` against a real ``forklab`` worker (the
``lab`` fixture's) and the ``agent_lab`` fixture's agent worker: a cohort spec file in, the
signed plan's runs and tools shown, the report out; a bad spec is one line and exit 2. The
spec names a scorer and a feature function of a package beside it: ``cohort start`` ships
their bundle and the worker runs them in boxes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from pathlib import Path

from agent_fixtures import AgentTestLab
from cohort_user_code import write_package
from orchestration_lab import FORKLAB, Lab, cli_env
from temporalio.client import WorkflowFailureError


async def test_a_cohort_experiment_through_the_cli(
    lab: Lab, agent_lab: AgentTestLab, tmp_path: Path
) -> None:
    ids = []
    for model in ["slow", "slow", "slow", "medium"]:
        handle = await agent_lab.start_research(model=model, temperature=1.0)
        with contextlib.suppress(WorkflowFailureError):  # a failed run is recorded too
            await handle.result()
        ids.append(handle.id)
    env = cli_env(lab.settings)

    async def forklab(*args: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(
            subprocess.run,
            [FORKLAB, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"id": "x", "cohort": {"workflow_ids": ids}}))
    refused = await forklab("cohort", "start", str(bad))
    assert refused.returncode == 2 and refused.stdout == ""
    assert len(refused.stderr.strip().splitlines()) == 1 and "bad.json" in refused.stderr

    spec = {
        "id": f"cli-cohort-{int(time.time() * 1000) % 100000}",
        "hypothesis": {"text": "a stronger model rescues thin reports"},
        "seed": 5,
        "cohort": {
            "workflow_ids": ids,
            "limit": 4,
            "fork_at": "tool:charge_customer#1",
            "outcome": "usercode.scoring:resolved",
            "features": "usercode.scoring:features",
            "success_threshold": 1.0,
        },
        "worlds": [
            {"name": "baseline", "role": "baseline"},
            {"name": "candidate", "role": "treatment", "model": "candidate"},
        ],
        "budget": {"max_forks": 100, "max_concurrent_forks": 6},
    }
    path = tmp_path / "cohort.json"
    path.write_text(json.dumps(spec))
    write_package(tmp_path, tmp_path / "secret.txt", tmp_path / "outside.txt", 9)
    started = await forklab("cohort", "start", str(path))
    assert started.returncode == 0, started.stderr
    for _ in range(300):
        shown = await forklab("cohort", "status", spec["id"], "--json")
        assert shown.returncode == 0, shown.stderr
        view = json.loads(shown.stdout)
        if view["stage"] == "awaiting_approval":
            break
        await asyncio.sleep(0.2)
    assert view["runs"] == 4 and view["excluded"] == 0
    assert view["tools"] == {"charge_customer": "block"}
    text = await forklab("cohort", "status", spec["id"])
    assert "charge_customer: block" in text.stdout and view["fingerprint"] in text.stdout
    assert f"(code digest, signed): {view['code_digest']}" in text.stdout
    assert f"runs: 4; excluded: 0 (plan artifact {view['plan_artifact']})" in text.stdout
    approved = await forklab("cohort", "approve", spec["id"], "--approver", "ops")
    assert approved.returncode == 0, approved.stdout + approved.stderr
    report = await forklab("cohort", "report", spec["id"])
    assert report.returncode == 0, report.stderr
    assert "| candidate | treatment |" in report.stdout and "Noise floor" in report.stdout
    assert "report: " in report.stdout
    assert "| candidate | tool | charge_customer | 4 |" in report.stdout
    assert "## Guard policy for candidate" in report.stdout
