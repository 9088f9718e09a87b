"""A world group: the worlds of one chunk in one sandbox, each in a forked process of its
own. The runner runs here as a sandbox runs it (``python -m forklab.runtime.runner
continue``, in a folder of its own), so what one world does to its process, its folder
or the processes it starts must not reach the next world, and the outcomes must be the
twin's, bit for bit."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from forklab.cli.experiment.specfile import load_spec
from forklab.experiments.experiment.worlds import spec_world_plans
from forklab.runtime.canon import canonical_json
from forklab.runtime.file_format import (
    WorldOutput,
    WorldPlan,
    checkpoint_line,
    parse_world_outputs,
    request_text,
)
from forklab.runtime.runner import run_batch, run_prefix, workload_class

ROOT = Path(__file__).resolve().parent.parent
SIBLINGS = "group_workloads:Siblings"


def run_group(
    folder: Path,
    workload: str,
    params: dict[str, object],
    episodes: int,
    worlds: list[WorldPlan],
    seconds: list[float],
    cpu_seconds: int | None = None,
) -> list[WorldOutput]:
    """The runner's ``continue`` of ``worlds`` in ``folder``, in a fresh process (under a
    hard limit of ``cpu_seconds``, as a box may set one)."""
    folder.mkdir()
    wl = workload_class(workload)(params)
    lines = "".join(checkpoint_line(run_prefix(wl, 0, e)) for e in range(episodes))
    (folder / "checkpoints.jsonl").write_text(lines)
    request = request_text(workload, params, 0, worlds=worlds, seconds=seconds)
    (folder / "request.json").write_text(request)
    files = ["--request", "request.json", "--checkpoints", "checkpoints.jsonl", "--out", "out"]
    python(folder, "-m", "forklab.runtime.box", "continue", *files, cpu_seconds=cpu_seconds)
    return parse_world_outputs((folder / "out").read_bytes(), episodes, len(worlds))


def python(folder: Path, *args: str, cpu_seconds: int | None = None) -> str:
    """This interpreter run with ``args`` in ``folder`` (the tests' workloads importable),
    to its successful end; what it printed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}

    def limit_cpu() -> None:
        if cpu_seconds is not None:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))

    ran = subprocess.run(
        [sys.executable, *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limit_cpu,
    )
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


def world(name: str, intervention: str | None = None) -> WorldPlan:
    return WorldPlan(name=name, intervention=intervention)


def test_a_group_gives_the_twins_outcomes_with_the_shared_block_runs(tmp_path: Path) -> None:
    """Retry-cascade names the block runs every world draws: the group works them out
    once, before the forks, and every world's columns are still the twin's."""
    spec = load_spec(str(ROOT / "forklab" / "workloads" / "retry-cascade.yaml"))
    plans = spec_world_plans(spec)
    params = dict(spec.workload.params)
    outputs = run_group(tmp_path / "box", spec.workload.name, params, 150, plans, [60.0] * 8)
    workload = workload_class(spec.workload.name)(params)
    twin = run_batch(workload, 0, range(150), plans, memo=False)["worlds"]
    for plan, output in zip(plans, outputs, strict=True):
        assert output.error is None and output.seconds > 0
        assert canonical_json(output.columns) == canonical_json(twin[plan.name]), plan.name


def test_each_world_starts_from_the_memory_the_group_shared(tmp_path: Path) -> None:
    """A world that changes the workload's module state changes it in its own process
    only: the world after it sees nothing of it, as when it runs alone. In the twin's one
    process it does see it (which is why the durable path isolates worlds)."""
    worlds = [world("taint", "taint"), world("baseline")]
    outputs = run_group(tmp_path / "box", SIBLINGS, {}, 5, worlds, [30.0, 30.0])
    taint, after = (o.columns for o in outputs)
    assert taint is not None and after is not None
    assert taint["outcomes"] == [False] * 5  # it saw its own taint
    assert after["outcomes"] == [True] * 5
    alone = run_group(tmp_path / "alone", SIBLINGS, {}, 5, [world("baseline")], [30.0])
    assert alone[0].columns == after
    twin = run_batch(workload_class(SIBLINGS)({}), 0, range(5), worlds, memo=False)["worlds"]
    assert twin["baseline"]["outcomes"] == [False] * 5


def test_a_process_a_world_leaves_is_killed_before_the_next_world(tmp_path: Path) -> None:
    """A world that leaves a process running (double-forked, in a session of its own, so
    its process group is not the world's) finds it gone once the world ended: the next
    world never sees it, and nothing of the group outlives the runner."""
    worlds = [world("linger", "linger"), world("baseline")]
    outputs = run_group(tmp_path / "box", SIBLINGS, {}, 3, worlds, [30.0, 30.0])
    linger, after = (o.columns for o in outputs)
    assert linger is not None and after is not None
    assert linger["outcomes"] == [False] * 3  # it saw its own leftover running
    assert after["outcomes"] == [True] * 3
    pid = int((tmp_path / "box" / "linger.pid").read_text())
    assert not Path(f"/proc/{pid}").exists(), "the leftover outlived the group"


def test_a_world_past_its_seconds_is_killed_and_the_next_one_runs(tmp_path: Path) -> None:
    started = time.monotonic()
    worlds = [world("hang", "hang"), world("baseline")]
    hang, after = run_group(tmp_path / "box", SIBLINGS, {}, 3, worlds, [1.0, 30.0])
    assert hang.timed_out and hang.columns is None and 1.0 <= hang.seconds < 10
    assert after.columns is not None and after.columns["outcomes"] == [True] * 3
    assert time.monotonic() - started < 30


def test_a_world_deaf_to_sigxcpu_is_stopped_by_the_hard_cpu_limit_as_a_timeout(
    tmp_path: Path,
) -> None:
    """The box's hard CPU limit (4 s here) caps each world's: the soft limit at 3 s, the
    hard at 4. A world that ignores SIGXCPU runs on to the SIGKILL of the hard one, long
    before its 30 wall seconds; having used its CPU seconds, it timed out, and the next
    world runs."""
    worlds = [world("spin", "spin"), world("baseline")]
    spun, after = run_group(tmp_path / "box", SIBLINGS, {}, 3, worlds, [30.0, 30.0], 4)
    assert spun.timed_out and spun.columns is None and spun.error is None
    assert 3.0 <= spun.seconds < 20, spun.seconds  # stopped by CPU, not the wall clock
    assert after.columns is not None and after.columns["outcomes"] == [True] * 3


def test_a_world_that_breaks_the_contract_fails_alone_with_its_sentence(tmp_path: Path) -> None:
    worlds = [world("raise", "raise"), world("baseline")]
    failed, after = run_group(tmp_path / "box", SIBLINGS, {}, 3, worlds, [30.0, 30.0])
    assert failed.columns is None and not failed.timed_out and failed.contract
    assert re.fullmatch(
        r"Siblings\.intervene\(\) raised RuntimeError: the world fails on purpose at "
        r"group_workloads\.py:\d+ \(episode 0, world raise, step 0 after the fork\)",
        failed.error or "",
    ), failed.error
    assert after.columns is not None and after.columns["outcomes"] == [True] * 3


def test_a_world_killed_by_a_signal_is_no_timeout(tmp_path: Path) -> None:
    """A SIGKILL is the CPU limit's only if the world used its CPU seconds: this one
    used none, so it failed, and says how."""
    worlds = [world("die", "die"), world("baseline")]
    died, after = run_group(tmp_path / "box", SIBLINGS, {}, 3, worlds, [30.0, 30.0])
    assert not died.timed_out
    assert died.error == "the world's process was killed by signal 9 without a result"
    assert after.columns is not None and after.columns["outcomes"] == [True] * 3


def test_each_world_works_in_a_fresh_folder_of_its_own(tmp_path: Path) -> None:
    run_group(tmp_path / "box", SIBLINGS, {}, 2, [world("a"), world("b")], [30.0, 30.0])
    folders = sorted(p.name for p in (tmp_path / "box").iterdir() if p.is_dir())
    assert folders == ["world-0", "world-1"]


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        (b'{"worlds": [{"seconds": 1.0, "error": "x"}]}', "results of 2 worlds"),
        (b'{"worlds": [{"seconds": true, "error": "x"}, {"seconds": 1, "error": "y"}]}', "seconds"),
        (b'{"worlds": [{"seconds": 1, "error": "x", "timed_out": true}, 1]}', "neither"),
        (b'{"worlds": [{"seconds": 1, "timed_out": 1}, {"seconds": 1, "error": "y"}]}', "neither"),
        (b'{"worlds": [{"seconds": 1, "error": 3}, {"seconds": 1, "error": "y"}]}', "not text"),
        (b'{"worlds": [{"seconds": -1, "error": "x"}, {"seconds": 1, "error": "y"}]}', "seconds"),
        (
            b'{"worlds": [{"seconds": 1, "columns": {"outcomes": []}}, '
            b'{"seconds": 1, "error": "y"}]}',
            "world 0: output is not an object",
        ),
    ],
)
def test_a_groups_output_of_another_shape_is_refused(entry: bytes, why: str) -> None:
    """The box writes the group's output: what the worker reads of it is checked, entry
    by entry (its world count, each result's one kind, its seconds, its columns)."""
    from forklab.runtime.file_format import FormatError

    with pytest.raises(FormatError, match=why):
        parse_world_outputs(entry, 0, 2)


