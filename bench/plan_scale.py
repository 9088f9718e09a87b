"""``forklab plan`` end to end against the seed's reference loop, and how it scales.

One run prints:

1. the seed's reference loop (its toy world written again as plain functions: run to
   step 3, ``deepcopy`` the state twice, refresh one copy, finish both, count the labels
   and the slices) over N counter-recovery episodes, in a fresh process;
2. ``forklab plan`` of the same N episodes (baseline + refresh), end to end — interpreter
   start, spec, twin, analysis, guard validation, report — in a fresh process, with the
   memo on (the default) and off (every episode simulated in full), side by side. The
   three run round robin, ``--repeat`` rounds, best round each; wall seconds and CPU
   seconds (the process tree's) are both printed: the wall ratio is what a user waits,
   the CPU ratio the steadier figure on a loaded machine (two processes show in wall);
   counter-recovery has batch methods, so the twin runs it batched
   (``forklab/experiments/experiment/vector.py``); ``--no-memo, scalar`` is the same plan with them
   switched off (every chunk on the runner's scalar methods, as for a workload without them), the
   figure that does not rest on that property of the workload;
3. with ``--scale M[,M2…]``: the same plan at M episodes (memo on and off), its time as a
   multiple of the N run and its peak RSS;
4. with ``--cascade K[,K2…]``: ``forklab plan`` of K retry-cascade episodes × 8 worlds,
   its time and peak RSS;
5. with ``--cascade-replay R``: the storage and analysis side of R retry-cascade episodes
   × 8 worlds without simulating all of them (a retry-cascade episode costs ~50 ms of
   workload code on this machine, so 1,000,000 of them take hours): ``SAMPLE`` episodes
   run on the twin, and R / ``SAMPLE`` copies of their columns, each with its own
   checkpoint digests and shock fingerprints (as many distinct strings as R real episodes
   have), are merged and analysed by ``build_report`` — the guard's held-out episodes
   (capped) really run. The simulation itself holds one chunk of Python objects per
   process (``forklab.experiments.experiment.chunks.CHUNK_EPISODES``), whatever R.

Two peaks are printed. ``largest`` is the largest resident set of any one measured process
(``ru_maxrss`` of a wrapper process: the plan or a worker of its pool). ``tree`` is the
largest sum of the resident sets of the plan and all its descendants, sampled from /proc
every 50 ms (what the machine must hold at once; a sample can miss a short spike, the
``largest`` figure cannot). With several sizes, the growth per added episode between two
sizes shows whether memory is linear (a constant slope) or worse.

    python bench/plan_scale.py [--episodes 300000] [--scale 10000000] [--cascade 1000000]
    python bench/plan_scale.py --scale 1000000,3000000 --cascade 20000,40000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forklab.workloads.retry_cascade import RetryCascade

ROOT = Path(__file__).resolve().parent.parent
#: retry-cascade's treatment worlds: every intervention it has, in its order.
CASCADE = list(RetryCascade.interventions)

REFERENCE = r"""
import copy, random, sys
from collections import Counter, defaultdict

GOAL = 6


def start(seed):
    rng = random.Random(seed)
    budget = 7 + rng.choice([0, 0, 1, 2])
    stuck = rng.choice([None, None, 1, 2])
    return {"v": 0, "obs": 0, "steps": 0, "done": False, "declared": False,
            "frozen": False, "same_obs": False, "budget": budget, "freeze_at": stuck}


def advance(s):
    if s["done"] or s["steps"] >= s["budget"]:
        s["done"] = True
        return
    s["steps"] += 1
    if s["obs"] >= GOAL:
        s["done"] = s["declared"] = True
        return
    s["v"] += 1
    if s["freeze_at"] == s["v"]:
        s["frozen"] = True
    before = s["obs"]
    if not s["frozen"]:
        s["obs"] = s["v"]
    s["same_obs"] = s["obs"] == before


def reread(s):
    s["steps"] += 1
    s["frozen"] = False
    s["obs"] = s["v"]


