"""``forklab plan`` end to end against the seed's reference loop, and how it scales.

One run prints:

1. the seed's reference loop (its toy world written again as plain functions: run to
   step 3, ``deepcopy`` the state twice, refresh one copy, finish both, count the labels
   and the slices) over N counter-recovery episodes, in a fresh process;
2. ``forklab plan`` of the same N episodes (baseline + refresh), end to end — interpreter
   start, spec, twin, analysis, guard validation, report — in a fresh process, with the
   memo on (the default) and off (every episode simulated in full);
3. with ``--scale M``: the same plan at M episodes, its time as a multiple of the N run
   and its peak RSS;
4. with ``--cascade K``: ``forklab plan`` of K retry-cascade episodes × 8 worlds, peak RSS.

Peak RSS is the largest resident set of the measured process and its children
(``ru_maxrss`` of a wrapper process), so a process pool's worker counts when it is larger.

    python bench/plan_scale.py [--episodes 300000] [--scale 10000000] [--cascade 1000000]
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

ROOT = Path(__file__).resolve().parent.parent

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
import json, resource, subprocess, sys, time
start = time.perf_counter()
done = subprocess.run(json.loads(sys.argv[1]), stdout=subprocess.PIPE, text=True)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
print(json.dumps({"seconds": seconds, "peak_kib": peak, "rc": done.returncode,
                  "stdout": done.stdout}))
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


def plan(path: Path, memo: bool = True) -> dict[str, Any]:
    argv = [sys.executable, "-m", "forklab.cli", "plan", str(path), "--json"]
    if not memo:
        argv.append("--no-memo")
    result = measure(argv)
    report = json.loads(result.pop("stdout"))
    comp = next(c for c in report["comparisons"] if c["vs"] == "baseline")
    result["counts"] = (comp["rescue"], comp["harm"], comp["unchanged"])
    return result


def row(label: str, r: dict[str, Any], base: float) -> None:
    print(
        f"{label:<44}{r['seconds']:>9.2f}{base / r['seconds']:>10.2f}x"
        f"{r['peak_kib'] / 1024:>10.0f} MiB  {r.get('counts', '')}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--episodes", type=int, default=300_000)
    parser.add_argument("--scale", type=int, default=0, help="also plan this many episodes")
    parser.add_argument("--cascade", type=int, default=0, help="retry-cascade episodes")
    args = parser.parse_args()
    n = args.episodes
    print(f"load average at start: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")
    with tempfile.TemporaryDirectory() as tmp:
        counter = spec(Path(tmp) / "counter.json", "counter-recovery", n, ["refresh"])
        ref = measure([sys.executable, "-c", REFERENCE, str(n)])
        totals = json.loads(ref.pop("stdout").split(" {")[0].replace("'", '"'))
        ref["counts"] = (totals.get("rescue", 0), totals.get("harm", 0), totals["unchanged"])
        print(f"\ncounter-recovery, {n:,} episodes, baseline + refresh")
        print(f"{'path':<44}{'seconds':>9}{'vs ref':>11}{'peak RSS':>14}  counts")
        row("seed's reference loop (1 process)", ref, ref["seconds"])
        on = plan(counter)
        row("forklab plan (memo on, default processes)", on, ref["seconds"])
        off = plan(counter, memo=False)
        row("forklab plan (memo off)", off, ref["seconds"])
        same = ref["counts"] == on["counts"] == off["counts"]
        print("same counts:", same)
        if args.scale:
            big = spec(Path(tmp) / "big.json", "counter-recovery", args.scale, ["refresh"])
            for memo in (True, False):
                r = plan(big, memo)
                label = f"forklab plan {args.scale:,} (memo {'on' if memo else 'off'})"
                small = on if memo else off
                print(
                    f"{label:<44}{r['seconds']:>9.2f}s = {r['seconds'] / small['seconds']:.1f}x "
                    f"the {n:,} run, peak RSS {r['peak_kib'] / 1024 / 1024:.2f} GiB"
                )
        if args.cascade:
            names = [
                "jitter",
                "broadcast",
                "queue-memory",
                "latency",
                "broadcast-jitter",
                "restart",
                "placebo",
            ]
            cascade = spec(Path(tmp) / "cascade.json", "retry-cascade", args.cascade, names)
            r = plan(cascade)
            print(
                f"retry-cascade plan, {args.cascade:,} episodes x 8 worlds: {r['seconds']:.1f} s, "
                f"peak RSS {r['peak_kib'] / 1024 / 1024:.2f} GiB"
            )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
