"""The boxed rehearsal checks the contract on every prefix before approval, in parts over
the box's CPUs: whichever part a broken episode falls in, the answer is the sentence of
the first broken episode in episode order, as one loop would give it."""

from __future__ import annotations

import os
import re
import sys
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from forklab.activities.experiment.runner_bundle import bundle_files
from forklab.activities.sandbox import confine
from forklab.activities.sandbox.base import Limits
from forklab.activities.sandbox.workload_calls import (
    CALL_LIMITS,
    WorkloadCalls,
    WorkloadContractError,
)
from forklab.experiments.experiment.bundle import BundleFile
from forklab.experiments.experiment.spec import ExperimentSpec
from forklab.experiments.experiment.worlds import spec_world_plans
from forklab.runtime import worker_calls
from forklab.runtime.contract import ContractViolation
from forklab.runtime.file_format import WorldPlan
from forklab.runtime.workload import WorkloadError
from tests.helpers import restart_spec

#: A two-step workload whose step raises (a contract violation) in the episodes ``bad``.
BREAKS_AT = """
import threading

from forklab.runtime.workload import Workload

_HELD = []  # threads that take the box's process slots (``threads``)


class BreaksAt(Workload):
    name = "breaks-at"
    default_params = {"bad": [], "threads": 0}
    interventions = {"nudge": {}}
    feature_types = {"tries": int}

    def initial_state(self, episode_seed, shocks):
        while len(_HELD) < self.params["threads"]:
            _HELD.append(threading.Thread(target=threading.Event().wait, daemon=True))
            _HELD[-1].start()
        return {"tries": 0}

    def boundary(self, state):
        return 1

    def cursor(self, state):
        return state["tries"]

    def step(self, state, shocks):
        if shocks.episode in self.params["bad"]:  # (saying the limits it runs under)
            import resource

            cpu = resource.getrlimit(resource.RLIMIT_CPU)[1]
            memory = resource.getrlimit(resource.RLIMIT_AS)[1]
            raise KeyError(f"broken cpu={cpu} as={memory}")
        state["tries"] += 1

    def done(self, state):
        return state["tries"] >= 2

    def outcome(self, state):
        return state["tries"] == 2

    def features(self, state):
        return {"tries": state["tries"]}

    def intervene(self, state, name, params, shocks):
        pass
"""

EPISODES = 5_000  # the check splits into two parts of ~2,490 on two CPUs


def breaks_spec(
    tmp_path: Path, params: dict[str, Any], episodes: int, source: str = BREAKS_AT
) -> tuple[ExperimentSpec, list[BundleFile]]:
    """A spec of ``source``'s ``BreaksAt`` (a module of the bundle) and the bundle."""
    module = tmp_path / "breaks_at.py"
    module.write_text(source)
    spec = ExperimentSpec.model_validate(
        {
            "id": "breaks",
            "hypothesis": {"text": "h"},
            "seed": 1,
            "episodes": episodes,
            "workload": {"name": "breaks_at:BreaksAt", "params": params},
            "worlds": [
                {"name": "baseline", "role": "baseline"},
                {"name": "nudge", "role": "treatment", "intervention": {"name": "nudge"}},
            ],
        }
    )
    return spec, bundle_files(spec.workload.name, [BundleFile("breaks_at.py", module)])


def rehearse(
    tmp_path: Path,
    bad: list[int],
    episodes: int = EPISODES,
    limits: Limits = CALL_LIMITS,
    threads: int = 0,
) -> dict[str, object]:
    spec, files = breaks_spec(tmp_path, {"bad": bad, "threads": threads}, episodes)
    calls = WorkloadCalls(tmp_path / "calls", limits)
    answer, _, _ = calls.rehearse(spec, spec_world_plans(spec), 20, files)
    return answer


@pytest.mark.parametrize(
    ("bad", "first"),
    [([4_500], 4_500), ([3_000, 4_500], 3_000), ([1_000, 4_500], 1_000), ([4_999], 4_999)],
)
def test_the_first_broken_prefix_is_answered_whichever_part_it_is_in(
    tmp_path: Path, bad: list[int], first: int
) -> None:
    with pytest.raises(WorkloadContractError) as caught:
        rehearse(tmp_path, bad)
    assert f"(episode {first}, prefix" in str(caught.value), str(caught.value)


