"""The program that runs a user's outcome scorer or feature function of a cohort experiment
in a box: ``python -S -B /.forklab/cohort_calls.py`` inside bubblewrap, with the user's
bundle read-only on ``PYTHONPATH`` (``/code``) and nothing of ForkLab but this file.

It reads ``in.json`` from the scratch folder: ``field`` (``cohort.outcome`` or
``cohort.features``), ``callable`` (``module:function``), ``seconds`` (each item's time)
and ``items``, each ``{"at": where, "args": [...]}``. It imports the module once, then
calls the function on every item **in a forked process of its own**, started from the
untouched parent, in a fresh working folder of its own: what one call changes (a global,
the module, a file in its folder, a process left in its group) is gone before the next
call, so no run's answer can depend on another's. Each child has ``seconds`` of wall
clock (``SIGALRM``, whose default action kills it) and of CPU (``RLIMIT_CPU``).

``out.json`` holds ``{"answers": [{"value": v} | {"contract": sentence}, ...]}``, one per
item in order, or ``{"contract": sentence}`` when the module cannot be imported. The
sentence names the field, the callable, what went wrong and where (``file:line`` of the
user's code, the item). The worker checks every answer again: it does not trust the box.
Standard library only.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import resource
import shutil
import signal
import sys
import traceback
from typing import Any

SCORE = "cohort.outcome"
FEATURES = "cohort.features"
#: The most features one call may return, and the longest name and text value: each is
#: sliced, shown and searched by the guard (as a workload's ``features``).
MAX_FEATURES = 32
MAX_FEATURE_NAME = 100
MAX_FEATURE_TEXT = 200
_MESSAGE_CHARS = 200
_STDLIB = os.path.dirname(os.__file__)
_HERE = os.path.abspath(__file__)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 1] + "…"


def _shown(value: object) -> str:
    return f"{type(value).__name__} {_short(repr(value))}"


def _place(exc: BaseException) -> str:
    """``file:line`` of the deepest frame of the user's code (outside the standard library,
    frozen modules and this file), relative to the import path entry that holds it (the bundle)."""
    found = ""
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        ours = name.startswith((_STDLIB, "<")) or os.path.abspath(name) == _HERE
        if not ours:
            found = f"{name}:{tb.tb_lineno}"
            for root in sorted(filter(None, sys.path), key=len, reverse=True):
                base = os.path.abspath(root) + os.sep
                if name.startswith(base):
                    found = f"{name[len(base) :]}:{tb.tb_lineno}"
                    break
        tb = tb.tb_next
    return f" at {found}" if found else ""


def _raised(exc: BaseException) -> str:
    return f"raised {type(exc).__name__}: {_short(str(exc))}".rstrip(": ") + _place(exc)


def check_score(value: object) -> str | None:
    """Why ``value`` is no score (None: it is one): a bool, or a finite number in [0, 1]."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        if not math.isfinite(value):
            return f"returned {_shown(value)}, not a finite score"
        if 0 <= value <= 1:
            return None
        return f"returned {_shown(value)}, out of [0, 1]"
    return f"returned {_shown(value)}, not a bool or a score in [0, 1]"


def _feature_problem(name: object, value: object) -> str | None:
    if not (isinstance(name, str) and name.isprintable() and 0 < len(name) <= MAX_FEATURE_NAME):
        return (
            f"returned the feature name {_short(repr(name))}; name a feature with 1 to "
            f"{MAX_FEATURE_NAME} printable characters on one line"
        )
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if -(2**63) <= value < 2**63 else f"returned {name!r} = {value}, past 64 bits"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"returned {name!r} = {value!r}, not finite"
    if isinstance(value, str):
        if value.isprintable() and len(value) <= MAX_FEATURE_TEXT:
            return None
        return (
            f"returned {name!r} = {_short(repr(value))}; a text feature is one printable line "
            f"of at most {MAX_FEATURE_TEXT} characters"
        )
    return f"returned {name!r} = {_shown(value)}; a feature is a bool, int, float, str or None"


