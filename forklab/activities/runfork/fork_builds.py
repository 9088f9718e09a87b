"""The builds that would run a fork: those of the workers polling its task queue.

A fork's receipt is written when the fork starts, before a worker has picked it up; the
builds polling its queue then are the ones it can run on (its own history records, on
every workflow task, the one that did)."""

from __future__ import annotations

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.service import RPCError


async def polling_builds(client: Client, queue: str) -> str | None:
    """The Worker Deployment Versions (else build ids) of the workers polling ``queue`` for
    workflow tasks, sorted and comma-separated; None when none polls, none names a build,
    or the server does not say."""
    try:
        described = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
            )
        )
    except RPCError:
        return None
    builds = set()
    for poller in described.pollers:
        deployment = poller.deployment_options
        if deployment.deployment_name and deployment.build_id:
            builds.add(f"{deployment.deployment_name}.{deployment.build_id}")
        elif poller.worker_version_capabilities.build_id:
            builds.add(poller.worker_version_capabilities.build_id)
    return ", ".join(sorted(builds)) or None