_SLICED = """
import json, sys
from forklab.runtime import world_group
from forklab.runtime.file_format import WorldPlan
from forklab.runtime.runner import run_prefix, workload_class
world_group.SLICE_EPISODES = int(sys.argv[2])
name, params, episodes = sys.argv[1], json.loads(sys.argv[3]), int(sys.argv[4])
workload = workload_class(name)(params)
checkpoints = [run_prefix(workload, 0, e) for e in range(episodes)]
worlds = [WorldPlan(**w) for w in json.loads(sys.argv[5])]
seconds = json.loads(sys.argv[6])
print(json.dumps(world_group.run_group(workload, 0, checkpoints, worlds, seconds)))
"""


def run_sliced(
    folder: Path,
    workload: str,
    params: dict[str, object],
    episodes: int,
    worlds: list[WorldPlan],
    seconds: list[float],
    slice_episodes: int,
) -> list[dict[str, Any]]:
    """``run_group`` with slices of ``slice_episodes``, in a fresh process in ``folder``."""
    folder.mkdir()
    plans = json.dumps([w.to_json() for w in worlds])
    args = [workload, str(slice_episodes), json.dumps(params), str(episodes), plans]
    results: list[dict[str, Any]] = json.loads(
        python(folder, "-c", _SLICED, *args, json.dumps(seconds))
    )
    return results