def check_features(value: object) -> str | None:
    """Why ``value`` is no features mapping (None: it is one)."""
    if not isinstance(value, dict):
        return f"returned {_shown(value)}, not a dict of feature name to value"
    if len(value) > MAX_FEATURES:
        return f"returned {len(value)} features; return at most {MAX_FEATURES}"
    for name, item in value.items():
        problem = _feature_problem(name, item)
        if problem is not None:
            return problem
    return None


def _call(fn: Any, field: str, args: list[Any]) -> dict[str, Any]:
    """The answer of one call, in this process (a child of the box's parent)."""
    try:
        value = fn(*args)
    except BaseException as exc:  # the user's code: anything it raises is its answer
        return {"contract": _raised(exc)}
    problem = check_score(value) if field == SCORE else check_features(value)
    if problem is not None:
        return {"contract": problem}
    return {"value": value}


def _child(fn: Any, field: str, args: list[Any], seconds: float, write: int) -> None:
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        cpu = max(1, math.ceil(seconds))
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        used = resource.getrusage(resource.RUSAGE_SELF)
        limit = math.ceil(used.ru_utime + used.ru_stime) + cpu
        if hard == resource.RLIM_INFINITY or limit < hard:
            resource.setrlimit(resource.RLIMIT_CPU, (limit, limit + 1))
        answer = _call(fn, field, args)
        text = json.dumps(answer, allow_nan=False)
    except BaseException:
        text = json.dumps({"crash": traceback.format_exc()[-1000:]})
    with os.fdopen(write, "w", encoding="utf-8") as pipe:
        pipe.write(text)
    os._exit(0)


def _one(fn: Any, field: str, args: list[Any], seconds: float, folder: str) -> dict[str, Any]:
    """One call in a forked child working in ``folder`` (fresh, removed afterwards, with
    whatever it left running in its process group), its answer read from a pipe until the
    child ends."""
    os.mkdir(folder)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.setpgid(0, 0)
        os.chdir(folder)
        _child(fn, field, args, seconds, write)
    os.close(write)
    with os.fdopen(read, encoding="utf-8") as pipe:
        text = pipe.read()
    _, status = os.waitpid(pid, 0)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) in (
        signal.SIGALRM,
        signal.SIGXCPU,
        signal.SIGKILL,
    ):
        return {"contract": f"ran past its {seconds:g} s and was killed (an endless loop?)"}
    try:
        answer = json.loads(text)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or "crash" in answer:
        how = (
            f"was killed by signal {os.WTERMSIG(status)}"
            if os.WIFSIGNALED(status)
            else f"exited with code {os.WEXITSTATUS(status)}"
        )
        return {"contract": f"{how} before it answered"}
    return answer


def _load(target: str) -> Any:
    module_name, _, function = target.partition(":")
    module = importlib.import_module(module_name)
    fn = getattr(module, function, None)
    if not callable(fn):
        raise LookupError(f"{module_name} has no function {function!r}")
    return fn


def run(request: dict[str, Any]) -> dict[str, Any]:
    field, target, seconds = request["field"], request["callable"], float(request["seconds"])
    try:
        fn = _load(target)
    except BaseException as exc:  # importing runs the user's module
        return {"contract": f"{field} {target}: importing it {_raised(exc)}"}
    answers = []
    for i, item in enumerate(request["items"]):
        answer = _one(fn, field, item["args"], seconds, os.path.abspath(f"call-{i}"))
        if "contract" in answer:
            answer = {"contract": f"{field} {target} {answer['contract']} ({item['at']})"}
        answers.append(answer)
    return {"answers": answers}


def main() -> int:
    with open("in.json", encoding="utf-8") as fh:
        request = json.load(fh)
    result = run(request)
    with open("out.json", "w", encoding="utf-8") as fh:
        fh.write(json.dumps(result, allow_nan=False, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
