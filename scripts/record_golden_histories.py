"""Record the golden histories that ``tests/test_golden_replay.py`` replays offline.

Why: a replay test that replays a history recorded in the same run cannot see a
determinism break between versions (the code that records is the code that replays).
These histories are recorded once by this script and committed; every ``make test-fast``
replays them against the workflow code as it is now, so a change that would break the
runs already in flight on a server fails there.

Run ``make golden`` (this script) when a workflow changes on purpose — and then say in
the change that runs started before it cannot continue on the new worker (or version the
change with ``workflow.patched``, which keeps the old histories replaying). It starts its
own dev server, workers and agent services on free ports, like the tests, and writes
``tests/golden/<name>.json`` (``WorkflowHistory.to_json``) and ``tests/golden/index.json``
(which workflow each history belongs to and how it was made).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
GOLDEN = TESTS / "golden"
for folder in (ROOT, TESTS):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from agent_fixtures import running_agent_lab, running_services  # noqa: E402
from orchestration_lab import Lab, lab_settings, make_spec, start_dev_server  # noqa: E402
from temporalio.client import WorkflowHandle  # noqa: E402

from forklab.workers.experiment.worker import build_worker, cpu_pool  # noqa: E402
from forklab.workflows.experiment.messages import Status  # noqa: E402


async def _save(
    name: str,
    handle: WorkflowHandle[object, object],
    index: dict[str, object],
    workflow: str,
    what: str,
) -> None:
    history = await handle.fetch_history()
    (GOLDEN / f"{name}.json").write_text(history.to_json() + "\n", encoding="utf-8")
    index[name] = {"workflow_id": handle.id, "workflow": workflow, "what": what}
    print(f"{name}: {len(history.events)} events ({handle.id})")


async def record(home: Path) -> dict[str, object]:
    index: dict[str, object] = {}
    env = await start_dev_server()
    try:
        # an experiment run: approval, prefixes, world batches, the analysis
        settings = lab_settings(env, home / "experiment")
        with cpu_pool() as cpu:
            async with build_worker(env.client, settings, cpu):
                lab = Lab(client=env.client, settings=settings)
                spec = make_spec(id="golden-experiment", episodes=12)
                handle, key = await lab.start(spec, batch_episodes=6)
                await lab.approve(handle, key)
                result = await handle.result()
                assert result.status is Status.completed, result.error
                await _save(
                    "experiment",
                    handle,
                    index,
                    "ExperimentWorkflow",
                    "the Toy experiment of make_spec, 12 episodes in batches of 6, approved",
                )
        # an agent run, a fork of it and a fork of that fork
        with running_services() as services:
            async with running_agent_lab(env, services, home / "agents") as agents:
                parent = await agents.start_research(
                    run_id="golden-research", model="fast", fail_on_low_score=False
                )
                await parent.result()
                await _save(
                    "agent_run",
                    parent,
                    index,
                    "ResearchPipelineWorkflow",
                    "the research pipeline on the fast model (its report not failed)",
                )
                fork = await agents.lab.fork(
                    parent.id, at_step=3, name="golden-research/slow", model="slow"
                )
                await fork.handle.result()
                await _save(
                    "fork",
                    fork.handle,
                    index,
                    "ResearchPipelineWorkflow",
                    "a fork of agent_run at step 3 on the slow model",
                )
                again = await agents.lab.fork(
                    fork.handle.id, at_step=4, name="golden-research/slow/again"
                )
                await again.handle.result()
                await _save(
                    "fork_of_fork",
                    again.handle,
                    index,
                    "ResearchPipelineWorkflow",
                    "a fork of fork at step 4 (inheriting steps of both runs)",
                )
    finally:
        await env.shutdown()
    return index


def main() -> None:
    GOLDEN.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as home:
        index = asyncio.run(record(Path(home)))
    (GOLDEN / "index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
