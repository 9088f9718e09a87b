"""``experiments/`` is the pure science core: it imports nothing that reaches the disk, the
clock, the network or other processes, and nothing from the layers above it. Side effects
live in ``activities/`` (worker) and ``forklab/`` (CLI).

Known exceptions, each with its reason: ``runtime/`` and ``workloads/`` run inside sandboxes
(the runner reads its request and writes its columns; workloads with files edit their
workspace); ``engine.py`` is the local twin (a process pool, and it times itself);
``twin_workspace.py`` gives the twin's workloads their folders.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"
EXCEPTIONS = {"engine.py", "twin_workspace.py"}
IMPURE = {
    "asyncio", "concurrent", "glob", "http", "importlib", "multiprocessing", "os", "random",
    "secrets", "shutil", "signal", "socket", "subprocess", "sys", "tempfile", "threading",
    "time", "urllib", "uuid",
}  # fmt: skip
UPPER_LAYERS = {"activities", "forklab", "workflows", "workers"}


def _impure_imports(path: Path) -> list[str]:
    roots: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots.append((node.module or "").split(".")[0])
    return sorted(r for r in set(roots) if r in IMPURE | UPPER_LAYERS)


def test_the_science_core_imports_no_side_effects_and_no_upper_layer() -> None:
    files = [
        p
        for p in sorted(EXPERIMENTS.rglob("*.py"))
        if p.relative_to(EXPERIMENTS).parts[0] not in {"runtime", "workloads"}
        and p.relative_to(EXPERIMENTS).as_posix() not in EXCEPTIONS
    ]
    assert {"bundle.py", "plan.py", "spec.py"} <= {p.name for p in files}
    found = {p.relative_to(ROOT).as_posix(): _impure_imports(p) for p in files}
    assert {path: bad for path, bad in found.items() if bad} == {}


def test_the_layering_check_rejects_a_file_that_reads_the_disk(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom time import time\nfrom forklab.workload_files import x\n")
    assert _impure_imports(bad) == ["forklab", "os", "time"]
