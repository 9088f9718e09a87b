"""A user's package of cohort scorers and feature functions, honest and hostile, written
into a test's folder: what the box tests and the durable cohort tests run."""

from __future__ import annotations

from pathlib import Path

from forklab.activities.experiment.workload_bundles import ship_workload
from forklab.activities.stores.artifacts import ArtifactStore
from forklab.experiments.experiment.bundle import BundleFile

#: The module's functions (``usercode.scoring:<name>``).
SCORING = '''
import os
import socket

CALLS = []


def resolved(result, final_state, steps):
    """Honest: the run's own score, as ForkLab's final_score reads it."""
    state = final_state[0] if isinstance(final_state, list) and final_state else final_state
    state = state if isinstance(state, dict) else {}
    score = state.get("score")
    return float(score) if isinstance(score, (int, float)) and 0 <= score <= 1 else 0.0


def features(steps, decisive):
    """Honest: pre-decision features over the inherited steps."""
    tools = [s for s in steps if s["type"] != "chat_model"]
    return {
        "steps_before": len(steps),
        "last_failed": bool(steps) and steps[-1]["status"] == "failed",
        "tool": decisive["label"] or decisive["type"] if decisive else None,
        "tool_calls": len(tools),
    }


def breaks_on_forks(result, final_state, steps):
    """Honest on the recorded runs (which inherit nothing), NaN on every fork."""
    if any(s["origin"] == "inherited" for s in steps):
        return float("nan")
    return resolved(result, final_state, steps)


def leaky_features(steps, decisive):
    """Counts its calls in a module global: would tell each run how many came before."""
    CALLS.append(1)
    return {"calls_seen": len(CALLS)}


def reads_env(result, final_state, steps):
    return os.environ["FORKLAB_TEST_SECRET"] == "x"


def reads_file(result, final_state, steps):
    with open("SECRET_FILE") as fh:
        return fh.read() == "x"


def writes_file(result, final_state, steps):
    with open("OUTSIDE_FILE", "w") as fh:
        fh.write("written by a scorer")
    return True


def rewrites_ledger(result, final_state, steps):
    """Tries to change another run's recorded outcome in the worker's ledger file."""
    with open("LEDGER_FILE", "a") as fh:
        fh.write("run other: success")
    return True


def loops(result, final_state, steps):
    while True:
        pass


def nan(result, final_state, steps):
    return float("nan")


def too_big(result, final_state, steps):
    return 1.5


def text(result, final_state, steps):
    return "yes"


def remembers(result, final_state, steps):
    """Tries to make a later call's answer depend on this one: a file in its working
    folder and a module global."""
    seen = os.path.exists("verdicts")
    with open("verdicts", "a") as fh:
        fh.write("x")
    CALLS.append(1)
    return not seen and len(CALLS) == 1


def phones_home(result, final_state, steps):
    socket.create_connection(("127.0.0.1", PORT), timeout=2)
    return True


def kills_its_box(result, final_state, steps):
    os.kill(os.getppid(), 9)
    return True


def team_approved(result, final_state, steps):
    """A team's verdict read from its view: the reviewer approved a draft the writer
    completed, and the scorer's result is the reviewer's own."""
    members = {m["workflow_type"]: m for m in final_state["members"]}
    reviewer = members["TeamReviewer"]
    assert final_state["result_member"] == reviewer["member"] and result == reviewer["result"]
    assert [s["type"] for s in steps] == ["chat_model"]
    return members["TeamWriter"]["status"] == "completed" and reviewer["result"]["approved"]


def bad_features(steps, decisive):
    return {"ratio": float("inf")}


def not_a_dict(steps, decisive):
    return [1, 2]
'''


def ship_package(store: ArtifactStore, root: Path, port: int = 9) -> str:
    """Write the package under ``root`` and ship it as ``forklab cohort start`` does; the
    bundle's digest (the workflow input's ``code_bundle``)."""
    files = write_package(root, root / "secret.txt", root / "outside.txt", port)
    return ship_workload(store, {f.relpath: f.source.read_bytes() for f in files}).digest


def write_package(root: Path, secret_file: Path, outside_file: Path, port: int) -> list[BundleFile]:
    """``usercode/`` under ``root``; the bundle files of it."""
    pkg = root / "usercode"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    text = (
        SCORING.replace('"SECRET_FILE"', repr(str(secret_file)))
        .replace('"OUTSIDE_FILE"', repr(str(outside_file)))
        .replace('"LEDGER_FILE"', repr(str(secret_file.with_name("ledger.txt"))))
        .replace("PORT", str(port))
    )
    (pkg / "scoring.py").write_text(text)
    return [
        BundleFile("usercode/__init__.py", pkg / "__init__.py"),
        BundleFile("usercode/scoring.py", pkg / "scoring.py"),
    ]
