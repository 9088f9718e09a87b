"""How quickly rescue/harm counts get noisy at small n, with and without a majority vote.

For counter-recovery (refresh vs baseline) with a noisy agent (``noise``: the chance per
step that the agent misreads the observation), this draws ``--reps`` disjoint sets of n
episodes (spec seeds far apart) and reports, across the sets:

- relabelled: the share of episodes whose pair label (rescue / harm / unchanged)
  differs from the noise-free agent's on the same episodes: the agent noise itself;
- sd(net/n): the spread of the net effect per episode across the episode sets;
- CI∋0: how often the overall 95% interval crosses zero (an inconclusive verdict);
- guard ok: how often the learned guard is the true rule "refresh only when
  obs_repeated is true" (harm cap 0 on the training set);
- slice ok: how often the obs_repeated=true slice alone is significantly positive.

``forks`` > 1 runs that many replicates per checkpoint and world (distinct agent
streams) and takes the majority vote. Usage: ``python bench/noise.py [--reps 20]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from forklab.activities.experiment.twin import run_twin
from forklab.experiments.experiment.analysis.guard import learn_rule
from forklab.experiments.experiment.analysis.pairs import paired_effect, paired_table
from forklab.experiments.experiment.analysis.slices import dimensions, slice_effects
from forklab.experiments.experiment.spec import ExperimentSpec, parse_spec
from forklab.experiments.experiment.worlds import world_plan

SPEC = """
id: noise-bench
hypothesis: {text: noise}
seed: 0
episodes: 1
workload: {name: counter-recovery, params: {noise: 0.0}}
worlds:
  - {name: baseline, role: baseline}
  - {name: refresh, role: treatment, intervention: {name: refresh}}
"""
TRUE_RULE = [{"obs_repeated": {"eq": True}}]


def _labels(ref: list[bool], world: list[bool]) -> list[int]:
    return [int(w) - int(r) for r, w in zip(ref, world, strict=True)]  # +1 rescue, −1 harm


def _run(seed: int, n: int, noise: float, forks: int) -> tuple[list[bool], list[bool], Any]:
    base = parse_spec(SPEC, "bench")
    spec = ExperimentSpec.model_validate(
        {
            **base.canonical(),
            "seed": seed,
            "episodes": n,
            "workload": {"name": "counter-recovery", "params": {"noise": noise}},
        }
    )
    batch = run_twin(spec, worlds=[world_plan(w, forks) for w in spec.worlds], processes=1).batch
    cols = batch["worlds"]
    return cols["baseline"]["outcomes"], cols["refresh"]["outcomes"], batch["features"]


def measure(noise: float, forks: int, n: int, reps: int) -> dict[str, float]:
    nets, relabelled, crosses, guard_ok, slice_ok = [], 0, 0, 0, 0
    for rep in range(reps):
        seed = 1_000_003 * rep
        ref, world, features = _run(seed, n, noise, forks)
        clean = _labels(*_run(seed, n, 0.0, 1)[:2])
        relabelled += sum(a != b for a, b in zip(_labels(ref, world), clean, strict=True))
        effect = paired_effect(paired_table(ref, world))
        nets.append(effect.net / n)
        crosses += effect.ci_low <= 0 <= effect.ci_high
        dims = dimensions(features, 4)
        slices = slice_effects(ref, world, features, [dims["obs_repeated"]])
        guard_ok += learn_rule([slices], 0)[1] == TRUE_RULE
        repeated = [s for s in slices if s.value is True]
        slice_ok += bool(repeated) and repeated[0].ci_low > 0
    return {
        "relabelled": relabelled / (n * reps),
        "mean": statistics.fmean(nets),
        "sd": statistics.stdev(nets) if reps > 1 else 0.0,
        "crosses": crosses / reps,
        "guard": guard_ok / reps,
        "slice": slice_ok / reps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    start = time.perf_counter()
    print(f"counter-recovery, refresh vs baseline, {args.reps} disjoint episode sets per row")
    print("noise  forks     n  relabelled  mean net/n  sd(net/n)  CI∋0  guard ok  slice ok")
    for noise in (0.0, 0.1, 0.2):
        for forks in (1, 5) if noise else (1,):
            for n in (20, 50, 300):
                m = measure(noise, forks, n, args.reps)
                print(
                    f"{noise:5.2f}  {forks:5d}  {n:4d}  {m['relabelled']:10.1%}  "
                    f"{m['mean']:+10.3f}  {m['sd']:9.3f}  "
                    f"{m['crosses']:4.0%}  {m['guard']:8.0%}  {m['slice']:8.0%}"
                )
    print(f"({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