def test_a_workload_without_broken_prefixes_rehearses(tmp_path: Path) -> None:
    answer = rehearse(tmp_path, [])
    assert answer["episodes"] == 20
    assert not list((tmp_path / "calls").iterdir()), "the call's folder is removed"


@pytest.mark.parametrize("episodes", [20, 7, 2_010])
def test_a_spec_no_bigger_than_its_sample_or_than_one_part_rehearses(
    tmp_path: Path, episodes: int
) -> None:
    assert rehearse(tmp_path, [], episodes)["episodes"] == 20


def _broken_answer(tmp_path: Path, limits: Limits = CALL_LIMITS, threads: int = 0) -> str:
    with pytest.raises(WorkloadContractError) as caught:
        rehearse(tmp_path, [4_999], limits=limits, threads=threads)
    return str(caught.value)


def test_a_part_runs_under_its_share_of_the_boxs_limits(tmp_path: Path) -> None:
    """Episode 4,999 is in the last part, a forked process on two CPUs or more: it may use
    its share of the box's CPU seconds and address space, not the box's whole."""
    parts = min(len(os.sched_getaffinity(0)), EPISODES // worker_calls.MIN_CHECKS_PER_PROCESS)
    found = re.search(r"cpu=(\d+) as=(\d+)", _broken_answer(tmp_path))
    assert found is not None
    cpu, memory = int(found[1]), int(found[2])
    assert cpu <= CALL_LIMITS.cpu_seconds // parts + 1, (cpu, parts)
    box_memory = CALL_LIMITS.memory_mb * 1024 * 1024
    assert memory < box_memory if parts > 1 else memory == box_memory, (memory, parts)


def test_a_box_with_no_room_for_more_processes_answers_as_one_loop_would(
    tmp_path: Path,
) -> None:
    """The box's process limit leaves no room for a part (the workload's threads hold all
    of it, so a fork would fail): the prefixes are checked in one process, with the same
    answer and the box's own limits."""
    few = CALL_LIMITS.model_copy(update={"processes": 4})
    answer = _broken_answer(tmp_path, few, threads=3)
    assert "(episode 4999, prefix" in answer, answer
    assert f"cpu={CALL_LIMITS.cpu_seconds + 1} " in answer, answer


BREAKS_AT_HERE: dict[str, object] = {}
exec(compile(BREAKS_AT, "breaks_at_here.py", "exec"), BREAKS_AT_HERE)


def test_a_part_that_cannot_be_forked_is_checked_in_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every fork fails (the box's processes ran out after the parts were counted): each
    part is checked by the box's own process, and the first broken episode is answered."""

    attempts: list[int] = []

    def no_fork() -> int:
        attempts.append(1)
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr(worker_calls, "MIN_CHECKS_PER_PROCESS", 10)
    cls = BREAKS_AT_HERE["BreaksAt"]
    assert isinstance(cls, type)
    workload = cls({"bad": [25, 35]})
    with pytest.raises(ContractViolation) as caught:
        worker_calls._check_prefixes(workload, 1, range(40), None)
    assert "(episode 25, prefix" in str(caught.value), str(caught.value)
    assert len(attempts) == 3, "the check was split in three parts, each fork failed"


def parts_on_three_cpus(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the box's work split into parts of at least 10 over three CPUs; returns the
    list that gets one entry per process forked."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr(worker_calls, "MIN_CHECKS_PER_PROCESS", 10)
    forks: list[int] = []
    real_fork = os.fork

    def counted() -> int:
        forks.append(1)
        return real_fork()

    monkeypatch.setattr(os, "fork", counted)
    return forks


def _module(source: str) -> types.ModuleType:
    module = types.ModuleType("breaks_at_held_out")
    exec(compile(source, "breaks_at_held_out.py", "exec"), module.__dict__)
    return module


def _held_out_request(workload: str, params: dict[str, object], episodes: range) -> dict[str, Any]:
    plans = [WorldPlan("baseline"), WorldPlan("restart", "restart"), WorldPlan("voted", forks=3)]
    return {
        "workload": workload,
        "params": params,
        "seed": 7,
        "episodes": list(episodes),
        "worlds": [p.to_json() for p in plans],
    }


def test_held_out_episodes_run_in_parts_and_join_as_one_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guard's held-out batch in three forked parts equals it in one process, column
    for column and in episode order."""
    request = _held_out_request("retry-cascade", {}, range(100, 160))
    one = worker_calls.batch(request)
    forks = parts_on_three_cpus(monkeypatch)
    assert worker_calls.batch(request) == one
    assert len(forks) == 3
    assert one["episodes"] == list(range(100, 160))


def test_a_held_out_part_that_breaks_the_contract_answers_its_sentence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broken episode in the second part is answered (the first part passed). It is
    the part's first episode: this workload draws nothing, so a later episode of the part
    reuses that prefix (the memo, as on the twin) and never steps."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(worker_calls, "MIN_CHECKS_PER_PROCESS", 10)
    monkeypatch.setitem(sys.modules, "breaks_at_held_out", _module(BREAKS_AT))
    request = _held_out_request("breaks_at_held_out:BreaksAt", {"bad": [20]}, range(40))
    request["worlds"] = [WorldPlan("baseline").to_json()]
    with pytest.raises(worker_calls._Answer) as caught:
        worker_calls.batch(request)
    assert "(episode 20, prefix" in str(caught.value), str(caught.value)


def test_without_bubblewrap_the_rehearsal_runs_as_a_confined_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a host without bubblewrap the rehearsal's program is run from where it is on
    the host (``/.forklab/...`` exists only in a box), and says how it was confined."""
    monkeypatch.setattr(confine, "bubblewrap", lambda: (None, "bwrap is not installed"))
    spec = restart_spec("no-bwrap", 1, 30)
    calls = WorkloadCalls(tmp_path / "calls")
    files = bundle_files(spec.workload.name)
    answer, _, ran = calls.rehearse(spec, spec_world_plans(spec), 10, files)
    assert ran.confinement == "process" and ran.note and "bwrap is not installed" in ran.note
    assert answer["episodes"] == 10
    assert [w["name"] for w in answer["worlds"]] == ["baseline", "restart"]


def _piece_job(slow: int, fails: dict[int, float]) -> Callable[[Sequence[int]], int]:
    """A job over pieces of one item: the ``slow`` item takes a second, an item in
    ``fails`` raises after that many seconds; each piece returns the pid that ran it."""

    def job(piece: Sequence[int]) -> int:
        (item,) = piece
        if item == slow:
            time.sleep(1.0)
        if item in fails:
            time.sleep(fails[item])
            raise WorkloadError(f"item{item}", "broken")
        return os.getpid()

    return job


def test_a_part_that_is_slow_on_one_piece_leaves_the_rest_to_the_others() -> None:
    """Pieces are taken from a queue, not dealt out in runs: while one part is stuck on
    the first piece, the other does all the rest (dealt out in runs, it would have done
    only the second half and left the first part three more pieces)."""
    pids = worker_calls._in_parts(range(8), _piece_job(0, {}), parts=2, piece=1)
    assert len(pids) == 8
    assert os.getpid() not in pids, "every piece ran in a forked part"
    assert pids[0] not in pids[1:], pids
    assert len(set(pids[1:])) == 1, pids


def test_the_first_failed_piece_in_order_is_answered_not_the_first_in_time() -> None:
    """Item 3 fails at once, item 1 a second later: the answer is item 1's, as one loop
    over the items would give."""
    job = _piece_job(-1, {1: 1.0, 3: 0.0})
    with pytest.raises(worker_calls._Answer) as caught:
        worker_calls._in_parts(range(6), job, parts=2, piece=1)
    assert caught.value.answer == {"error": "field item1: broken"}
