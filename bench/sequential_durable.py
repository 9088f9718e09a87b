"""A sequential design on the durable path against the fixed design, the same spec both ways.

Each repeat runs the spec twice on an embedded dev server, alternating which goes first:
once as the fixed design (every world over every episode) and once with
``analysis.sequential`` (waves, a look after each, stopped worlds start no more work) —
start to report, approved as soon as the plan is ready, worlds in local sandboxes two at a
time (``bench/orchestration.py``'s ``durable``). It prints, per repeat and as medians, the
world-episodes run, the world-seconds charged to the budget and the wall time, each as the
sequential design's share of the fixed design's in the same repeat, with the machine's load;
and checks that the sequential run's verdicts are those ``forklab plan`` rehearses for the
design on the same episodes.

    python bench/sequential_durable.py [--spec forklab/workloads/recovery-counter.yaml]
        [--episodes 3000] [--looks 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.orchestration import bench_spec, durable
from forklab.cli.experiment.rehearsal import rehearse
from forklab.experiments.experiment.spec import ExperimentSpec
from forklab.workflows.experiment.messages import DEFAULT_BATCH_EPISODES, ExperimentResult

ROOT = Path(__file__).resolve().parent.parent


def with_design(spec: ExperimentSpec, looks: int | None) -> ExperimentSpec:
    data = spec.model_dump(mode="json")
    data["analysis"]["sequential"] = None if looks is None else {"looks": looks}
    return ExperimentSpec.model_validate(data)


def run(spec: ExperimentSpec, batch: int) -> tuple[ExperimentResult, float]:
    with tempfile.TemporaryDirectory(prefix="forklab-bench-") as tmp:
        result, marks = asyncio.run(durable(spec, Path(tmp), batch, 100))
    assert result.analysis is not None, result.error
    return result, marks["total"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--spec", type=Path, default=ROOT / "forklab" / "workloads" / "recovery-counter.yaml"
    )
    parser.add_argument("--episodes", type=int, default=3000)
    parser.add_argument("--looks", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-episodes", type=int, default=DEFAULT_BATCH_EPISODES)
    args = parser.parse_args()
    base = bench_spec(args.spec, args.episodes)
    fixed, sequential = with_design(base, None), with_design(base, args.looks)
    print(
        f"{base.workload.name}: {args.episodes} episodes x {len(base.worlds)} worlds, "
        f"{args.looks} looks, batches of up to {args.batch_episodes}, 2 sandboxes at once"
    )
    planned = rehearse(sequential, processes=2)
    shares: dict[str, list[float]] = {"world-episodes": [], "world-seconds": [], "wall": []}
    same = True
    for repeat in range(args.repeats):
        order = [("fixed", fixed), ("sequential", sequential)]
        if repeat % 2:
            order.reverse()
        got: dict[str, tuple[ExperimentResult, float]] = {}
        for name, spec in order:
            got[name] = run(spec, args.batch_episodes)
        (f, f_wall), (s, s_wall) = got["fixed"], got["sequential"]
        f_eps = sum(w.episodes for w in f.worlds)
        s_eps = sum(w.episodes for w in s.worlds)
        f_sec, s_sec = f.budget.spent_world_seconds, s.budget.spent_world_seconds
        shares["world-episodes"].append(s_eps / f_eps)
        shares["world-seconds"].append(s_sec / f_sec)
        shares["wall"].append(s_wall / f_wall)
        assert s.analysis is not None
        verdicts = s.analysis.verdicts == [
            f"{v.world}: {v.verdict.value} ({v.reason})" for v in planned.verdicts
        ]
        same &= verdicts
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(
            f"repeat {repeat + 1} ({order[0][0]} first; load {load}): world-episodes "
            f"{s_eps}/{f_eps} = {s_eps / f_eps:.1%}, world-seconds {s_sec:.1f}/{f_sec:.1f} = "
            f"{s_sec / f_sec:.1%}, wall {s_wall:.1f}/{f_wall:.1f} s = {s_wall / f_wall:.1%}; "
            f"unspent {s.budget.unspent_world_episodes} world-episodes "
            f"(~{s.budget.unspent_world_seconds:.1f} world-seconds); "
            f"verdicts as planned: {'yes' if verdicts else 'NO'}"
        )
    print(
        "median sequential / fixed: "
        + ", ".join(f"{k} {statistics.median(v):.1%}" for k, v in shares.items())
        + f" (range of wall: {min(shares['wall']):.1%}..{max(shares['wall']):.1%})"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
