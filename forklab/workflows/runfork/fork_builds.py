"""Which build runs a fork, and whether it is one that recorded the fork's prefix."""

from __future__ import annotations

from temporalio import workflow


def current_build() -> str:
    """The Worker Deployment Version, else the build id, of the worker running this
    workflow task (as its history records it: deterministic on replay)."""
    info = workflow.info()
    version = info.get_current_deployment_version()
    if version is None:
        return info.get_current_build_id()
    if version.deployment_name:
        return f"{version.deployment_name}.{version.build_id}"
    return version.build_id


def changed_build(parent_build: str | None) -> str | None:
    """This worker's build when it is none of ``parent_build`` (the builds that recorded
    the fork's prefix, comma-separated); None when it is one, or either is unknown."""
    build = current_build()
    if parent_build is None or not build or build in parent_build.split(", "):
        return None
    return build
