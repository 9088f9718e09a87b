"""A user's outcome scorer or feature function of a cohort experiment, run in a box like
workload code, never in the worker's process.

Each call copies the user's bundle into a fresh folder (checked against the code digest
the plan named: what runs is what the approver signed), binds it read-only at ``/code``
and runs ``forklab/runtime/cohort_calls.py`` there with ``run_confined`` (bubblewrap: no
network, no ``FORKLAB_HOME``, a cleared environment, rlimits, dies with the worker). The
box answers one JSON object, which is checked here again like any untrusted output: one
answer per item, each a score (a bool or a finite number in [0, 1]) or a features mapping
of the allowed types, or a one-sentence contract breach.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forklab.activities.sandbox.base import Limits, read_box_file
from forklab.activities.sandbox.code_box import copy_code, run_program, tail
from forklab.activities.sandbox.jail import RUNTIME
from forklab.experiments.experiment.bundle import BundleFile
from forklab.runtime import strict_json
from forklab.runtime.cohort_calls import FEATURES, SCORE, check_features, check_score

#: One box: the memory and processes of a small Python program, forking one child a call.
CODE_LIMITS = Limits(memory_mb=512, cpu_seconds=600, wall_seconds=600, processes=16)
#: Each call's own wall clock and CPU seconds inside the box.
CALL_SECONDS = 10.0
#: How many items one box answers (a cohort's features are asked in boxes of this many
#: runs, so that one box's input stays small).
ITEMS_PER_BOX = 200
_PROGRAM = RUNTIME / "cohort_calls.py"


class UserCodeError(ValueError):
    """The user's code broke its contract (or its box failed); the message is the one
    sentence to show. Deterministic: the same code on the same input breaks again."""


@dataclass(frozen=True)
class CodeItem:
    """One call: where it is (shown in a sentence: the run, the world, the fork) and the
    function's arguments (JSON)."""

    at: str
    args: list[Any]


def _checked(field: str, name: str, answer: object, items: Sequence[CodeItem]) -> list[Any]:
    """The box's values, one per item, after checking each again; the first breach (a
    sentence of the box, or an answer it should have refused) is a ``UserCodeError``."""
    if not isinstance(answer, dict):
        raise UserCodeError(f"{field} {name}: its box answered something that is not an object")
    if "contract" in answer:
        raise UserCodeError(str(answer["contract"])[:1000])
    found = answer.get("answers")
    if not isinstance(found, list) or len(found) != len(items):
        raise UserCodeError(f"{field} {name}: its box did not answer once for each call")
    values = []
    check = check_score if field == SCORE else check_features
    for item, one in zip(items, found, strict=True):
        if isinstance(one, dict) and "contract" in one:
            raise UserCodeError(str(one["contract"])[:1000])
        if not (isinstance(one, dict) and "value" in one):
            raise UserCodeError(f"{field} {name}: its box answered no value ({item.at})")
        problem = check(one["value"])
        if problem is not None:
            raise UserCodeError(f"{field} {name} {problem} ({item.at})")
        values.append(one["value"])
    return values


class CohortCodeCalls:
    """Runs a user's scorer or feature function in boxes under ``root`` (one folder per
    call, removed afterwards; leftovers of a dead worker are removed by the next one)."""

    def __init__(
        self, root: Path, limits: Limits = CODE_LIMITS, call_seconds: float = CALL_SECONDS
    ) -> None:
        self.root = root
        self.limits = limits
        self.call_seconds = call_seconds
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob("code-*"):
            pid = stale.name.split("-")[1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                shutil.rmtree(stale, ignore_errors=True)

    def scores(
        self, files: list[BundleFile], digest: str, name: str, items: Sequence[CodeItem]
    ) -> list[bool | float]:
        """The scorer's answer for each item: ``name(result, final_state, steps)``."""
        return self._call(SCORE, files, digest, name, items)

    def features(
        self, files: list[BundleFile], digest: str, name: str, items: Sequence[CodeItem]
    ) -> list[dict[str, Any]]:
        """The feature function's answer for each item: ``name(steps, decisive)``, in boxes
        of ``ITEMS_PER_BOX`` items."""
        values: list[dict[str, Any]] = []
        for first in range(0, len(items), ITEMS_PER_BOX):
            values += self._call(
                FEATURES, files, digest, name, items[first : first + ITEMS_PER_BOX]
            )
        return values

    def _call(
        self,
        field: str,
        files: list[BundleFile],
        digest: str,
        name: str,
        items: Sequence[CodeItem],
    ) -> list[Any]:
        folder = self.root / f"code-{os.getpid()}-{secrets.token_hex(6)}"
        work = folder / "work"
        try:
            found = copy_code(files, folder / "code")
            if found != digest:
                raise UserCodeError(
                    f"{field} {name}: the code is now {found[:12]} but the plan named "
                    f"{digest[:12]}; start the experiment again"
                )
            request = {
                "field": field,
                "callable": name,
                "seconds": self.call_seconds,
                "items": [{"at": i.at, "args": i.args} for i in items],
            }
            body = json.dumps(request, allow_nan=False).encode()
            result = run_program(_PROGRAM, [], folder, body, self.limits)
            if result.timed_out:
                raise UserCodeError(
                    f"{field} {name}: its box ran out of its {self.limits.wall_seconds:g} s "
                    "and was killed"
                )
            if result.exit_code != 0:
                raise UserCodeError(
                    f"{field} {name}: its box exited with code {result.exit_code}: "
                    f"{tail(result.stderr)}"
                )
            try:
                answer = strict_json.loads(read_box_file(work / "out.json"), "out.json")
            except (OSError, ValueError) as exc:  # StrictJsonError is a ValueError
                raise UserCodeError(
                    f"{field} {name}: its box wrote no valid answer ({exc})"
                ) from None
            return _checked(field, name, answer, items)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
