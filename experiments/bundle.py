"""The runner bundle: the exact source files a world executes, and their digest.

The digest is the workload code identity: it enters the experiment fingerprint and,
for local sandboxes, it is the snapshot id every world must start from.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from pathlib import Path

from experiments.runtime.canon import digest, sha256_hex
from experiments.runtime.runner import BUILTIN_WORKLOADS
from experiments.runtime.workload import WorkloadError

_RUNTIME_PACKAGES = ("experiments", "experiments.runtime")


@dataclass(frozen=True)
class BundleFile:
    relpath: str  # where the file lives inside the bundle, e.g. "experiments/runtime/crn.py"
    source: Path


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


def _module_files(module_name: str) -> list[BundleFile]:
    """The module's own file plus the ``__init__.py`` of every parent package, found on
    ``sys.path`` without importing anything: importing would run the workload's code in
    the process that asked (a worker), outside any sandbox."""
    files: list[BundleFile] = []
    parts = module_name.split(".")
    search: list[str] | None = None  # None: sys.path
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        spec = _find_spec(name, search)
        if spec is None or not spec.origin or not Path(spec.origin).is_file():
            raise WorkloadError(
                "workload.name", f"cannot find module {name!r} as a source file; check PYTHONPATH"
            )
        path = Path(spec.origin)
        if spec.submodule_search_locations is not None:
            files.append(BundleFile("/".join(parts[:depth]) + "/__init__.py", path))
            search = list(spec.submodule_search_locations)
        else:
            files.append(BundleFile("/".join(parts[:depth]) + ".py", path))
    return files


def bundle_files(workload_ref: str) -> list[BundleFile]:
    """Every file a sandbox needs to run ``workload_ref``, sorted by bundle path."""
    files: dict[str, BundleFile] = {}
    for pkg in _RUNTIME_PACKAGES:
        root = Path(importlib.import_module(pkg).__file__ or "").parent
        base = pkg.replace(".", "/")
        files[f"{base}/__init__.py"] = BundleFile(f"{base}/__init__.py", root / "__init__.py")
    runtime_dir = Path(importlib.import_module("experiments.runtime").__file__ or "").parent
    for path in sorted(runtime_dir.glob("*.py")):
        rel = f"experiments/runtime/{path.name}"
        files[rel] = BundleFile(rel, path)
    module_name = BUILTIN_WORKLOADS.get(workload_ref, workload_ref).partition(":")[0]
    for f in _module_files(module_name):
        files.setdefault(f.relpath, f)
    return [files[k] for k in sorted(files)]


def code_digest(files: list[BundleFile]) -> str:
    return digest([[f.relpath, sha256_hex(f.source.read_bytes())] for f in files])