def test_a_chunk_worked_in_slices_gives_the_twins_columns(tmp_path: Path) -> None:
    """A large chunk is worked a slice at a time (what the worlds share is held for one
    slice, each world runs once per slice): the columns are the twin's, joined in order,
    and a world that runs out of seconds in one slice runs no more and fails once."""
    spec = load_spec(str(ROOT / "forklab" / "workloads" / "retry-cascade.yaml"))
    plans = spec_world_plans(spec)[:3]
    params = dict(spec.workload.params)
    results = run_sliced(tmp_path / "box", spec.workload.name, params, 40, plans, [60.0] * 3, 7)
    workload = workload_class(spec.workload.name)(params)
    twin = run_batch(workload, 0, range(40), plans, memo=False)["worlds"]
    for plan, result in zip(plans, results, strict=True):
        assert canonical_json(result["columns"]) == canonical_json(twin[plan.name]), plan.name
    worlds = [world("baseline"), world("hang", "hang")]
    base, hung = run_sliced(tmp_path / "hang", SIBLINGS, {}, 9, worlds, [30.0, 1.0], 4)
    assert base["columns"]["outcomes"] == [True] * 9 and len(base["columns"]["inherited"]) == 9
    assert hung == {"timed_out": True, "seconds": hung["seconds"]} and 1.0 <= hung["seconds"] < 10
