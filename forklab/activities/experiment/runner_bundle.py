"""The runner bundle on this host: the files a sandbox needs to run a workload, and their
code digest.

ForkLab's runtime (``forklab/runtime``) and a built-in workload's module are found on
this process's import path without importing anything; a workload that is not built in
comes as a verified bundle (``forklab/activities/experiment/workload_bundles.py``). The pure rules
(paths, limits, manifests) are in ``forklab/experiments/experiment/bundle.py``; this module is
where files are looked up and read.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path

from forklab.experiments.experiment.bundle import (
    BundleError,
    BundleFile,
    WorkloadBundle,
    check_relpath,
    is_builtin,
    module_name,
)
from forklab.runtime.canon import digest, sha256_hex
from forklab.runtime.workload import WorkloadError

_RUNTIME_PACKAGES = ("forklab", "forklab.runtime")


def find_module_spec(name: str, search: list[str] | None) -> ModuleSpec | None:
    """Where module ``name`` lives, asked of every finder on ``sys.meta_path`` (the path
    finder, and e.g. the finder of an editable install, which ``sys.path`` alone does not
    show) — finding a spec runs none of the module's code."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        found = find(name, search) if find is not None else None
        if found is not None:
            return found  # type: ignore[no-any-return]
    return None


def _module_files(module_name: str) -> list[BundleFile]:
    """A built-in module's own file plus the ``__init__.py`` of every parent package,
    found without importing anything: importing would run the module's code in the
    process that asked (a worker), outside any sandbox."""
    files: list[BundleFile] = []
    parts = module_name.split(".")
    search: list[str] | None = None  # None: sys.path
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        spec = find_module_spec(name, search)
        if spec is None or not spec.origin or not Path(spec.origin).is_file():
            raise WorkloadError("workload.name", f"cannot find module {name!r} as a source file")
        path = Path(spec.origin)
        if spec.submodule_search_locations is not None:
            files.append(BundleFile("/".join(parts[:depth]) + "/__init__.py", path))
            search = list(spec.submodule_search_locations)
        else:
            files.append(BundleFile("/".join(parts[:depth]) + ".py", path))
    return files


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
    runtime_dir = Path(importlib.import_module("forklab.runtime").__file__ or "").parent
    for path in sorted(runtime_dir.glob("*.py")):
        rel = f"forklab/runtime/{path.name}"
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
