"""The wheel a user installs works on its own, and beside a user's own Temporal project.

The wheel is built the way the Dockerfile builds it (``pip wheel .`` over exactly the files
the Dockerfile copies) and installed into a fresh virtual environment that sees none of this
source tree. Its dependencies are not downloaded again: the new environment reads this
environment's site-packages through a ``.pth`` line, which adds the folder to the path but
runs none of the ``.pth`` files in it — so the editable install's finder, which maps
``forklab`` to this tree, stays off, and ``forklab`` can only come from the wheel.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT


def _dockerfile_sources() -> list[str]:
    sources = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources += words[1:-1]
    return sources


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    context = tmp_path_factory.mktemp("context")
    for source in _dockerfile_sources():
        src = ROOT / source
        if src.is_dir():
            shutil.copytree(src, context / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, context / source)
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "--wheel-dir", str(out), str(context)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    (built,) = out.glob("forklab-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A virtual environment with the wheel installed and this environment's
    dependencies readable; returns its python."""
    env = tmp_path_factory.mktemp("venv")
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    (Path(purelib) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
         str(wheel)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    yield python


def _run(python: Path, cwd: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_the_wheel_holds_every_module_of_the_tree(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    tree = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "forklab").rglob("*")
        if p.is_file() and p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts
    }
    assert tree - names == set()
    assert not [n for n in names if n.split("/")[0] not in ("forklab",) and ".dist-info" not in n]


def test_every_module_imports_from_the_installed_wheel(installed: Path, tmp_path: Path) -> None:
    code = (
        "import importlib, json, pkgutil, forklab\n"
        "names = [m.name for m in pkgutil.walk_packages(forklab.__path__, 'forklab.')]\n"
        "bad = {}\n"
        "for n in names:\n"
        "    if n.endswith('__main__'): continue\n"
        "    try: importlib.import_module(n)\n"
        "    except Exception as e: bad[n] = repr(e)\n"
        "print(json.dumps({'file': forklab.__file__, 'count': len(names), 'bad': bad}))\n"
    )
    done = _run(installed, tmp_path, code)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert str(ROOT) not in result["file"] and "site-packages" in result["file"]
    assert result["bad"] == {} and result["count"] > 150
    # the worker's sandbox backends and the box's runtime came with it
    assert _run(installed, tmp_path, "import forklab.activities.sandbox.local").returncode == 0


def test_the_installed_command_starts(installed: Path, tmp_path: Path) -> None:
    forklab = installed.parent / "forklab"
    done = subprocess.run(
        [str(forklab), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "plan" in done.stdout and "worker" in done.stdout
    worker = _run(installed, tmp_path, "from forklab.workers.experiment.worker import build_worker")
    assert worker.returncode == 0, worker.stderr


def test_forklab_installs_beside_a_project_with_its_own_activities_and_workflows(
    installed: Path, tmp_path: Path
) -> None:
    """Temporal's project template has ``activities.py`` and ``workflows.py`` at its top
    level (and samples-python's DSL sample a ``dsl/activities.py``): both the user's
    modules and ForkLab's import, each from its own place."""
    (tmp_path / "activities.py").write_text("WHO = 'the user'\n")
    (tmp_path / "workflows.py").write_text("WHO = 'the user'\n")
    (tmp_path / "workers").mkdir()
    (tmp_path / "workers" / "__init__.py").write_text("WHO = 'the user'\n")
    code = (
        "import activities, workflows, workers\n"
        "from forklab.workflows.runfork.interceptor import ForkInterceptor\n"
        "from forklab.workers.runfork.agent_worker import build_agent_worker\n"
        "import forklab.activities, forklab.workflows, forklab.workers\n"
        "assert activities.WHO == workflows.WHO == workers.WHO == 'the user'\n"
        "print(forklab.workflows.__file__)\n"
    )
    done = _run(installed, tmp_path, code)
    assert done.returncode == 0, done.stderr
    assert str(tmp_path) not in done.stdout
