"""The floor plan, enforced: each package of ``forklab`` imports only the packages below
it, ``forklab.experiments`` (the science) reaches no disk, clock, network or process,
``forklab.runtime`` (what runs inside a box) and the shipped workloads use the standard
library only, and no workflow module loads the analysis stack.

The order (``docs/architecture.md``): runtime ← workloads, experiments ← contracts ←
activities ← workflows ← agents ← workers, evals ← cli.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "forklab"

_BELOW: dict[str, set[str]] = {
    "runtime": set(),
    "workloads": {"runtime"},
    "experiments": {"runtime"},
    "contracts": {"runtime", "experiments"},
    "activities": {"runtime", "workloads", "experiments", "contracts"},
    "workflows": {"runtime", "experiments", "contracts"},
    "agents": {"runtime", "experiments", "contracts", "activities", "workflows"},
    "evals": {"runtime", "workloads", "experiments", "contracts", "activities"},
    "workers": {"runtime", "workloads", "experiments", "contracts", "activities", "workflows"}
    | {"agents"},
    "cli": {"runtime", "workloads", "experiments", "contracts", "activities", "workflows"}
    | {"agents", "workers", "evals"},
    # forklab/temporal.py: the public plugin module, a wiring module like workers/
    "temporal": {"runtime", "workloads", "experiments", "contracts", "activities", "workflows"}
    | {"agents", "workers"},
}
#: Layers that are one module (``forklab/<layer>.py``) rather than a folder.
MODULE_LAYERS = {"temporal"}
#: Standard-library modules that reach the disk, the clock, the network or other processes.
IMPURE = {
    "asyncio", "concurrent", "glob", "http", "importlib", "multiprocessing", "os", "random",
    "secrets", "shutil", "signal", "socket", "subprocess", "sys", "tempfile", "threading",
    "time", "urllib", "uuid",
}  # fmt: skip
#: Third-party packages the science may use (pure computation).
PURE_THIRD_PARTY = {"numpy", "scipy", "matplotlib", "pydantic", "yaml"}


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "forklab" and len(parts) > 1 else None


def _files(layer: str) -> list[Path]:
    if layer in MODULE_LAYERS:
        return [PACKAGE / f"{layer}.py"]
    return sorted((PACKAGE / layer).rglob("*.py"))


def _breaks_a_rule(name: str, layer: str) -> bool:
    root = name.split(".")[0]
    other = _layer(name)
    if root == "forklab":
        upward = other is not None and other != layer and other not in _BELOW[layer]
        return upward or (other is None and name != "forklab")
    stdlib = root in sys.stdlib_module_names
    if layer == "experiments":
        return root in IMPURE or not (stdlib or root in PURE_THIRD_PARTY)
    return layer in ("runtime", "workloads") and not stdlib


def _violations(path: Path, layer: str) -> list[str]:
    """What ``path`` (a module of ``layer``) imports that its layer may not."""
    return sorted({name for name in _imports(path) if _breaks_a_rule(name, layer)})


@pytest.mark.parametrize("layer", sorted(_BELOW))
def test_each_layer_imports_only_the_layers_below_it(layer: str) -> None:
    files = _files(layer)
    assert files, f"forklab/{layer} is empty"
    found = {p.relative_to(ROOT).as_posix(): _violations(p, layer) for p in files}
    assert {path: bad for path, bad in found.items() if bad} == {}


def test_every_module_belongs_to_a_layer() -> None:
    loose = [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert sorted(loose) == sorted(f"{m}.py" for m in MODULE_LAYERS)
    assert folders == set(_BELOW) - MODULE_LAYERS


def test_the_layering_check_rejects_what_breaks_a_rule(tmp_path: Path) -> None:
    science = tmp_path / "science.py"
    science.write_text("import os\nfrom time import time\nimport temporalio\nimport numpy\n")
    assert _violations(science, "experiments") == ["os", "temporalio", "time"]
    upward = tmp_path / "upward.py"
    upward.write_text("from forklab.activities.files import atomic_write\n")
    assert _violations(upward, "workflows") == ["forklab.activities.files"]
    boxed = tmp_path / "boxed.py"
    boxed.write_text("import json\nimport pydantic\nfrom forklab.experiments import x\n")
    assert _violations(boxed, "runtime") == ["forklab.experiments", "pydantic"]


def _heavy_after_importing(modules: list[str]) -> list[str]:
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(m for m in ('numpy', 'scipy', 'matplotlib', 'statsmodels')"
        " if m in sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    heavy: list[str] = json.loads(done.stdout)
    return heavy


def _modules(layer: str) -> list[str]:
    out = []
    for path in _files(layer):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def test_no_workflow_module_imports_the_analysis_stack() -> None:
    """The workflows (and the wire types they hold) load in a worker's sandbox and in the
    CLI: neither may pay for numpy, scipy or matplotlib."""
    assert _heavy_after_importing(_modules("workflows") + _modules("contracts")) == []
    # the check can fail: the analysis does import them
    assert "numpy" in _heavy_after_importing(["forklab.experiments.experiment.analysis.build"])


def _load_time_imports(path: Path, module: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that importing ``module`` imports at once: its statements'
    imports outside functions and ``if TYPE_CHECKING:`` blocks."""
    found: set[str] = set()
    todo = list(ast.parse(path.read_text(encoding="utf-8")).body)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo += node.orelse
        elif isinstance(node, ast.If | ast.With | ast.Try):
            todo += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            todo += [s for h in getattr(node, "handlers", []) for s in h.body]
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            found.update([base, *(f"{base}.{alias.name}" for alias in node.names)])
    out = set()
    for name in found:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            out.add(name)
    return out


def import_circles(package: Path) -> list[list[str]]:
    """Each import circle among ``package``'s modules (load-time imports), as the modules
    on it."""
    paths: dict[str, Path] = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {m: _load_time_imports(p, m, set(paths)) for m, p in paths.items()}
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for other in sorted(graph[module]):
            if state.get(other) == 1:
                circles.append(path[path.index(other) :])
            elif other not in state:
                visit(other)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return circles


def test_no_module_imports_itself_round_a_circle(tmp_path: Path) -> None:
    """On a circle, whichever module is imported first sees its partner half-initialised,
    so import order starts to matter; a function-local import does not count (it runs
    later, when both are loaded)."""
    assert import_circles(PACKAGE) == []
    planted = tmp_path / "pkg"
    planted.mkdir()
    (planted / "__init__.py").write_text("")
    (planted / "engine.py").write_text("from pkg import entry\n")
    (planted / "entry.py").write_text("from pkg.engine import run\n")
    (planted / "lazy.py").write_text("def f():\n    from pkg import entry\n")
    assert import_circles(planted) == [["pkg.engine", "pkg.entry"]]
