"""Fork pairs per second: the ForkLab engine against a naive ``copy.deepcopy`` loop.

For each workload (counter-recovery with baseline + refresh, the seed's parameters;
retry-cascade with its eight worlds) the same episodes run, in one process run:

- the naive loop one writes first: a fresh ``Shocks`` per world, the prefix once, a
  ``copy.deepcopy`` of the state per world, every world finished;
- the floor: that loop with the cheapest exact copy instead of ``deepcopy`` — the
  workload's own methods and little else, i.e. about the best any engine that runs
  those methods for every episode and world can do (``naive / floor`` bounds the
  engine's memo-off ratio on one process);
- the engine with its memo OFF (every episode run in full) and ON (a prefix or
  continuation that drew no randomness is reused for an identical state), on one
  process and on every core (at most two). For a workload with batch methods
  (counter-recovery) each appears twice: ``batched`` (a chunk of episodes at once, in
  numpy: ``forklab/experiments/experiment/vector.py``) next to ``scalar`` (the runner's methods,
  episode by episode, as on the durable path), so the figure that rests on the workload having
  batch methods is shown beside the one without them.

Every path must produce the same per-world outcomes as the naive loop, episode by
episode. ``--against DIR`` also times the engine of another checkout (e.g. the
previous ``main``) on the same episodes, in a subprocess, for a before/after ratio.

The paths run round robin, ``--repeat`` rounds, and each path's best round counts, so
a burst of load on a shared machine hits one round of one path rather than one path
throughout. Wall seconds are printed for every path; CPU seconds (``process_time``) for
the one-process paths too: on a loaded machine the CPU ratio is the steadier figure,
the wall ratio the one that shows what two processes buy.

A fork pair is one (baseline, world) pair of one episode: ``episodes × (worlds − 1)``.

    python bench/engine.py [--episodes 100000] [--cascade-episodes 2000] [--against DIR]
                           [--repeat 3]
"""

from __future__ import annotations

import argparse
import copy
import json
import marshal
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forklab.activities.experiment.twin import run_twin
from forklab.experiments.experiment.spec import ExperimentSpec
from forklab.experiments.experiment.vector import batchable
from forklab.experiments.experiment.worlds import spec_world_plans
from forklab.runtime.crn import Shocks
from forklab.runtime.file_format import WorldPlan
from forklab.runtime.runner import workload_class
from forklab.runtime.workload import State, Workload
from forklab.workloads.retry_cascade import RetryCascade

Outcomes = dict[str, list[bool]]

COUNTER_WORLDS: list[dict[str, Any]] = [
    {"name": "baseline", "role": "baseline"},
    {"name": "refresh", "role": "treatment", "intervention": {"name": "refresh"}},
]
CASCADE_WORLDS: list[dict[str, Any]] = [{"name": "baseline", "role": "baseline"}] + [
    {"name": name, "role": "treatment", "intervention": {"name": name}}
    for name in RetryCascade.interventions
]


def spec_for(workload: str, worlds: list[dict[str, Any]], episodes: int) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        {
            "id": "bench",
            "hypothesis": {"text": "bench"},
            "seed": 0,
            "episodes": episodes,
            "workload": {"name": workload},
            "worlds": worlds,
        }
    )


def naive(
    workload: Workload,
    seed: int,
    episodes: int,
    worlds: Sequence[WorldPlan],
    copy_state: Callable[[State], State] = copy.deepcopy,
) -> Outcomes:
    """The loop one writes first: run the prefix, deepcopy the state per world, finish."""
    out: Outcomes = {w.name: [] for w in worlds}
    for episode in range(episodes):
        shocks = Shocks(seed, episode)
        state = workload.initial_state(seed + episode, shocks)
        while workload.cursor(state) < workload.boundary(state) and not workload.done(state):
            workload.step(state, shocks)
        for w in worlds:
            world = copy_state(state)
            world_shocks = Shocks(seed, episode)
            workload.schedule_shocks(world, world_shocks)
            if w.intervention is not None:
                workload.intervene(world, w.intervention, w.params, world_shocks)
            while not workload.done(world):
                workload.step(world, world_shocks)
            out[w.name].append(workload.outcome(world))
    return out


def cheapest_copy(state: State) -> State:
    """The cheapest exact copy of a JSON state: ``dict.copy`` when every value is a scalar,
    else ``marshal`` (what the floor row uses instead of ``deepcopy``)."""
    if all(type(v) not in (dict, list) for v in state.values()):
        return state.copy()
    copied: State = marshal.loads(marshal.dumps(state))
    return copied


def engine(spec: ExperimentSpec, processes: int, memo: bool, batched: bool) -> Outcomes:
    batch = run_twin(spec, processes=processes, memo=memo, batched=batched).batch
    return {name: cols["outcomes"].tolist() for name, cols in batch["worlds"].items()}


