"""The runner bundle's pure rules: manifests, digests and limits of a workload's files.

A world runs ForkLab's runtime (``forklab/runtime``) plus the workload. A built-in
workload (a module of the ``experiments`` package) ships with ForkLab; any other is a
*workload bundle*: its whole top-level package, or a top-level module with its sibling
modules and packages. Finding and reading those files is a side effect and lives outside
this package: ``forklab/cli/experiment/workload_files.py`` collects them where the operator runs
``forklab``, ``forklab/activities/experiment/runner_bundle.py`` lists the runtime's files and
hashes them on a worker, and ``forklab/activities/experiment/workload_bundles.py`` ships and
unpacks bundles, so that no worker needs the operator's ``PYTHONPATH``. This module only turns file
contents into a content-addressed manifest (``workload_sources``) and checks one read back
(``read_manifest``); the manifest's digest is what the workflow input, the report and the
ledger record.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forklab.runtime.canon import digest, sha256_hex
from forklab.runtime.runner import BUILTIN_WORKLOADS

#: The top-level package that is ForkLab's own: a workload bundle may not replace it.
_OWN_PACKAGE = "forklab"

#: Limits of one workload bundle (documented in docs/workloads.md, "What is bundled").
MAX_FILE_BYTES = 1 << 20  # 1 MiB per file
MAX_BUNDLE_BYTES = 8 << 20  # 8 MiB in all
MAX_BUNDLE_FILES = 1000
_MAX_PATH_CHARS = 400
_SHA256 = re.compile(r"[0-9a-f]{64}")


class BundleError(ValueError):
    """A workload cannot be bundled, or a bundle is not what it claims; the message is one
    sentence naming the file and the limit or rule it breaks."""


@dataclass(frozen=True)
class BundleFile:
    relpath: str  # where the file lives inside the bundle, e.g. "forklab/runtime/crn.py"
    source: Path


@dataclass(frozen=True)
class BundleEntry:
    relpath: str
    sha256: str
    size: int


@dataclass(frozen=True)
class WorkloadBundle:
    """A workload bundle's manifest: its files sorted by path, each with sha256 and size."""

    entries: tuple[BundleEntry, ...]

    def manifest(self) -> list[list[Any]]:
        """``[[relpath, sha256, size], ...]``: what the artifact store keeps, as canonical
        JSON, under :attr:`digest`."""
        return [[e.relpath, e.sha256, e.size] for e in self.entries]

    @property
    def digest(self) -> str:
        """The bundle's identity: sha256 of the manifest's canonical JSON."""
        return digest(self.manifest())

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)


def module_name(workload_ref: str) -> str:
    return BUILTIN_WORKLOADS.get(workload_ref, workload_ref).partition(":")[0]


def is_builtin(workload_ref: str) -> bool:
    """Whether the workload ships with ForkLab (a module of its own package)."""
    return module_name(workload_ref).split(".")[0] == _OWN_PACKAGE


# --- files → manifest -------------------------------------------------------------
def check_relpath(relpath: str) -> str:
    """A bundle path is relative, stays inside the bundle, names a Python module file
    (folders and file named like identifiers, ``.py``) and is not ForkLab's own package."""
    if not isinstance(relpath, str) or not relpath:
        raise BundleError(f"bundle path {relpath!r} is empty or not text")
    if relpath.startswith("/") or re.match(r"[A-Za-z]:", relpath):
        raise BundleError(
            f"bundle path {relpath!r} is absolute; paths in a bundle are relative to its root"
        )
    parts = relpath.replace("\\", "/").split("/")
    if ".." in parts:
        raise BundleError(f"bundle path {relpath!r} climbs out of the bundle's root ('..')")
    stem = parts[-1].removesuffix(".py")
    if (
        len(relpath) > _MAX_PATH_CHARS
        or "\\" in relpath
        or not parts[-1].endswith(".py")
        or not all(p.isascii() and p.isidentifier() for p in [*parts[:-1], stem])
    ):
        raise BundleError(
            f"bundle path {relpath!r} is not a Python module path (folders and file named "
            f"like identifiers, the file ending in .py, at most {_MAX_PATH_CHARS} characters)"
        )
    if parts[0] == _OWN_PACKAGE:
        raise BundleError(
            f"bundle path {relpath!r} lies in {_OWN_PACKAGE}/, ForkLab's own package, which a "
            "workload may not replace; rename the workload's package"
        )
    return relpath


def check_size(relpath: str, size: int, total: int, count: int) -> None:
    """Refuse the file that breaks a limit; ``total`` and ``count`` include it."""
    if size > MAX_FILE_BYTES:
        raise BundleError(
            f"workload file {relpath} is {size:,} bytes, over the {MAX_FILE_BYTES:,}-byte "
            "(1 MiB) limit per bundled file; make it smaller or move it out of the bundle"
        )
    if total > MAX_BUNDLE_BYTES:
        raise BundleError(
            f"the workload bundle passes its {MAX_BUNDLE_BYTES:,}-byte (8 MiB) limit at "
            f"{relpath} ({total:,} bytes so far); move what the workload does not import "
            "out of its folder, or make the workload a package of its own"
        )
    if count > MAX_BUNDLE_FILES:
        raise BundleError(
            f"the workload bundle passes its limit of {MAX_BUNDLE_FILES:,} files at "
            f"{relpath}; move what the workload does not import out of its folder, or make "
            "the workload a package of its own"
        )


def workload_sources(files: Mapping[str, bytes]) -> WorkloadBundle:
    """The deterministic, content-addressed manifest of a workload's files (bundle path →
    bytes): the same files give the same digest, whatever order they came in."""
    if not files:
        raise BundleError("a workload bundle needs at least one file")
    entries = []
    total = 0
    for count, relpath in enumerate(sorted(files), start=1):
        check_relpath(relpath)
        data = files[relpath]
        total += len(data)
        check_size(relpath, len(data), total, count)
        entries.append(BundleEntry(relpath, sha256_hex(data), len(data)))
    return WorkloadBundle(tuple(entries))


def read_manifest(value: Any, expected_digest: str) -> WorkloadBundle:
    """A manifest read back from the artifact store (untrusted: any JSON), checked as
    strictly as :func:`workload_sources` checks files, and against its digest."""
    if not isinstance(value, list) or not value:
        raise BundleError(f"workload bundle {expected_digest[:12]} is not a list of files")
    entries: list[BundleEntry] = []
    total = 0
    for count, row in enumerate(value, start=1):
        if not (
            isinstance(row, list)
            and len(row) == 3
            and isinstance(row[0], str)
            and isinstance(row[1], str)
            and _SHA256.fullmatch(row[1])
            and type(row[2]) is int
            and row[2] >= 0
        ):
            raise BundleError(
                f"workload bundle {expected_digest[:12]}: entry {count} is not [path, sha256, size]"
            )
        relpath, sha, size = row
        check_relpath(relpath)
        if entries and relpath <= entries[-1].relpath:
            raise BundleError(
                f"workload bundle {expected_digest[:12]}: {relpath!r} is out of order or twice"
            )
        total += size
        check_size(relpath, size, total, count)
        entries.append(BundleEntry(relpath, sha, size))
    bundle = WorkloadBundle(tuple(entries))
    if bundle.digest != expected_digest:
        raise BundleError(
            f"workload bundle {expected_digest[:12]} hashes to {bundle.digest[:12]}; it was "
            "changed after it was shipped, start the experiment again"
        )
    return bundle
