"""Fork pairs per second: the ForkLab engine against a naive ``copy.deepcopy`` loop.

For each workload (counter-recovery with baseline + refresh, the seed's parameters;
retry-cascade with its eight worlds) the same episodes run, in one process run:

- the naive loop one writes first: a fresh ``Shocks`` per world, the prefix once, a
  ``copy.deepcopy`` of the state per world, every world finished;
- the engine with its memo OFF (every episode run in full) and ON (a prefix or
  continuation that drew no randomness is reused for an identical state), on one
  process and on every core (at most two).

Every path must produce the same per-world outcomes as the naive loop, episode by
episode. ``--against DIR`` also times the engine of another checkout (e.g. the
previous ``main``) on the same episodes, in a subprocess, for a before/after ratio.

A fork pair is one (baseline, world) pair of one episode: ``episodes × (worlds − 1)``.

    python bench/engine.py [--episodes 100000] [--cascade-episodes 2000] [--against DIR]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.engine import run_twin, spec_world_plans
from experiments.runtime.canon import digest
from experiments.runtime.crn import Shocks
from experiments.runtime.file_format import WorldPlan
from experiments.runtime.runner import workload_class
from experiments.runtime.workload import Workload
from experiments.spec import ExperimentSpec

Outcomes = dict[str, list[bool]]

COUNTER_WORLDS: list[dict[str, Any]] = [
    {"name": "baseline", "role": "baseline"},
    {"name": "refresh", "role": "treatment", "intervention": {"name": "refresh"}},
]
CASCADE_WORLDS: list[dict[str, Any]] = [{"name": "baseline", "role": "baseline"}] + [
    {"name": name, "role": "treatment", "intervention": {"name": name}}
    for name in (
        "jitter",
        "broadcast",
        "queue-memory",
        "latency",
        "broadcast-jitter",
        "restart",
        "placebo",
    )
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


def naive(workload: Workload, seed: int, episodes: int, worlds: Sequence[WorldPlan]) -> Outcomes:
    """The loop one writes first: run the prefix, deepcopy the state per world, finish."""
    out: Outcomes = {w.name: [] for w in worlds}
    for episode in range(episodes):
        shocks = Shocks(seed, episode)
        state = workload.initial_state(seed + episode, shocks)
        while workload.cursor(state) < workload.boundary(state) and not workload.done(state):
            workload.step(state, shocks)
        for w in worlds:
            world = copy.deepcopy(state)
            world_shocks = Shocks(seed, episode)
            workload.schedule_shocks(world, world_shocks)
            if w.intervention is not None:
                workload.intervene(world, w.intervention, w.params, world_shocks)
            while not workload.done(world):
                workload.step(world, world_shocks)
            out[w.name].append(workload.outcome(world))
    return out


def engine(spec: ExperimentSpec, processes: int, memo: bool) -> Outcomes:
    batch = run_twin(spec, processes=processes, memo=memo).batch
    return {name: cols["outcomes"].tolist() for name, cols in batch["worlds"].items()}


def timed(fn: Callable[[], Outcomes]) -> tuple[float, Outcomes]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


_AGAINST = """
import json, sys, time
from experiments.runtime.runner import run_batch, workload_class
workload, episodes, worlds = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
try:  # world plans became a dataclass with the runner's file format
    from experiments.runtime.file_format import WorldPlan
    worlds = [WorldPlan.from_json(w) for w in worlds]
except ImportError:
    pass
wl = workload_class(workload)({})
start = time.perf_counter()
batch = run_batch(wl, 0, list(range(episodes)), worlds)
seconds = time.perf_counter() - start
print(json.dumps([seconds, {n: c["outcomes"] for n, c in batch["worlds"].items()}]))
"""


def against(tree: Path, workload: str, episodes: int, worlds: Sequence[WorldPlan]) -> float:
    """Seconds the engine of another checkout takes for the same run (one process)."""
    plans = [w.to_json() for w in worlds]
    done = subprocess.run(
        [sys.executable, "-c", _AGAINST, workload, str(episodes), json.dumps(plans)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    )
    seconds, outcomes = json.loads(done.stdout)
    if digest(outcomes) != digest(naive_cache[workload]):
        raise SystemExit(f"{tree}: its outcomes differ from this checkout's naive loop")
    return float(seconds)


naive_cache: dict[str, Outcomes] = {}


def bench(
    label: str, workload: str, worlds: list[dict[str, Any]], episodes: int, tree: Path | None
) -> bool:
    spec = spec_for(workload, worlds, episodes)
    plans = spec_world_plans(spec)
    wl = workload_class(workload)({})
    cores = min(2, os.cpu_count() or 1)
    pairs = episodes * (len(plans) - 1)
    t_naive, reference = timed(lambda: naive(wl, 0, episodes, plans))
    naive_cache[workload] = reference
    rows: list[tuple[str, float, bool]] = [("naive deepcopy loop", t_naive, True)]
    for memo in (False, True):
        for processes in (1, cores):
            t, out = timed(lambda p=processes, m=memo: engine(spec, p, m))
            name = f"engine memo {'on ' if memo else 'off'}, {processes} proc"
            rows.append((name, t, out == reference))
    if tree is not None:
        rows.append((f"{tree.name} engine, 1 proc", against(tree, workload, episodes, plans), True))
    print(f"\n{label}: {episodes:,} episodes x {len(plans)} worlds = {pairs:,} fork pairs")
    print(f"{'path':<30}{'seconds':>9}{'pairs/s':>11}{'vs naive':>10}  same outcomes")
    for name, t, same in rows:
        print(f"{name:<30}{t:>9.2f}{pairs / t:>11,.0f}{t_naive / t:>9.2f}x  {same}")
    if tree is not None:
        # The other checkout's engine always memoises: compare like with like.
        t_old, t_new = rows[-1][1], rows[3][1]
        print(f"engine memo on, 1 proc vs {tree.name}'s engine (1 proc): {t_old / t_new:.2f}x")
    return all(same for _, _, same in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--episodes", type=int, default=100_000, help="counter-recovery")
    parser.add_argument("--cascade-episodes", type=int, default=2_000, help="retry-cascade")
    parser.add_argument("--against", type=Path, default=None, help="another checkout to time")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")
    ok = bench("counter-recovery", "counter-recovery", COUNTER_WORLDS, args.episodes, args.against)
    ok &= bench(
        "retry-cascade", "retry-cascade", CASCADE_WORLDS, args.cascade_episodes, args.against
    )
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")
    print("identical outcomes on every path:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