_AGAINST = """
import json, sys, time
from forklab.runtime.runner import run_batch, workload_class
workload, episodes, worlds = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
try:  # world plans became a dataclass with the runner's file format
    from forklab.runtime.file_format import WorldPlan
    worlds = [WorldPlan.from_json(w) for w in worlds]
except ImportError:
    pass
wl = workload_class(workload)({})
wall = cpu = float("inf")
for _ in range(int(sys.argv[4])):
    start, start_cpu = time.perf_counter(), time.process_time()
    batch = run_batch(wl, 0, list(range(episodes)), worlds)
    wall = min(wall, time.perf_counter() - start)
    cpu = min(cpu, time.process_time() - start_cpu)
print(json.dumps([wall, cpu, {n: list(c["outcomes"]) for n, c in batch["worlds"].items()}]))
"""


def against(
    tree: Path, workload: str, episodes: int, worlds: Sequence[WorldPlan], repeat: int
) -> tuple[float, float, Outcomes]:
    """Best wall and CPU seconds of another checkout's engine on the same run (one
    process, ``repeat`` runs), and its outcomes."""
    plans = [w.to_json() for w in worlds]
    done = subprocess.run(
        [sys.executable, "-c", _AGAINST, workload, str(episodes), json.dumps(plans), str(repeat)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    )
    wall, cpu, outcomes = json.loads(done.stdout)
    return float(wall), float(cpu), outcomes


@dataclass
class Row:
    name: str
    run: Callable[[], Outcomes]
    one_process: bool  # its CPU seconds are the whole of its work
    wall: float = float("inf")
    cpu: float = float("inf")
    same: bool = True


def bench(
    label: str,
    workload: str,
    worlds: list[dict[str, Any]],
    episodes: int,
    tree: Path | None,
    repeat: int,
) -> bool:
    spec = spec_for(workload, worlds, episodes)
    plans = spec_world_plans(spec)
    wl = workload_class(workload)({})
    cores = min(2, os.cpu_count() or 1)
    pairs = episodes * (len(plans) - 1)
    reference = naive(wl, 0, episodes, plans)
    rows = [
        Row("naive deepcopy loop", lambda: naive(wl, 0, episodes, plans), True),
        Row(
            "floor: naive minus its copies",
            lambda: naive(wl, 0, episodes, plans, cheapest_copy),
            True,
        ),
    ]
    paths = [(True, ", batched"), (False, ", scalar")] if batchable(wl) else [(False, "")]
    for memo in (False, True):
        for batched, kind in paths:
            for processes in (1, cores):
                rows.append(
                    Row(
                        f"engine memo {'on ' if memo else 'off'}{kind}, {processes} proc",
                        lambda p=processes, m=memo, b=batched: engine(spec, p, m, b),
                        processes == 1,
                    )
                )
    # Round robin, best of ``repeat``: a burst of load on the shared machine hits one
    # round of one path, not one path throughout.
    for _ in range(repeat):
        for row in rows:
            start, start_cpu = time.perf_counter(), time.process_time()
            out = row.run()
            row.wall = min(row.wall, time.perf_counter() - start)
            row.cpu = min(row.cpu, time.process_time() - start_cpu)
            row.same = row.same and out == reference
    if tree is not None:
        wall, cpu, out = against(tree, workload, episodes, plans, repeat)
        rows.append(Row(f"{tree.name} engine, 1 proc", dict, True, wall, cpu, out == reference))
    naive_row = rows[0]
    print(f"\n{label}: {episodes:,} episodes x {len(plans)} worlds = {pairs:,} fork pairs")
    print(
        f"{'path':<40}{'wall s':>8}{'pairs/s':>10}{'vs naive':>10}"
        f"{'CPU s':>8}{'vs naive':>10}  same outcomes"
    )
    for row in rows:
        cpu = f"{row.cpu:>8.2f}{naive_row.cpu / row.cpu:>9.2f}x" if row.one_process else " " * 18
        print(
            f"{row.name:<40}{row.wall:>8.2f}{pairs / row.wall:>10,.0f}"
            f"{naive_row.wall / row.wall:>9.2f}x{cpu}  {row.same}"
        )
    if tree is not None:
        old = rows[-1]
        for row in rows[2:-1]:
            if row.one_process:
                print(
                    f"{row.name} vs {tree.name}'s engine (it always memoises): "
                    f"{old.wall / row.wall:.2f}x wall, {old.cpu / row.cpu:.2f}x CPU"
                )
    return all(row.same for row in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--episodes", type=int, default=100_000, help="counter-recovery")
    parser.add_argument("--cascade-episodes", type=int, default=2_000, help="retry-cascade")
    parser.add_argument("--against", type=Path, default=None, help="another checkout to time")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each path's best counts")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")
    ok = bench(
        "counter-recovery",
        "counter-recovery",
        COUNTER_WORLDS,
        args.episodes,
        args.against,
        args.repeat,
    )
    ok &= bench(
        "retry-cascade",
        "retry-cascade",
        CASCADE_WORLDS,
        args.cascade_episodes,
        args.against,
        args.repeat,
    )
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")
    print("identical outcomes on every path:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
