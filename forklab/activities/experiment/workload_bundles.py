"""Workload bundles travel with the experiment, through the artifact store.

``forklab start`` collects the workload's files where the operator runs it
(``forklab.cli.experiment.workload_files.collect_workload``) and ships them: every file under its
sha256, then the manifest ``[[relpath, sha256, size], ...]`` whose canonical-JSON digest names the
bundle in the workflow input. A worker unpacks a bundle into a folder of its own before
any of its code runs (rehearsal, snapshot, held-out validation): the manifest is checked
like any untrusted input (paths relative, inside the bundle, module paths only; the size
limits), each file is re-hashed as the store returns it, written as a new regular file,
and the folder is verified again — only regular files and folders, no links, no devices,
every file hashing to its manifest entry — each time it is used. A folder that fails that
check is rebuilt from the store; a bundle the store cannot give back intact is refused.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from forklab.activities.experiment.runner_bundle import bundle_files
from forklab.activities.stores.artifacts import ArtifactError, ArtifactStore, check_digest
from forklab.experiments.experiment.bundle import (
    BundleError,
    BundleFile,
    WorkloadBundle,
    read_manifest,
    workload_sources,
)
from forklab.runtime.canon import sha256_hex


class WorkloadBundleError(RuntimeError):
    """A bundle cannot be used (missing, damaged, or against the rules); the message is
    the sentence to show. Deterministic: retrying gives the same answer."""


def ship_workload(store: ArtifactStore, files: Mapping[str, bytes]) -> WorkloadBundle:
    """Store a workload's files and its manifest; returns the bundle (its digest names it)."""
    bundle = workload_sources(files)
    for entry in bundle.entries:
        if store.put_bytes(files[entry.relpath]) != entry.sha256:
            raise WorkloadBundleError(f"workload file {entry.relpath} changed while shipped")
    if store.put_json(bundle.manifest()) != bundle.digest:
        raise WorkloadBundleError("the workload bundle's manifest was stored under another digest")
    return bundle


def _regular_files(folder: Path) -> dict[str, Path]:
    """Every file under ``folder`` by bundle path; refuses anything but regular files and
    folders (a link could point anywhere, a device could be anything)."""
    found: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise WorkloadBundleError(
                    f"{path} is not a regular file (a link or device) in an unpacked bundle"
                )
            found[path.relative_to(folder).as_posix()] = path
    return found


def verify_folder(folder: Path, bundle: WorkloadBundle) -> list[BundleFile]:
    """The bundle's files in ``folder``, after checking that the folder holds exactly them,
    as regular files with the manifest's hashes."""
    found = _regular_files(folder)
    wanted = {e.relpath: e for e in bundle.entries}
    if sorted(found) != sorted(wanted):
        extra = sorted(set(found) ^ set(wanted))
        raise WorkloadBundleError(
            f"unpacked bundle {bundle.digest[:12]} holds other files than its manifest "
            f"({', '.join(extra[:3])})"
        )
    for relpath, path in found.items():
        if sha256_hex(path.read_bytes()) != wanted[relpath].sha256:
            raise WorkloadBundleError(
                f"unpacked bundle {bundle.digest[:12]}: {relpath} does not hash to its manifest"
            )
    return [BundleFile(e.relpath, folder / e.relpath) for e in bundle.entries]


def _write_new(folder: Path, relpath: str, data: bytes) -> None:
    """Create ``folder/relpath`` as a new regular file (never through a link): the path
    was checked (relative, no ``..``) and ``folder`` is fresh, made by this process."""
    path = folder / relpath
    for parent in reversed(path.relative_to(folder).parents):
        target = folder / parent
        if not target.exists():
            target.mkdir()
        if target.is_symlink() or not target.is_dir():
            raise WorkloadBundleError(f"{target} is not a plain folder while unpacking")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


class WorkloadBundles:
    """Unpacked bundles under ``root``, one folder per bundle digest, made from the store."""

    def __init__(self, store: ArtifactStore, root: Path) -> None:
        self._store = store
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):
            pid = stale.name.split("-")[1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                shutil.rmtree(stale, ignore_errors=True)

    def manifest(self, bundle_digest: str) -> WorkloadBundle:
        """The bundle's manifest, checked (store hash, rules, limits, its own digest)."""
        try:
            check_digest(bundle_digest)
            return read_manifest(self._store.get_json(bundle_digest), bundle_digest)
        except (ArtifactError, BundleError, ValueError) as exc:
            raise WorkloadBundleError(
                f"workload bundle {bundle_digest[:12]} cannot be used: {exc}"
            ) from None

    def files(self, bundle_digest: str) -> list[BundleFile]:
        """The bundle's files on this host, verified against its manifest just now."""
        bundle = self.manifest(bundle_digest)
        folder = self.root / bundle.digest
        if folder.is_dir():
            try:
                return verify_folder(folder, bundle)
            except (WorkloadBundleError, OSError):
                _set_aside(folder)  # changed on this host since it was unpacked: unpack again
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=f".tmp-{os.getpid()}-"))
        try:
            for entry in bundle.entries:
                try:
                    data = self._store.get_bytes(entry.sha256)
                except ArtifactError as exc:
                    raise WorkloadBundleError(
                        f"workload bundle {bundle.digest[:12]} cannot be used: file "
                        f"{entry.relpath}: {exc}"
                    ) from None
                if len(data) != entry.size:
                    raise WorkloadBundleError(
                        f"workload bundle {bundle.digest[:12]}: {entry.relpath} is "
                        f"{len(data)} bytes, its manifest says {entry.size}"
                    )
                _write_new(tmp, entry.relpath, data)
            verify_folder(tmp, bundle)
            try:
                os.rename(tmp, folder)  # atomic; fails if another worker unpacked it first
            except OSError:
                if not folder.is_dir():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return verify_folder(folder, bundle)

    def runner_files(self, workload_ref: str, bundle_digest: str | None) -> list[BundleFile]:
        """Every file a box needs for ``workload_ref``: ForkLab's runtime, plus the
        workload (built in, or the bundle's files)."""
        workload = None if bundle_digest is None else self.files(bundle_digest)
        try:
            return bundle_files(workload_ref, workload)
        except BundleError as exc:
            raise WorkloadBundleError(str(exc)) from None


def _set_aside(folder: Path) -> None:
    aside = folder.with_name(f".tmp-{os.getpid()}-aside-{folder.name[:16]}")
    try:
        os.rename(folder, aside)
    except OSError:
        return
    shutil.rmtree(aside, ignore_errors=True)
