"""A workload whose worlds try to reach each other, for the world-group tests (loaded by
import path, ``group_workloads:Siblings``).

Each intervention misbehaves in its own way: ``taint`` changes the module's memory,
``linger`` leaves a process running that outlives its world, ``hang`` never ends,
``spin`` burns CPU with SIGXCPU ignored, ``raise`` fails and ``die`` kills its own
process. Every world's outcome is whether it saw nothing of that: no taint in memory and
no lingering process. Run in one process (the local twin), a world after a ``taint``
world does see it; each in a forked process of its own (a world group), none does.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from forklab.runtime.crn import Shocks
from forklab.runtime.workload import Feature, State, Workload

TAINTED = False
#: Where a ``linger`` world's leftover process writes its pid (the worlds' working
#: folders are siblings in the group's folder).
PID_FILE = os.path.join("..", "linger.pid")


def _lingering() -> bool:
    try:
        with open(PID_FILE, encoding="ascii") as fh:
            pid = int(fh.read())
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, ValueError):
        return False


def _linger() -> None:
    """Leave a process behind: double-forked, in a session of its own."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(PID_FILE + ".tmp", "w", encoding="ascii") as fh:
                fh.write(str(os.getpid()))
            os.replace(PID_FILE + ".tmp", PID_FILE)
            time.sleep(600)
        os._exit(0)
    while not os.path.exists(PID_FILE):
        time.sleep(0.01)


class Siblings(Workload):
    name = "siblings"
    default_params: ClassVar[Mapping[str, Any]] = {"ticks": 4}
    interventions: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "taint": {},
        "linger": {},
        "hang": {},
        "spin": {},
        "raise": {},
        "die": {},
    }
    feature_types: ClassVar[Mapping[str, Any]] = {"t": int}

    def initial_state(self, episode_seed: int, shocks: Shocks) -> State:
        return {"t": 0}

    def boundary(self, state: State) -> int:
        return 1

    def cursor(self, state: State) -> int:
        return int(state["t"])

    def step(self, state: State, shocks: Shocks) -> None:
        state["t"] += 1
        shocks.exogenous(0, state["t"], "x")

    def done(self, state: State) -> bool:
        return bool(state["t"] >= self.params["ticks"])

    def features(self, state: State) -> dict[str, Feature]:
        return {"t": state["t"]}

    def outcome(self, state: State) -> bool:
        return not TAINTED and not _lingering()

    def intervene(self, state: State, name: str, params: Mapping[str, Any], shocks: Shocks) -> None:
        global TAINTED
        if name == "taint":
            TAINTED = True
        elif name == "linger" and not os.path.exists(PID_FILE):
            _linger()
        elif name == "hang":
            while True:
                time.sleep(0.05)
        elif name == "spin":  # deaf to the soft CPU limit: only the hard one stops it
            signal.signal(signal.SIGXCPU, signal.SIG_IGN)
            while True:
                pass
        elif name == "raise":
            raise RuntimeError("the world fails on purpose")
        elif name == "die":
            os.kill(os.getpid(), signal.SIGKILL)
