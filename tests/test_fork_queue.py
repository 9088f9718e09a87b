"""No worker can run a fork as an ordinary run (issue 33, point 2): forks start on
``<queue>@forklab``, which only ``ForkLabPlugin`` workers poll. On a queue with one plain
worker and one plugin worker, 20 forks run only inherited-prefix serving and their own
live steps: no inherited step executes again, and every receipt is true."""

from __future__ import annotations

import asyncio
import uuid

from sample_workflows import DslActivities, DSLWorkflow, dsl_sequence
from temporalio.client import Client
from temporalio.worker import Worker
from test_fork_plugin import LIVE, PluginLab

from forklab.contracts.fork_request import ForkRequest
from forklab.contracts.runfork import fork_task_queue

pytest_plugins = ["test_fork_plugin"]


async def test_twenty_forks_beside_a_plain_worker_reexecute_nothing(
    plugin_lab: PluginLab,
) -> None:
    queue, acts = plugin_lab.queue(), DslActivities(plugin_lab.calls)
    wid = f"dsl-{uuid.uuid4().hex[:8]}"
    # its own client: the SDK runs one worker per task queue and client in a process
    other = await Client.connect(
        plugin_lab.client.service_client.config.target_host,
        data_converter=plugin_lab.client.data_converter,
    )
    plain = Worker(other, task_queue=queue, workflows=[DSLWorkflow], activities=acts.all())
    forklab = Worker(
        plugin_lab.client,
        task_queue=queue,
        workflows=[DSLWorkflow],
        activities=acts.all(),
        plugins=[plugin_lab.plugin()],
    )
    async with plain, forklab:
        expected = await plugin_lab.client.execute_workflow(
            DSLWorkflow.run, dsl_sequence(6), id=wid, task_queue=queue
        )
        forks = [
            await plugin_lab.lab.fork(
                ForkRequest(run=wid, at_step=1 + i % 6, name=f"{wid}/f{i}", tool_policies=LIVE)
            )
            for i in range(20)
        ]
        results = await asyncio.gather(*(f.handle.result() for f in forks))
    assert results == [expected] * 20
    for fork in forks:
        n = fork.receipt.resolved_step
        steps = await plugin_lab.lab.steps(fork.handle.id)
        # the receipt is true: steps 1..N were served, and only the rest ran
        assert [s.origin for s in steps] == ["inherited"] * n + ["own"] * (6 - n)
        assert plugin_lab.calls.of(fork.handle.id) == 6 - n
        desc = await fork.handle.describe()
        assert desc.task_queue == fork_task_queue(queue)
