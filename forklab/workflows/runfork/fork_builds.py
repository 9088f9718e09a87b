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


def unexpected_build(predicted: str | None, allowed: bool) -> str | None:
    """Why this worker should not run the fork whose receipt predicted the builds
    ``predicted`` (comma-separated: those polling its queue when it started), or None: it
    is one of them, either is unknown, or ``allowed`` (``--allow-build-change``). The
    receipt names the build expected to run the fork; a fork another build picked up (a
    worker that came or went in between) would make that record false."""
    build = current_build()
    if allowed or predicted is None or not build or build in predicted.split(", "):
        return None
    return (
        f"fork refused: it was picked up by build {build[:100]}, and its receipt names "
        f"{predicted[:200]} (the builds polling its queue when it started); fork again, or "
        "with --allow-build-change to let another build run it"
    )


def changed_build(parent_build: str | None) -> str | None:
    """This worker's build when it is none of ``parent_build`` (the builds that recorded
    the fork's prefix, comma-separated); None when it is one, or either is unknown."""
    build = current_build()
    if parent_build is None or not build or build in parent_build.split(", "):
        return None
    return build
