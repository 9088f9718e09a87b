"""Workloads for the orchestration tests, loaded by import path (``orchestration_workloads:Toy``).

Self-contained (standard library + the runtime) because a sandbox gets only this file and
the runner bundle. Inside a sandbox — recognised by the runner being the main program —
some interventions misbehave on purpose; in the local twin they behave like ``noop``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from forklab.runtime.crn import Shocks
from forklab.runtime.workload import Feature, State, Workload


def in_sandbox() -> bool:
    return os.path.basename(sys.argv[0]) == "box.py"


_PREFIX_SLEPT = False


def _out_path() -> str:
    return sys.argv[sys.argv.index("--out") + 1]


class Toy(Workload):
    """Score a point per tick when the shock is kind; ``boost`` adds one more per tick;
    ``drag`` (a known harm, for positive controls) scores nothing after the fork."""

    name = "toy"
    default_params: ClassVar[Mapping[str, Any]] = {
        "ticks": 8,
        "fork_tick": 3,
        "goal": 5,
        "twin_sleep": 0.0,
        "sandbox_sleep": 0.0,
        "prefix_sleep": 0.0,  # once per process that runs prefixes, outside the test process
    }
    interventions: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "boost": {},
        "drag": {},
        "noop": {},
        "crash": {},
        "garbage": {},
    }
    feature_types: ClassVar[Mapping[str, Any]] = {"ahead": bool}

    def initial_state(self, episode_seed: int, shocks: Shocks) -> State:
        return {"t": 0, "score": 0, "boost": False}

    def boundary(self, state: State) -> int:
        global _PREFIX_SLEPT
        if self.params["prefix_sleep"] and "pytest" not in sys.modules and not _PREFIX_SLEPT:
            _PREFIX_SLEPT = True
            time.sleep(self.params["prefix_sleep"])
        return int(self.params["fork_tick"])

    def cursor(self, state: State) -> int:
        return int(state["t"])

    def step(self, state: State, shocks: Shocks) -> None:
        state["t"] += 1
        if shocks.exogenous(0, state["t"], "kind") < 0.5 and not state.get("drag"):
            state["score"] += 1
        if state["boost"]:
            state["score"] += 1

    def done(self, state: State) -> bool:
        return bool(state["t"] >= self.params["ticks"])

    def outcome(self, state: State) -> bool:
        pause = self.params["sandbox_sleep"] if in_sandbox() else self.params["twin_sleep"]
        if pause:
            time.sleep(pause)
        return bool(state["score"] >= self.params["goal"])

    def features(self, state: State) -> dict[str, Feature]:
        return {"ahead": state["score"] >= state["t"] // 2}

    def intervene(self, state: State, name: str, params: Mapping[str, Any], shocks: Shocks) -> None:
        if name == "boost":
            state["boost"] = True
        elif name == "drag":
            state["drag"] = True
        elif name == "crash" and in_sandbox():
            os._exit(3)
        elif name == "garbage" and in_sandbox():
            with open(_out_path(), "w", encoding="utf-8") as fh:
                fh.write("this is not JSON {")
            os._exit(0)


def _probe(home: str, port: int) -> str:
    """What a hostile workload reaches from where it runs: tokens and keys under the home,
    the Temporal server, the home itself, the worker's environment and its packages."""
    import glob
    import socket

    read = []
    for path in glob.glob(os.path.join(home, "**", "*"), recursive=True):
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                if "token" in path or "key" in path:
                    read.append(fh.read(200).strip())
        except OSError:
            pass
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        net = "connected"
    except OSError as exc:
        net = f"refused ({exc.__class__.__name__})"
    try:
        with open(os.path.join(home, "pwned"), "w", encoding="utf-8") as fh:
            fh.write("pwned")
        write = "written"
    except OSError:
        write = "denied"
    try:
        import temporalio  # noqa: F401

        client = "importable"
    except ImportError:
        client = "missing"
    env = sorted(k for k in os.environ if k.startswith("FORKLAB"))
    return f"secrets={read} net={net} home={write} temporalio={client} env={env}"


class Hostile(Toy):
    """Probes its surroundings wherever it runs outside the test process, and reports what
    it reached by failing its parameter check with the report as the message."""

    name = "hostile"
    default_params: ClassVar[Mapping[str, Any]] = {**Toy.default_params, "home": "", "port": 0}

    def check_params(self) -> None:
        if "pytest" in sys.modules or not self.params["home"]:
            return
        from forklab.runtime.workload import WorkloadError

        report = _probe(str(self.params["home"]), int(self.params["port"]))
        raise WorkloadError("workload.params.home", f"hostile report: {report}")


class ToyFiles(Toy):
    """``Toy`` keeping its score in the episode's workspace as well as in the state: the
    durable path then runs its prefixes in prefix sandboxes that freeze the workspaces
    into the layers every world attaches (the rehearsal only checks them)."""

    name = "toy-files"
    has_workspace = True

    def _score_file(self) -> Path:
        assert self.workspace is not None
        return self.workspace / "score.txt"

    def initial_state(self, episode_seed: int, shocks: Shocks) -> State:
        self._score_file().write_text("0")
        return super().initial_state(episode_seed, shocks)

    def step(self, state: State, shocks: Shocks) -> None:
        super().step(state, shocks)
        self._score_file().write_text(str(state["score"]))

    def outcome(self, state: State) -> bool:
        # the file a world inherited and kept writing must agree with its state
        return super().outcome(state) and int(self._score_file().read_text()) == state["score"]
