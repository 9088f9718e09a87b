"""Worker versioning: every run stays on the build of the workers it started on.

Why: a run recorded by one build of ForkLab may not replay on the next (the workflows do
not use ``workflow.patched``), and its strict message models refuse a field that another
build added. With a deployment name set (``FORKLAB_DEPLOYMENT``), each worker joins a
Temporal Worker Deployment Version, the deployment name plus a build id, and every
experiment is *Pinned*: its workflow tasks, its activities and the runs it continues as
new go only to workers of the version that was current when it started. Upgrading is
then starting workers of the new build beside the old ones: new experiments go to the
new build, running ones finish on the old, and the old workers stop once Temporal says
their version is drained (docs/deployment.md, "Rolling upgrades").

The build id defaults to a digest of ForkLab's own source, so two hosts that run the same
code agree on it without being told, and any change to the code is a new version.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from temporalio.api.deployment.v1 import WorkerDeploymentInfo
from temporalio.api.enums.v1 import WorkerDeploymentVersionStatus
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    DescribeWorkerDeploymentResponse,
    SetWorkerDeploymentCurrentVersionRequest,
)
from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import WorkerDeploymentConfig

from forklab.workers.config import Settings

#: The packages whose source makes up a build (what a worker runs or ships to sandboxes).
PACKAGES = ("forklab",)
#: The agent-run workers' deployment is ``<FORKLAB_DEPLOYMENT>-agents``.
AGENTS = "agents"
#: How long a worker waits for the server to know its version before it gives up promoting.
REGISTER_SECONDS = 60.0
#: What the server answers when another worker changed the routing first (a stale conflict
#: token), or while it still applies that change ("too many requests issued to Worker
#: Deployment", seen when replicas of a new build start together): look again.
_LOOK_AGAIN = (
    RPCStatusCode.FAILED_PRECONDITION,
    RPCStatusCode.ABORTED,
    RPCStatusCode.RESOURCE_EXHAUSTED,
)
#: A version that has never been current or ramping (a server may say "created", or
#: nothing yet, for a version it has only just registered).
_NEVER_CURRENT = (
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_INACTIVE,
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_CREATED,
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_UNSPECIFIED,
)
#: A version being routed to now: if the routing names another as current meanwhile, the
#: description was read while another worker promoted it (look again).
_ROUTED_TO = (
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_CURRENT,
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_RAMPING,
)


def code_build_id(roots: Iterable[Path] | None = None) -> str:
    """``fl-`` and 16 hex digits of the SHA-256 over every ``.py`` file under ``roots``
    (default: ForkLab's packages), by path relative to its root and content."""
    digest = hashlib.sha256()
    for root in _package_roots() if roots is None else roots:
        digest.update(root.name.encode() + b"\0")
        for path in sorted(root.rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    return "fl-" + digest.hexdigest()[:16]


def _package_roots() -> list[Path]:
    roots: list[Path] = []
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            roots.extend(Path(p) for p in spec.submodule_search_locations)
    return roots


def worker_version(settings: Settings, kind: str = "") -> WorkerDeploymentVersion | None:
    """The version this worker joins, or None when no deployment name is set. ``kind``
    names a deployment of its own for another kind of worker (``agents``: the agent-run
    workers, whose task queue is promoted apart from the experiments')."""
    if not settings.deployment:
        return None
    name = f"{settings.deployment}-{kind}" if kind else settings.deployment
    return WorkerDeploymentVersion(name, settings.build_id or code_build_id())


def deployment_config(version: WorkerDeploymentVersion | None) -> WorkerDeploymentConfig | None:
    """Versioned and Pinned by default (None: an unversioned worker, as without a name)."""
    if version is None:
        return None
    return WorkerDeploymentConfig(
        version=version,
        use_worker_versioning=True,
        default_versioning_behavior=VersioningBehavior.PINNED,
    )


async def announce(client: Client, version: WorkerDeploymentVersion, promote: bool) -> None:
    """Say which version the worker joined, then promote it if it may. A server that
    refuses (e.g. no permission) leaves the worker serving the runs pinned to its build,
    with a warning."""
    print(
        f"worker deployment version {_label(version)} (runs started on it stay on it)",
        flush=True,
    )
    if not promote:
        return
    try:
        print(await promote_if_newest(client, version, client.identity), flush=True)
    except RPCError as exc:
        print(
            f"forklab: warning: could not make {_label(version)} current ({exc.message}); "
            "set it with `temporal worker deployment set-current-version`",
            file=sys.stderr,
            flush=True,
        )


async def promote_if_newest(client: Client, version: WorkerDeploymentVersion, identity: str) -> str:
    """Make ``version`` the deployment's current version, where new runs start, when
    the deployment has none, or when ``version`` has never been current and is newer than
    the current one. A restarted worker of an older build, or of a build an operator rolled
    back from, therefore never takes new runs back. Returns what it did, in a
    sentence. Waits (up to ``REGISTER_SECONDS``) for the server to know the version, which
    it learns from the worker's first poll; a concurrent change of the routing (another
    new worker promoting) makes it look again."""
    deadline = time.monotonic() + REGISTER_SECONDS
    name = version.deployment_name
    while True:
        described = await _describe(client, name)
        if (
            described is None
            or _summary(described.worker_deployment_info, version.build_id) is None
        ):
            if time.monotonic() > deadline:
                return f"version {_label(version)} is still unknown to the server; not promoted"
            await asyncio.sleep(0.25)
            continue
        info = described.worker_deployment_info
        current = info.routing_config.current_deployment_version.build_id
        ours = _summary(info, version.build_id)
        if (
            ours is not None
            and ours.status in _ROUTED_TO
            and current != version.build_id
            and time.monotonic() <= deadline
        ):
            await asyncio.sleep(0.25)  # caught mid-change by another worker's promotion
            continue
        reason = _reason_to_keep(info, version)
        if reason is not None:
            return reason
        try:
            await client.workflow_service.set_worker_deployment_current_version(
                SetWorkerDeploymentCurrentVersionRequest(
                    namespace=client.namespace,
                    deployment_name=name,
                    build_id=version.build_id,
                    conflict_token=described.conflict_token,
                    identity=identity,
                )
            )
        except RPCError as exc:
            if exc.status not in _LOOK_AGAIN:
                raise
            if time.monotonic() > deadline:
                return f"version {_label(version)} not promoted: {exc.message}"
            await asyncio.sleep(0.25)
            continue
        before = f" (was {name}:{current})" if current else ""
        return f"version {_label(version)} is now current{before}"


def _reason_to_keep(info: WorkerDeploymentInfo, version: WorkerDeploymentVersion) -> str | None:
    """Why the current version stays current, or None when ``version`` should replace it."""
    name = version.deployment_name
    current = info.routing_config.current_deployment_version.build_id
    if current == version.build_id:
        return f"version {_label(version)} is current"
    if not current:
        return None
    ours = _summary(info, version.build_id)
    theirs = _summary(info, current)
    assert ours is not None
    if ours.status not in _NEVER_CURRENT:
        return (
            f"version {_label(version)} was current or ramping before; {name}:{current} "
            "stays current (change it with `temporal worker deployment set-current-version`)"
        )
    if (
        theirs is not None
        and theirs.create_time.ToNanoseconds() >= ours.create_time.ToNanoseconds()
    ):
        return f"{name}:{current} is newer than {version.build_id} and stays current"
    return None


async def _describe(client: Client, name: str) -> DescribeWorkerDeploymentResponse | None:
    """The deployment; None while the server does not know it or asks to try again."""
    try:
        return await client.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=name)
        )
    except RPCError as exc:
        if exc.status is not RPCStatusCode.NOT_FOUND and exc.status not in _LOOK_AGAIN:
            raise
        return None


def _summary(
    info: WorkerDeploymentInfo, build_id: str
) -> WorkerDeploymentInfo.WorkerDeploymentVersionSummary | None:
    return next(
        (s for s in info.version_summaries if s.deployment_version.build_id == build_id), None
    )


def _label(version: WorkerDeploymentVersion) -> str:
    return f"{version.deployment_name}:{version.build_id}"
