"""The runner bundle: the exact source files a world executes, and their digest.

A world runs ForkLab's runtime (``experiments/runtime``) plus the workload. A built-in
workload (a module of the ``experiments`` package) ships with ForkLab; any other is a
*workload bundle*: its whole top-level package, or a top-level module with its sibling
modules and packages, collected where the operator runs ``forklab`` and shipped with the
experiment (``activities/workload_bundles.py``), so that no worker needs the operator's
``PYTHONPATH``. ``workload_sources`` turns those files into a content-addressed manifest;
its digest is what the workflow input, the report and the ledger record. The digest over
all files (runtime and workload) is the code identity: it enters the experiment
fingerprint and, for local sandboxes, it is the snapshot id every world must start from.
"""

from __future__ import annotations

import importlib
import os
import re
import stat
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

from experiments.runtime.canon import digest, sha256_hex
from experiments.runtime.runner import BUILTIN_WORKLOADS
from experiments.runtime.workload import WorkloadError

_RUNTIME_PACKAGES = ("experiments", "experiments.runtime")
#: The top-level package that is ForkLab's own: a workload bundle may not replace it.
_OWN_PACKAGE = "experiments"

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
    relpath: str  # where the file lives inside the bundle, e.g. "experiments/runtime/crn.py"
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


# --- pure: files → manifest -------------------------------------------------------------
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


def _check_size(relpath: str, size: int, total: int, count: int) -> None:
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
        _check_size(relpath, len(data), total, count)
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
        _check_size(relpath, size, total, count)
        entries.append(BundleEntry(relpath, sha, size))
    bundle = WorkloadBundle(tuple(entries))
    if bundle.digest != expected_digest:
        raise BundleError(
            f"workload bundle {expected_digest[:12]} hashes to {bundle.digest[:12]}; it was "
            "changed after it was shipped, start the experiment again"
        )
    return bundle


