"""Fork pairs per second: the ForkLab engine against a naive ``copy.deepcopy`` loop.

Both run the same world (counter-recovery, the seed's parameters, baseline + refresh)
over the same episodes in the same process run, and must produce identical counts.
Prints the ratios single-process and with every core.

    python bench/engine.py [--episodes 100000]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.analysis.pairs import paired_table
from experiments.engine import run_twin
from experiments.runtime.crn import Shocks
from experiments.spec import ExperimentSpec
from experiments.workloads.counter_recovery import CounterRecovery


def naive(episodes: int) -> tuple[int, int, int]:
    """The loop one writes first: run the prefix, deepcopy the state per world, finish."""
    wl = CounterRecovery()
    rescue = harm = unchanged = 0
    for episode in range(episodes):
        shocks = Shocks(0, episode)
        state = wl.initial_state(episode, shocks)
        while wl.cursor(state) < wl.boundary(state) and not wl.done(state):
            wl.step(state, shocks)
        results = []
        for intervention in (None, "refresh"):
            world = copy.deepcopy(state)
            if intervention:
                wl.intervene(world, intervention, {}, shocks)
            while not wl.done(world):
                wl.step(world, shocks)
            results.append(wl.outcome(world))
        off, on = results
        if on and not off:
            rescue += 1
        elif off and not on:
            harm += 1
        else:
            unchanged += 1
    return rescue, harm, unchanged


def engine(episodes: int, processes: int) -> tuple[int, int, int]:
    spec = ExperimentSpec.model_validate(
        {
            "id": "bench",
            "hypothesis": {"text": "bench"},
            "seed": 0,
            "episodes": episodes,
            "workload": {"name": "counter-recovery"},
            "worlds": [
                {"name": "baseline", "role": "baseline"},
                {"name": "refresh", "role": "treatment", "intervention": {"name": "refresh"}},
            ],
        }
    )
    batch = run_twin(spec, processes=processes).batch
    c = paired_table(
        batch["worlds"]["baseline"]["outcomes"], batch["worlds"]["refresh"]["outcomes"]
    )
    return c.rescue, c.harm, c.unchanged


def timed(fn: object, *args: int) -> tuple[float, tuple[int, int, int]]:
    start = time.perf_counter()
    result = fn(*args)  # type: ignore[operator]
    return time.perf_counter() - start, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=100_000)
    args = parser.parse_args()
    n = args.episodes
    cores = min(2, os.cpu_count() or 1)
    t_naive, c_naive = timed(naive, n)
    t_one, c_one = timed(engine, n, 1)
    t_all, c_all = timed(engine, n, cores)
    print(f"counter-recovery, {n:,} episodes, 2 worlds (fork pairs = episodes)")
    print(
        f"{'path':<28}{'seconds':>9}{'pairs/s':>12}{'ratio':>8}  counts (rescue, harm, unchanged)"
    )
    for label, t, c in (
        ("naive deepcopy loop", t_naive, c_naive),
        ("forklab engine, 1 process", t_one, c_one),
        (f"forklab engine, {cores} processes", t_all, c_all),
    ):
        print(f"{label:<28}{t:>9.2f}{n / t:>12,.0f}{t_naive / t:>7.2f}x  {c}")
    identical = c_naive == c_one == c_all
    print("identical counts:", identical)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
