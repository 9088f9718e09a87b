"""Collecting a workload's files where the operator runs ``forklab`` (``plan``,
``start``): the side of the workload bundle that reads the operator's disk. What is
bundled and its limits are documented in docs/workloads.md ("What is bundled"); the pure
rules are in ``forklab/experiments/experiment/bundle.py``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

from forklab.activities.experiment.runner_bundle import find_module_spec
from forklab.experiments.experiment.bundle import (
    MAX_FILE_BYTES,
    BundleError,
    check_size,
    is_builtin,
    module_name,
)


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
    spec = find_module_spec(top, None)
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
            check_size(str(path), size, total + size, len(files) + 1)
            with path.open("rb") as handle:
                data = handle.read(MAX_FILE_BYTES + 1)
            total += len(data)
            check_size(str(path), len(data), total, len(files) + 1)
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