# --- finding the files on this host -----------------------------------------------------
def _find_spec(name: str, search: list[str] | None) -> ModuleSpec | None:
    """Where module ``name`` lives, asked of every finder on ``sys.meta_path`` (the path
    finder, and e.g. the finder of an editable install, which ``sys.path`` alone does not
    show) — finding a spec runs none of the module's code."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        found = find(name, search) if find is not None else None
        if found is not None:
            return found  # type: ignore[no-any-return]
    return None


def module_name(workload_ref: str) -> str:
    return BUILTIN_WORKLOADS.get(workload_ref, workload_ref).partition(":")[0]


def is_builtin(workload_ref: str) -> bool:
    """Whether the workload ships with ForkLab (a module of its own package)."""
    return module_name(workload_ref).split(".")[0] == _OWN_PACKAGE


def _module_files(module_name: str) -> list[BundleFile]:
    """A built-in module's own file plus the ``__init__.py`` of every parent package,
    found without importing anything: importing would run the module's code in the
    process that asked (a worker), outside any sandbox."""
    files: list[BundleFile] = []
    parts = module_name.split(".")
    search: list[str] | None = None  # None: sys.path
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        spec = _find_spec(name, search)
        if spec is None or not spec.origin or not Path(spec.origin).is_file():
            raise WorkloadError("workload.name", f"cannot find module {name!r} as a source file")
        path = Path(spec.origin)
        if spec.submodule_search_locations is not None:
            files.append(BundleFile("/".join(parts[:depth]) + "/__init__.py", path))
            search = list(spec.submodule_search_locations)
        else:
            files.append(BundleFile("/".join(parts[:depth]) + ".py", path))
    return files


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _bundled_entries(folder: Path, prefix: str, top: str) -> Iterator[tuple[str, Path]]:
    """``(bundle path, file)`` of every module under ``folder``: files ``<identifier>.py``
    and folders ``<identifier>`` that hold an ``__init__.py`` (recursively). Anything else
    (data, ``__pycache__``, hidden files, folders that are no package) is not bundled. A
    link is followed only while it stays inside ``top``; device files are refused."""
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        name, path = entry.name, Path(entry.path)
        is_module = name.endswith(".py") and name[:-3].isascii() and name[:-3].isidentifier()
        is_package = (
            name.isascii()
            and name.isidentifier()
            and entry.is_dir()
            and (path / "__init__.py").exists()
        )
        if not (is_module or is_package):
            continue
        if entry.is_symlink():
            target = os.path.realpath(path)
            if not _within(target, top):
                raise BundleError(
                    f"workload file {path} is a link to {target}, outside {top}; a bundle "
                    "holds only what lies in the workload's folder: copy the file in"
                )
            if is_package:
                raise BundleError(
                    f"workload package {path} is a link to a folder; a bundle follows no "
                    "folder links: put the folder itself there"
                )
        if is_package:
            yield from _bundled_entries(path, f"{prefix}{name}/", top)
            continue
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            raise BundleError(f"cannot read workload file {path} ({exc.strerror})") from None
        if not stat.S_ISREG(mode):
            raise BundleError(
                f"workload file {path} is not a regular file (a device, pipe or socket); "
                "remove it from the workload's folder"
            )
        yield f"{prefix}{name}", path


def collect_workload(workload_ref: str) -> dict[str, bytes] | None:
    """The files of a workload that is not built in (``None`` for a built-in one), found
    on this process's import path without importing anything: the whole top-level package
    of the workload's module, or, for a top-level module, every module and package beside
    it. Reads each file once, and stops at the first file past a limit."""
    if is_builtin(workload_ref):
        return None
    name = module_name(workload_ref)
    top = name.split(".")[0]
    spec = _find_spec(top, None)
    if spec is None:
        raise BundleError(
            f"cannot find module {top!r} to bundle workload {workload_ref!r}; run forklab in "
            "the folder that holds it, or put the spec file beside it"
        )
    if spec.submodule_search_locations is not None:  # a package: bundle all of it
        folder = Path(next(iter(spec.submodule_search_locations)))
        found = _bundled_entries(folder, f"{top}/", os.path.realpath(folder))
    elif spec.origin and spec.origin.endswith(".py"):  # a module: bundle its siblings too
        folder = Path(spec.origin).parent
        found = _bundled_entries(folder, "", os.path.realpath(folder))
    else:
        raise BundleError(
            f"workload module {top!r} is not Python source ({spec.origin}); only .py files "
            "can be bundled"
        )
    files: dict[str, bytes] = {}
    total = 0
    try:
        for relpath, path in found:
            size = path.stat().st_size
            _check_size(str(path), size, total + size, len(files) + 1)
            with path.open("rb") as handle:
                data = handle.read(MAX_FILE_BYTES + 1)
            total += len(data)
            _check_size(str(path), len(data), total, len(files) + 1)
            files[relpath] = data
    except OSError as exc:
        raise BundleError(
            f"cannot read the workload's folder {folder} ({exc.strerror}: {exc.filename})"
        ) from None
    own = name.replace(".", "/")
    if f"{own}.py" not in files and f"{own}/__init__.py" not in files:
        raise BundleError(
            f"workload module {name!r} is not a .py file in {folder}, so it cannot be bundled"
        )
    return files


# --- the whole runner bundle ------------------------------------------------------------
def bundle_files(
    workload_ref: str, workload: Sequence[BundleFile] | None = None
) -> list[BundleFile]:
    """Every file a sandbox needs to run ``workload_ref``, sorted by bundle path: the
    runtime, plus the built-in workload's module or the given workload bundle's files."""
    files: dict[str, BundleFile] = {}
    for pkg in _RUNTIME_PACKAGES:
        root = Path(importlib.import_module(pkg).__file__ or "").parent
        base = pkg.replace(".", "/")
        files[f"{base}/__init__.py"] = BundleFile(f"{base}/__init__.py", root / "__init__.py")
    runtime_dir = Path(importlib.import_module("experiments.runtime").__file__ or "").parent
    for path in sorted(runtime_dir.glob("*.py")):
        rel = f"experiments/runtime/{path.name}"
        files[rel] = BundleFile(rel, path)
    if is_builtin(workload_ref):
        for f in _module_files(module_name(workload_ref)):
            files.setdefault(f.relpath, f)
    elif workload is None:
        raise BundleError(
            f"workload {workload_ref!r} is not built into ForkLab and came without its "
            "bundle; start the experiment with forklab start, which bundles it"
        )
    else:
        for f in workload:
            files[check_relpath(f.relpath)] = f
    return [files[k] for k in sorted(files)]


def code_digest(files: Sequence[BundleFile], extra: WorkloadBundle | None = None) -> str:
    """The code identity of ``files`` (plus ``extra``'s, as if they were among them):
    sha256 over the sorted ``[[relpath, sha256], ...]``."""
    pairs = [[f.relpath, sha256_hex(f.source.read_bytes())] for f in files]
    if extra is not None:
        pairs += [[e.relpath, e.sha256] for e in extra.entries]
    return digest(sorted(pairs))
