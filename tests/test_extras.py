"""A lean install (issue 36, point 1): the providers' packages are extras, the default path
imports none of them, and a setting that names a provider whose extra is missing stops
with one sentence naming the setting and the ``pip install`` that fixes it.

"Missing" is made real, not mocked: an import hook raises ``ModuleNotFoundError`` for the
extra's modules, exactly what Python raises where the package is not installed."""

from __future__ import annotations

import importlib.abc
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest

from forklab.workers.config import ConfigError, Settings
from forklab.workers.experiment.providers import braintrust_config, sandbox_backend
from forklab.workers.extras import MODULES, Extra, missing_modules, require_extra
from forklab.workers.stores import artifact_store, ledger
from tests.helpers import ROOT, run_cli

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


class _NotInstalled(importlib.abc.MetaPathFinder):
    """Python's answer for a package that is not installed, for ``names``."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> None:
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


@contextmanager
def not_installed(*extras: Extra) -> Iterator[None]:
    names = {m for e in extras for m in MODULES[e]}
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] in names}
    for k in saved:
        del sys.modules[k]
    finder = _NotInstalled(names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        sys.modules.update(saved)


def _sentence(setting: str, extra: str, missing: str) -> str:
    return (
        f"{setting} needs ForkLab's {extra} extra ({missing} is not installed): "
        f"pip install 'forklab[{extra}]'"
    )


def test_each_provider_setting_names_its_missing_extra(tmp_path: Path) -> None:
    settings = Settings.load({"home": tmp_path}, env={})
    daytona_env = {"FORKLAB_SANDBOX": "daytona", "DAYTONA_API_KEY": "k"}
    with not_installed(Extra.daytona), pytest.raises(ConfigError) as refused:
        sandbox_backend(settings, daytona_env)
    assert str(refused.value) == _sentence("FORKLAB_SANDBOX=daytona", "daytona", "daytona")
    with not_installed(Extra.braintrust), pytest.raises(ConfigError) as refused:
        braintrust_config({"BRAINTRUST_API_KEY": "k"})
    assert str(refused.value) == _sentence(
        "BRAINTRUST_API_KEY", "braintrust", "braintrust, autoevals"
    )
    s3 = Settings.load({"home": tmp_path, "artifacts": "s3://bucket/p"}, env={})
    with not_installed(Extra.s3), pytest.raises(ConfigError) as refused:
        artifact_store(s3)
    assert str(refused.value) == _sentence("FORKLAB_ARTIFACTS=s3://…", "s3", "boto3, botocore")
    pg = Settings.load({"home": tmp_path, "ledger": "postgresql://u@db:5432/x"}, env={})
    with not_installed(Extra.postgres), pytest.raises(ConfigError) as refused:
        ledger(pg)
    assert str(refused.value) == _sentence("FORKLAB_LEDGER=postgresql://…", "postgres", "psycopg")
    # the default path asks for nothing: local sandboxes, store and ledger, no Braintrust
    with not_installed(*Extra):
        assert sandbox_backend(settings, {}).name == "local"
        assert braintrust_config({}) is None
        artifact_store(settings)
        ledger(settings)


def test_evals_without_the_braintrust_extra_is_one_sentence(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with not_installed(Extra.braintrust):
        code, out, err = run_cli(capsys, "evals", "--local")
    assert (code, out) == (2, "")
    assert (
        err
        == "forklab: error: "
        + _sentence("forklab evals", "braintrust", "braintrust, autoevals")
        + "\n"
    )


def test_with_the_extras_installed_nothing_is_refused() -> None:
    """The dev install (the tests' own) has every extra: the check must not refuse it."""
    for extra in Extra:
        assert missing_modules(extra) == []
        require_extra(extra, "x")


def _names(requirements: list[str]) -> set[str]:
    return {r.split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip() for r in requirements}


def test_the_runtime_dependencies_are_lean_and_dev_has_every_extra() -> None:
    project = PYPROJECT["project"]
    runtime = _names(project["dependencies"])
    extras = project["optional-dependencies"]
    providers = {e.value: _names(extras[e.value]) for e in Extra}
    assert providers == {
        "daytona": {"daytona"},
        "braintrust": {"braintrust", "autoevals"},
        "s3": {"boto3"},
        "postgres": {"psycopg"},
    }
    for extra, names in providers.items():
        assert not names & runtime, f"{extra}'s packages are runtime dependencies"
        assert names <= _names(extras["dev"]), f"the tests need the {extra} extra"
        assert names <= _names(extras["all"])


def test_the_default_path_imports_no_extra_and_runs_without_them(tmp_path: Path) -> None:
    """A fresh interpreter where no extra is installed: the worker modules and the CLI of
    the demo import, and a rehearsal runs end to end."""
    hidden = sorted({m for e in Extra for m in MODULES[e]})
    code = f"""
import importlib.abc, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {hidden!r}:
            raise ModuleNotFoundError(name, name=name)
sys.meta_path.insert(0, Hide())
import forklab.workers.experiment.worker, forklab.workers.runfork.agent_worker
import forklab.cli.experiment.demo_command
from forklab.cli.main import dispatch
sys.exit(dispatch(["plan", {str(ROOT / "forklab" / "workloads" / "recovery-counter.yaml")!r}]))
"""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "FORKLAB_HOME": str(tmp_path / "home")},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "refresh" in done.stdout and "Hypothesis" in done.stdout