def run_out(s):
    while not s["done"]:
        advance(s)
    return s["declared"] and s["v"] == GOAL


totals, slices = Counter(), defaultdict(Counter)
for seed in range(int(sys.argv[1])):
    s = start(seed)
    while s["steps"] < 3 and not s["done"]:
        advance(s)
    feature = s["same_obs"]
    off_world, on_world = copy.deepcopy(s), copy.deepcopy(s)
    reread(on_world)
    off, on = run_out(off_world), run_out(on_world)
    label = "rescue" if on and not off else "harm" if off and not on else "unchanged"
    totals[label] += 1
    slices[feature][label] += 1
print(dict(totals), {str(k): dict(v) for k, v in slices.items()})
"""

WRAP = r"""
import json, os, resource, subprocess, sys, tempfile, time


def tree_kib(root):
    # Resident KiB of root and every descendant, from /proc (the pool's workers included).
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/status") as fh:
                total += next(int(l.split()[1]) for l in fh if l.startswith("VmRSS:"))
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
        except (OSError, StopIteration, ValueError):
            pass  # it ended between the listing and the read
    return total


out = tempfile.TemporaryFile(mode="w+")
start = time.perf_counter()
child = subprocess.Popen(json.loads(sys.argv[1]), stdout=out, text=True)
tree = 0
while child.poll() is None:
    tree = max(tree, tree_kib(child.pid))
    time.sleep(0.05)
seconds = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
peak = usage.ru_maxrss  # KiB on Linux
cpu = usage.ru_utime + usage.ru_stime  # the plan and its pool's workers (waited for)
out.seek(0)
print(json.dumps({"seconds": seconds, "cpu": cpu, "peak_kib": peak, "tree_kib": tree,
                  "rc": child.returncode, "stdout": out.read()}))
"""


def measure(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", WRAP, json.dumps(argv)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    result: dict[str, Any] = json.loads(done.stdout)
    if result["rc"] != 0:
        raise SystemExit(f"{' '.join(argv)} failed with exit {result['rc']}")
    return result


def spec(path: Path, workload: str, episodes: int, worlds: list[str]) -> Path:
    body = {
        "id": f"scale-{workload}",
        "hypothesis": {"text": "scale"},
        "seed": 0,
        "episodes": episodes,
        "workload": {"name": workload},
        "worlds": [{"name": "baseline", "role": "baseline"}]
        + [{"name": w, "role": "treatment", "intervention": {"name": w}} for w in worlds],
    }
    path.write_text(json.dumps(body))
    return path


#: Episodes really simulated by ``--cascade-replay``.
SAMPLE = 10_000

REPLAY = r"""
import json, sys
from forklab.experiments.experiment.analysis.build import build_report
from forklab.experiments.experiment.columnar import StrColumn, merge_columns
from forklab.activities.experiment.twin import run_twin
from forklab.experiments.experiment.outcomes import from_batch
from forklab.cli.experiment.rehearsal import workload_code_digest
from forklab.experiments.experiment.spec import ExperimentSpec

spec = ExperimentSpec.model_validate_json(open(sys.argv[1]).read())
sample = int(sys.argv[2])
real = run_twin(spec, episodes=range(sample)).batch


def copy(k):
    # The k-th copy: the sample's outcomes and features, its own strings.
    shas = real["checkpoints"]
    checkpoints = StrColumn(shas.codes, [f"{v}#{k}" for v in shas.values])
    tables = {}
    worlds = {}
    for name, cols in real["worlds"].items():
        values = cols["shocks"].values
        table = tables.setdefault(id(values), [f"{v}#{k}" for v in values])
        worlds[name] = {"outcomes": cols["outcomes"].copy(),
                        "intervened": cols["intervened"].copy(),
                        "shocks": StrColumn(cols["shocks"].codes, table),
                        "inherited": checkpoints}
    return {"episodes": real["episodes"] + k * sample, "requested": real["requested"].copy(),
            "resolved": real["resolved"].copy(), "checkpoints": checkpoints,
            "features": real["features"], "worlds": worlds}


