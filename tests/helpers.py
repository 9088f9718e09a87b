"""Small helpers shared by tests (no fixtures with side effects here)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import threading
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from forklab.cli.main import dispatch
from forklab.experiments.experiment.spec import ExperimentSpec

ROOT = Path(__file__).resolve().parent.parent


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = dispatch(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@dataclass(frozen=True)
class CliResult:
    """What ``forklab_in_process`` saw: the fields a finished process would have."""

    returncode: int
    stdout: str
    stderr: str


#: One in-process command at a time: a command reads ``os.environ`` and the working folder
#: and writes ``sys.stdout``/``sys.stderr``, all of which belong to the whole process.
_CLI_LOCK = threading.Lock()


def forklab_in_process(
    env: Mapping[str, str] | None, *argv: str, cwd: Path | None = None, timeout: float = 120
) -> CliResult:
    """Run ``forklab ARGV`` in this process, as the executable would with the environment
    ``env`` (None: this one) in ``cwd``, and return its exit code and output.

    This is the CLI without its process: the same ``dispatch``, argparse's exits as exit
    codes, an exception nothing caught as exit 1 with its traceback (as ``main`` does), no
    terminal on stdin. A test whose subject is the process itself (the entry point's exit,
    signals, startup, pipes, what a fresh interpreter imports) runs the real executable
    instead. The command runs in a thread of its own, joined before this returns: it may
    call ``asyncio.run`` while the caller's event loop is running, and the caller blocks
    while it runs, as it did on a child process (use ``asyncio.to_thread`` where the
    caller's loop must keep serving, e.g. a worker in the test's loop). Calls run one at a
    time: commands whose concurrency is the subject run as processes."""
    result: list[int] = []

    def command() -> None:
        try:
            result.append(dispatch(list(argv)))
        except SystemExit as exc:  # argparse: --help, usage errors
            code = exc.code
            result.append(code if isinstance(code, int) else 0 if code is None else 1)
        except Exception:
            traceback.print_exc()
            result.append(1)

    out, err = io.StringIO(), io.StringIO()
    with _CLI_LOCK, contextlib.ExitStack() as stack:
        saved = _Saved(dict(os.environ), Path.cwd(), sys.stdin, list(sys.path), set(sys.modules))
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        stack.callback(saved.restore)
        if cwd is not None:
            os.chdir(cwd)
        sys.stdin = io.StringIO()
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        thread = threading.Thread(target=command, name="forklab in process", daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():  # as the process's timeout did: the test fails, it does not hang
            raise TimeoutError(f"forklab {' '.join(argv)} did not end within {timeout} s")
    return CliResult(result[0], out.getvalue(), err.getvalue())


#: Where modules that outlive an in-process command may come from: ForkLab, the tests'
#: helpers and workloads, and installed packages.
_LASTING = (ROOT / "forklab", ROOT / "tests", Path(sys.prefix), Path(sys.base_prefix))


@dataclass
class _Saved:
    """The process state a command changes, to put back after it: a command puts the spec's
    folder and its working folder on ``sys.path`` and imports the workload from there, which
    a later command in another folder must import afresh, as a new process would."""

    env: dict[str, str]
    cwd: Path
    stdin: Any
    path: list[str]
    modules: set[str]

    def restore(self) -> None:
        os.environ.clear()
        os.environ.update(self.env)
        os.chdir(self.cwd)
        sys.stdin = self.stdin
        sys.path[:] = self.path
        for name in set(sys.modules) - self.modules:
            file = getattr(sys.modules[name], "__file__", None)
            if file and not any(Path(file).resolve().is_relative_to(r) for r in _LASTING):
                del sys.modules[name]


def plan_json(capsys: pytest.CaptureFixture[str], spec: Path) -> dict[str, Any]:
    code, out, err = run_cli(capsys, "plan", str(spec), "--json")
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def assert_self_contained(page: str) -> None:
    """The HTML page fetches nothing when viewed: no external sources, links, imports or
    scripts."""
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    assert "@import" not in page and "<script" not in page
    assert not re.search(r"url\((?!#)", page)  # only in-page references such as clip paths


def restart_spec(spec_id: str, seed: int, episodes: int) -> ExperimentSpec:
    """A retry-cascade experiment of two worlds: baseline and ``restart``."""
    return ExperimentSpec.model_validate(
        {
            "id": spec_id,
            "hypothesis": {"text": "h"},
            "seed": seed,
            "episodes": episodes,
            "workload": {"name": "retry-cascade"},
            "worlds": [
                {"name": "baseline", "role": "baseline"},
                {"name": "restart", "role": "treatment", "intervention": {"name": "restart"}},
            ],
        }
    )
