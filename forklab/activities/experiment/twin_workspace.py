"""The Workspaces section of the twin's report (``forklab plan``), for a workload with files.

The twin's batch runner keeps no file evidence (its hot path copies folders and digests
them, nothing more), so this is a second, separate pass over the spec's episodes through
the same entry points a sandbox uses on the durable path: every prefix into one folder
per episode (the branch), then each world continued from those checkpoints in its own
copy of that folder (its end). The manifests feed ``workspace_section``, as the durable
analysis does; only the ``layers`` column stays empty (the twin seals no layers).
Deterministic: same spec, same section.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from forklab.experiments.experiment.spec import ExperimentSpec, resolve_workload
from forklab.experiments.experiment.workspace_report import WorkspaceSection, workspace_section
from forklab.experiments.experiment.worlds import spec_world_plans
from forklab.experiments.workspace import FileRecord, WorkspaceManifest
from forklab.runtime.file_format import checkpoint_line
from forklab.runtime.runner import continue_checkpoints, run_prefix

_CHUNK = 1 << 20


def folder_manifest(root: Path) -> WorkspaceManifest:
    """Every regular file under ``root`` (not through symlinks), with md5 and sha256, by
    ``/``-separated path relative to ``root`` — what a sandbox's manifest says."""
    files = []
    for here, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            path = Path(here) / name
            if path.is_symlink() or not path.is_file():
                continue
            md5, sha = hashlib.md5(usedforsecurity=False), hashlib.sha256()
            with path.open("rb") as fh:
                while chunk := fh.read(_CHUNK):
                    md5.update(chunk)
                    sha.update(chunk)
            files.append(
                FileRecord(
                    path=path.relative_to(root).as_posix(),
                    size=path.stat().st_size,
                    md5=md5.hexdigest(),
                    sha256=sha.hexdigest(),
                )
            )
    return WorkspaceManifest(files=tuple(sorted(files, key=lambda f: f.path)))


def twin_workspace_section(
    spec: ExperimentSpec,
) -> tuple[WorkspaceSection, dict[str, str]] | None:
    """The section and the files it names (as the durable report writes them); None for
    a workload without files."""
    workload = resolve_workload(spec)
    if not workload.has_workspace:
        return None
    scratch = Path(tempfile.mkdtemp(prefix="forklab-twin-files-"))
    try:
        branch = scratch / "branch"
        branch.mkdir()
        lines = [
            json.loads(checkpoint_line(run_prefix(workload, spec.seed, ep, branch / str(ep))))
            for ep in range(spec.episodes)
        ]
        start = folder_manifest(branch)
        worlds: dict[str, tuple[list[str], list[WorkspaceManifest]]] = {}
        for plan in spec_world_plans(spec):
            own = scratch / f"world-{len(worlds)}"
            shutil.copytree(branch, own, symlinks=True)
            continue_checkpoints(workload, spec.seed, lines, plan, own, own=True)
            worlds[plan.name] = ([], [folder_manifest(own)])
            shutil.rmtree(own)
        return workspace_section([start], worlds)
    finally:
        workload.workspace = None
        shutil.rmtree(scratch, ignore_errors=True)
