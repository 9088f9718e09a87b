"""One call of a stdlib-only program of ForkLab's runtime over a copy of the user's code,
in a box: what workload calls (``workload_calls``) and a cohort's scorer and feature
calls (``cohort_code_calls``) share.

The code is copied into the call's own folder and its digest taken from the copies (what
runs is what was checked, not what the source folder holds by then); the request is
written for the box's user only; the program runs under ``run_confined`` with the code
and the program mounted read-only and nothing of the worker's environment."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from forklab.activities.experiment.runner_bundle import code_digest
from forklab.activities.files import atomic_write
from forklab.activities.sandbox.base import ExecResult, Limits
from forklab.activities.sandbox.confine import run_confined
from forklab.activities.sandbox.jail import SCRATCH_INSIDE, Mount, interpreter, sandbox_uid
from forklab.experiments.experiment.bundle import BundleFile

_CODE_INSIDE = "/code"


def copy_code(files: list[BundleFile], code: Path) -> str:
    """Copy ``files`` under ``code``; the code digest of the copies."""
    for f in files:
        (code / f.relpath).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f.source, code / f.relpath)
    return code_digest([BundleFile(f.relpath, code / f.relpath) for f in files])


def run_program(
    program: Path,
    args: list[str],
    folder: Path,
    request: bytes,
    limits: Limits,
    started: Callable[[int], None] = lambda pid: None,
) -> ExecResult:
    """Run ``program`` (a file of ``forklab/runtime/``) with ``args`` over the code copied
    under ``folder/code``, its request in ``folder/work/in.json``; the box's scratch is
    ``folder/work``, where it writes its answer."""
    code, work = folder / "code", folder / "work"
    work.mkdir()
    atomic_write(work / "in.json", request)
    uid = sandbox_uid(folder.name)
    if uid is not None:
        for path in (work, work / "in.json"):
            os.chown(path, uid, uid)
    inside = f"/.forklab/{program.name}"
    env = {"PATH": "/usr/bin:/bin", "HOME": SCRATCH_INSIDE, "LC_ALL": "C.UTF-8"}
    return run_confined(
        [str(interpreter()), "-S", "-B", inside, *args],
        mounts=[Mount(code, _CODE_INSIDE), Mount(program, inside)],
        scratch=work,
        env=env | {"TMPDIR": SCRATCH_INSIDE, "PYTHONPATH": _CODE_INSIDE},
        fallback_env=env | {"TMPDIR": str(work), "PYTHONPATH": str(code)},
        limits=limits,
        uid=uid,
        timeout=limits.wall_seconds,
        on_start=started,
    )


def tail(text: str) -> str:
    """The last non-empty line of a box's output, for a one-line error."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"