batch = merge_columns([copy(k) for k in range(spec.episodes // sample)])
out = from_batch(batch, workload_code_digest(spec), "replay", 0.0)
report = build_report(spec, out, workload_code_digest(spec))
print(report.model_dump_json())
"""


#: ``forklab plan`` with the twin's batched path switched off (in this process and in the
#: pool's workers, which it forks): every chunk runs on the runner's scalar methods.
SCALAR_PLAN = (
    "import sys; import forklab.experiments.experiment.chunks as engine; "
    "engine.batchable = lambda workload: False; "
    "from forklab.cli.main import main; main(sys.argv[1:])"
)


def plan(path: Path, memo: bool = True, scalar: bool = False) -> dict[str, Any]:
    command = ["-c", SCALAR_PLAN] if scalar else ["-m", "forklab.cli"]
    argv = [sys.executable, *command, "plan", str(path), "--json"]
    if not memo:
        argv.append("--no-memo")
    result = measure(argv)
    report = json.loads(result.pop("stdout"))
    comp = next(c for c in report["comparisons"] if c["vs"] == "baseline")
    result["counts"] = (comp["rescue"], comp["harm"], comp["unchanged"])
    return result


def row(label: str, r: dict[str, Any], base: dict[str, Any]) -> None:
    print(
        f"{label:<44}{r['seconds']:>8.2f}{base['seconds'] / r['seconds']:>9.2f}x"
        f"{r['cpu']:>8.2f}{base['cpu'] / r['cpu']:>9.2f}x"
        f"{r['peak_kib'] / 1024:>9.0f} MiB  {r.get('counts', '')}"
    )


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest of a path's rounds (its CPU seconds the least of any round)."""
    fastest = dict(min(runs, key=lambda r: r["seconds"]))
    fastest["cpu"] = min(r["cpu"] for r in runs)
    return fastest


def gib(kib: int) -> str:
    return f"{kib / 1024 / 1024:.2f} GiB"


def scaled(
    label: str, runs: list[tuple[int, dict[str, Any]]], small: dict[str, Any] | None
) -> None:
    """Each size's wall and CPU time (as multiples of ``small``'s), both peaks, and the slope
    between consecutive sizes in KiB per added episode. On a shared machine the CPU ratio
    is the steadier one: the wall ratio moves with the other processes' load."""
    for k, (size, r) in enumerate(runs):
        ratio = (
            f" = {r['seconds'] / small['seconds']:.1f}x the {small['size']:,} run "
            f"(CPU {r['cpu']:.1f} s = {r['cpu'] / small['cpu']:.1f}x)"
            if small
            else f" (CPU {r['cpu']:.1f} s)"
        )
        slope = ""
        if k:
            prev_size, prev = runs[k - 1]
            per = (r["tree_kib"] - prev["tree_kib"]) / (size - prev_size)
            slope = f", +{per:.3f} KiB/episode from {prev_size:,}"
        print(
            f"  {label} {size:>12,}: {r['seconds']:>8.1f} s{ratio}; peak RSS largest "
            f"{gib(r['peak_kib'])}, tree {gib(r['tree_kib'])}{slope}"
        )


def sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()] if text else []


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--episodes", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the N-episode runs")
    parser.add_argument("--scale", default="", help="also plan these many episodes (a,b,…)")
    parser.add_argument("--cascade", default="", help="retry-cascade episodes (a,b,…)")
    parser.add_argument(
        "--cascade-replay", type=int, default=0, help="retry-cascade storage+analysis size"
    )
    parser.add_argument(
        "--memo-off-up-to",
        type=int,
        default=None,
        help="plan --scale sizes without the memo only up to this size (default: all)",
    )
    args = parser.parse_args()
    n = args.episodes
    print(f"load average at start: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")
    with tempfile.TemporaryDirectory() as tmp:
        counter = spec(Path(tmp) / "counter.json", "counter-recovery", n, ["refresh"])
        # Round robin (reference, memo on, memo off), best of --repeat rounds each: a burst
        # of load on the shared machine hits one round of one path, not a whole path.
        rounds: dict[str, list[dict[str, Any]]] = {"ref": [], "on": [], "off": [], "scalar": []}
        for _ in range(args.repeat):
            ref = measure([sys.executable, "-c", REFERENCE, str(n)])
            totals = json.loads(ref.pop("stdout").split(" {")[0].replace("'", '"'))
            ref["counts"] = (totals.get("rescue", 0), totals.get("harm", 0), totals["unchanged"])
            rounds["ref"].append(ref)
            rounds["on"].append(plan(counter) | {"size": n})
            rounds["off"].append(plan(counter, memo=False) | {"size": n})
            rounds["scalar"].append(plan(counter, memo=False, scalar=True) | {"size": n})
        ref, on, off = best(rounds["ref"]), best(rounds["on"]), best(rounds["off"])
        scalar = best(rounds["scalar"])
        print(f"\ncounter-recovery, {n:,} episodes, baseline + refresh (best of {args.repeat})")
        print(
            f"{'path':<44}{'wall s':>8}{'vs ref':>10}{'CPU s':>8}{'vs ref':>10}"
            f"{'peak RSS':>13}  counts"
        )
        row("seed's reference loop (1 process)", ref, ref)
        row("forklab plan (memo on, default processes)", on, ref)
        row("forklab plan --no-memo (default processes)", off, ref)
        row("forklab plan --no-memo, scalar (no batching)", scalar, ref)
        print(
            f"vs the reference loop, wall: memo on {ref['seconds'] / on['seconds']:.2f}x, "
            f"memo off {ref['seconds'] / off['seconds']:.2f}x, memo off scalar "
            f"{ref['seconds'] / scalar['seconds']:.2f}x (CPU s: memo on "
            f"{ref['cpu'] / on['cpu']:.2f}x, memo off {ref['cpu'] / off['cpu']:.2f}x, "
            f"memo off scalar {ref['cpu'] / scalar['cpu']:.2f}x)"
        )
        runs = [r for path in rounds.values() for r in path]
        same = all(r["counts"] == ref["counts"] for r in runs)
        print("same counts:", same)
        if args.scale:
            print("\ncounter-recovery at scale (baseline + refresh), end to end")
            # batched next to scalar: the batched rows rest on counter-recovery's batch methods
            paths = ((True, False, on), (False, False, off), (False, True, scalar))
            for memo, plain, small in paths:
                runs = []
                for size in sizes(args.scale):
                    if not memo and args.memo_off_up_to is not None and size > args.memo_off_up_to:
                        continue
                    big = spec(Path(tmp) / "big.json", "counter-recovery", size, ["refresh"])
                    runs.append((size, plan(big, memo, scalar=plain)))
                how = "scalar " if plain else "batched"
                scaled(f"memo {'on ' if memo else 'off'}, {how}", runs, small)
        if args.cascade:
            print("\nretry-cascade x 8 worlds, end to end")
            runs = []
            for size in sizes(args.cascade):
                cascade = spec(Path(tmp) / "cascade.json", "retry-cascade", size, CASCADE)
                runs.append((size, plan(cascade)))
            scaled("episodes", runs, None)
        if args.cascade_replay:
            size = args.cascade_replay - args.cascade_replay % SAMPLE
            path = spec(Path(tmp) / "replay.json", "retry-cascade", size, CASCADE)
            r = measure([sys.executable, "-c", REPLAY, str(path), str(SAMPLE)])
            report = json.loads(r.pop("stdout"))
            print(
                f"\nretry-cascade x 8 worlds, {size:,} episodes replayed from {SAMPLE:,} "
                f"simulated ({len(report['comparisons'])} comparisons, guard "
                f"{'present' if report['guard'] else 'absent'}): {r['seconds']:.1f} s; "
                f"peak RSS largest {gib(r['peak_kib'])}, tree {gib(r['tree_kib'])}"
            )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
