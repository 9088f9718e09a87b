"""``forklab plan`` end to end against a plain single-process loop of the same world.

The workloads are third-party ones without hints (no batch methods, no ``world_blocks``)
and with default settings: ``examples/flaky_tool.py`` (2 worlds; every episode starts
from the same state but draws its own luck) and ``examples/ticket_triage.py`` (5 worlds;
every episode is its own customer, so no two states are equal), each scaled to
``--episodes`` episodes from its example spec.

For each, in one run, ``--repeat`` rounds of both, in alternating order (plain then plan,
then plan then plain, ...):

- **plain**: the loop a user writes first, in a fresh process that imports only the
  workload and ``forklab.runtime.crn``: per episode the prefix once, then per world a
  ``copy.deepcopy`` of the state, a fresh ``Shocks`` (the same counter-based shocks),
  ``schedule_shocks``, the intervention, ``step`` until ``done``, ``outcome`` — nothing
  else (no checkpoint, no checks, no analysis). It prints the outcomes digest of its
  per-world outcomes, computed as the report's ``outcomes_digest`` is.
- **plan**: ``forklab plan SPEC --json`` with no flags, in a fresh process, end to end
  (interpreter start, spec, rehearsal with its contract checks, analysis, guard
  validation, report). Its report's ``outcomes_digest`` must equal the plain loop's.

ForkLab and the examples are byte-compiled first, as an installed package is (where
``PYTHONDONTWRITEBYTECODE`` is set, every fresh process would compile them again).
With ``--stages`` the plan runs once more in a fresh process, stamped at the end of each
of its stages (imports, spec, the rehearsal's start, the analysis modules, the
experiment's episodes, the held-out episodes, the analysis, the report): wall and CPU
seconds of each.

Each row prints wall and CPU seconds (the process tree's), the ratio plain / plan of
each round (the figure is the median of the rounds' ratios: the rounds alternate, so
a burst of load on the shared machine hits one round of one path), and the load average
before and after. With ``--profile`` the plan also runs once in-process, stage by stage
(``forklab/activities/experiment/twin.py``'s rehearsal split into pool, checkpoint
encode, shock draws, contract checks; the analysis; the report), and prints the
breakdown.

    python bench/plain_loop.py [--episodes 100000] [--repeat 3] [--only flaky|ticket]
                               [--stages] [--profile]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

#: name -> example spec (its workload lives beside it)
WORKLOADS = {"flaky": "flaky-tool.yaml", "ticket": "ticket-triage.yaml"}

PLAIN = r"""
import copy, hashlib, importlib, json, sys

from forklab.runtime.crn import Shocks

spec = json.loads(sys.argv[1])
module, _, attr = spec["workload"]["name"].partition(":")
workload = getattr(importlib.import_module(module), attr)(spec["workload"].get("params", {}))
seed, episodes = spec["seed"], spec["episodes"]
worlds = [
    (w["name"], (w.get("intervention") or {}).get("name"),
     {**workload.interventions.get((w.get("intervention") or {}).get("name"), {}),
      **(w.get("intervention") or {}).get("params", {})})
    for w in spec["worlds"]
]
out = {name: [] for name, _, _ in worlds}
for episode in range(episodes):
    shocks = Shocks(seed, episode)
    state = workload.initial_state(seed + episode, shocks)
    while workload.cursor(state) < workload.boundary(state) and not workload.done(state):
        workload.step(state, shocks)
    for name, intervention, params in worlds:
        world = copy.deepcopy(state)
        world_shocks = Shocks(seed, episode)
        workload.schedule_shocks(world, world_shocks)
        if intervention is not None:
            workload.intervene(world, intervention, params, world_shocks)
        while not workload.done(world):
            workload.step(world, world_shocks)
        out[name].append(workload.outcome(world))
# the report's outcomes digest: sha256 of the canonical JSON [[name, [0, 1, ...]], ...]
text = json.dumps([[name, [int(v) for v in out[name]]] for name, _, _ in worlds],
                  separators=(",", ":"))
print(hashlib.sha256(text.encode()).hexdigest())
"""

WRAP = r"""
import json, resource, subprocess, sys, time
start = time.perf_counter()
done = subprocess.run(json.loads(sys.argv[1]), capture_output=True, text=True, cwd=sys.argv[2],
                      env=json.loads(sys.argv[3]))
seconds = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"seconds": seconds, "cpu": usage.ru_utime + usage.ru_stime,
                  "rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr[-2000:]}))
"""


def measure(argv: list[str], cwd: Path) -> dict[str, Any]:
    """Run ``argv`` in a fresh process: wall seconds, CPU seconds of it and its children."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{EXAMPLES}"}
    done = subprocess.run(
        [sys.executable, "-c", WRAP, json.dumps(argv), str(cwd), json.dumps(env)],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    if result["rc"] != 0:
        raise SystemExit(f"{' '.join(argv)} failed with exit {result['rc']}: {result['stderr']}")
    return result


def scaled_spec(name: str, episodes: int, folder: Path) -> tuple[dict[str, Any], Path]:
    import yaml

    spec: dict[str, Any] = yaml.safe_load((EXAMPLES / WORKLOADS[name]).read_text())
    spec["episodes"] = episodes
    path = folder / f"{name}.json"
    path.write_text(json.dumps(spec))
    return spec, path


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def compare(name: str, episodes: int, repeat: int, folder: Path) -> bool:
    spec, path = scaled_spec(name, episodes, folder)
    worlds = len(spec["worlds"])
    print(f"\n{name}: {spec['workload']['name']}, {episodes:,} episodes x {worlds} worlds")
    print(f"  load before: {load()}")
    ratios: list[float] = []
    same = True
    plain_argv = [sys.executable, "-c", PLAIN, json.dumps(spec)]
    plan_argv = [sys.executable, "-m", "forklab.cli", "plan", str(path), "--json"]
    for round_ in range(repeat):
        # plain, plan, then plan, plain, ...: load that rises or falls over the run does
        # not always fall on the second of a round
        if round_ % 2:
            plan = measure(plan_argv, EXAMPLES)
            plain = measure(plain_argv, EXAMPLES)
        else:
            plain = measure(plain_argv, EXAMPLES)
            plan = measure(plan_argv, EXAMPLES)
        report = json.loads(plan["stdout"])
        digest = plain["stdout"].strip()
        same = same and report["outcomes_digest"] == digest and report["valid"]
        ratio = plain["seconds"] / plan["seconds"]
        ratios.append(ratio)
        print(
            f"  round {round_ + 1}: plain {plain['seconds']:6.2f} s wall ({plain['cpu']:6.2f} CPU)"
            f"  plan {plan['seconds']:6.2f} s wall ({plan['cpu']:6.2f} CPU)"
            f"  plain/plan {ratio:.2f}x wall, {plain['cpu'] / plan['cpu']:.2f}x CPU"
            f"  [load {load()}]"
        )
    spread = max(ratios) - min(ratios)
    print(
        f"  {name}: plain / plan = {statistics.median(ratios):.2f}x (median of {repeat}; "
        f"range {min(ratios):.2f}–{max(ratios):.2f}, spread {spread:.2f}); "
        f"identical outcomes: {same}"
    )
    print(f"  load after: {load()}")
    return same


PROFILE = r"""
import cProfile, json, os, pstats, resource, sys, time

from forklab.activities.experiment.twin import run_twin, TwinRehearsal, _chunk_args, _pool
from forklab.experiments.experiment.chunks import run_chunk
from forklab.experiments.experiment.worlds import spec_world_plans
from forklab.cli.experiment.specfile import load_spec
from forklab.experiments.experiment.analysis.build import build_report
from forklab.experiments.experiment.analysis.held_out_plan import held_out_plan
from forklab.experiments.experiment.outcomes import from_batch
from forklab.experiments.experiment.report.render_text import render_text

spec = load_spec(sys.argv[1])
module = sys.modules[type(__import__("forklab.experiments.experiment.spec", fromlist=["x"])
                         .resolve_workload(spec)).__module__].__file__
ahead = held_out_plan(spec)
runs = [(range(spec.episodes), None)] + ([ahead] if ahead else [])


def cpu():
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def stage(file, name):
    if file == module:
        return "workload code"
    base = os.path.basename(file)
    if base == "crn.py" or name in ("<method 'digest' of '_blake2.blake2b' objects>",
            "<method 'update' of '_blake2.blake2b' objects>",
            "<method 'copy' of '_blake2.blake2b' objects>", "<built-in method from_bytes>"):
        return "shock draws"
    if base == "canon.py" or name in ("_Fork.take", "_exact_key", "_is_flat", "_Fork.__init__",
            "_checked_checkpoint") or (
            "marshal" in name or "sha256" in name or "hexdigest" in name):
        return "checkpoint encode/decode"
    if base == "contract.py" or name == "_checked_features":
        return "contract checks"
    if base in ("columnar.py", "chunks.py", "vector.py"):
        return "columns"
    if base == "runner.py":
        return "runner bookkeeping"
    return None


def seconds_by_stage(stats):  # cProfile's own seconds of each function, summed by stage
    shares = {}
    for (file, line, func), (cc, nc, tt, ct, callers) in stats.items():
        name = func
        if file == "~":  # a builtin: its time goes to the stage of whoever called it
            named = stage(file, name)
            if named is not None:
                shares[named] = shares.get(named, 0.0) + tt
                continue
            for (cfile, cline, cfunc), edge in callers.items():
                key = stage(cfile, cfunc) or "other"
                shares[key] = shares.get(key, 0.0) + edge[2]
            continue
        qual = func
        if file.endswith("runner.py") and func in ("take", "__init__"):
            qual = "_Fork." + func
        key = stage(file, qual) or "other"
        shares[key] = shares.get(key, 0.0) + tt
    return shares


def profiled_chunk(args):  # run_chunk under cProfile, in a pool's process: seconds by stage
    profile = cProfile.Profile()
    profile.enable()
    run_chunk(args)
    profile.disable()
    return seconds_by_stage(pstats.Stats(profile).stats)


# 1. the twin in one process under cProfile: where its CPU goes, by stage (shares)
profile = cProfile.Profile()
profile.enable()
for episodes, plans in runs:
    run_twin(spec, episodes=episodes, worlds=plans, processes=1)
profile.disable()
shares = seconds_by_stage(pstats.Stats(profile).stats)
total = sum(shares.values())

# 1b. the experiment's chunks in a pool of two, each process under cProfile (the pool's
#     processes run ``run_chunk``, as the plan's pool does): their shares, summed
workers = {}
with _pool(2) as pool_:
    chunk_args = _chunk_args(spec, range(spec.episodes), spec_world_plans(spec), 4, True, True)
    for part in pool_.map(profiled_chunk, chunk_args):
        for key, value in part.items():
            workers[key] = workers.get(key, 0.0) + value
workers_total = sum(workers.values()) or 1.0

# 2. the same, measured (no profiler): the twin on one process, then on the pool with the
#    held-out chunks, then the analysis and the report
start = cpu()
for episodes, plans in runs:
    run_twin(spec, episodes=episodes, worlds=plans, processes=1)
one = cpu() - start
start, wall = cpu(), time.perf_counter()
with TwinRehearsal(spec) as twin:
    out = twin.outcomes("bench")
    held_batch = twin.held_out(spec, *ahead) if ahead else None
    pool_wall = time.perf_counter() - wall
pool = cpu() - start
# the same on two processes, whatever the load: what the pool itself costs (its start, the
# chunks' transfer and merge) against one process, in CPU of all the processes
start, wall = cpu(), time.perf_counter()
with TwinRehearsal(spec, processes=2) as two:
    two.outcomes("bench")
    if ahead:
        two.held_out(spec, *ahead)
    two_wall = time.perf_counter() - wall
two_cpu = cpu() - start
start = cpu()
report = build_report(spec, out, "bench", held_out=lambda *request: held_batch)
analysis = cpu() - start
start = cpu()
render_text(report)
report.model_dump_json(indent=2)
rendered = cpu() - start
print(json.dumps({"shares": {k: v / total for k, v in shares.items()}, "one": one,
                  "pool": pool, "pool_wall": pool_wall, "processes": twin.processes,
                  "two": two_cpu, "two_wall": two_wall,
                  "workers": {k: v / workers_total for k, v in workers.items()},
                  "analysis": analysis, "report": rendered}))
"""

STAGES = r"""
import contextlib, io, json, resource, sys, time

def stamp():
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return [time.perf_counter(), me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime]

marks = [["interpreter started", stamp()]]
import forklab.cli.main as cli
from forklab.cli.experiment import plan_commands, rehearsal
import forklab.activities.experiment.twin as twin
marks.append(["imports before the spec (CLI, spec models, numpy)", stamp()])


def after(owner, name, label, once=False):
    inner = getattr(owner, name)
    calls = []

    def wrapped(*args, **kwargs):
        out = inner(*args, **kwargs)
        if not (once and calls):
            marks.append([label() if callable(label) else label, stamp()])
        calls.append(1)
        return out

    setattr(owner, name, wrapped)


def before(owner, name, label, then=None):
    inner = getattr(owner, name)

    def wrapped(*args, **kwargs):
        marks.append([label, stamp()])
        if then is not None:
            then()
        return inner(*args, **kwargs)

    setattr(owner, name, wrapped)


runs = []
after(plan_commands, "load_spec", "spec read and checked")
after(rehearsal.Rehearsal, "__enter__", "rehearsal entered (pool forked and fed, if any)")
def stamp_analysis():  # (imported by the plan itself, after the rehearsal started)
    import forklab.experiments.experiment.analysis.build as build

    after(build, "build_report", "analysis (the rest; in a pool: the held-out episodes)")


before(
    rehearsal.Rehearsal, "report", "analysis and report modules imported", stamp_analysis
)
after(twin.TwinRehearsal, "run", "experiment's episodes in (waited for, or run here)", True)
def stamp_runs():
    inner = twin.run_twin

    def wrapped(*args, **kwargs):
        if runs:  # the held-out run: the analysis got this far first
            marks.append(["analysis up to the guard's held-out episodes", stamp()])
        out = inner(*args, **kwargs)
        runs.append(1)
        label = "experiment run here" if len(runs) == 1 else "held-out episodes run here"
        marks.append([label, stamp()])
        return out

    twin.run_twin = wrapped


stamp_runs()
import pydantic
after(pydantic.BaseModel, "model_dump_json", "report written (JSON)")
with contextlib.redirect_stdout(io.StringIO()):
    cli.dispatch(["plan", sys.argv[1], "--json"])
marks.append(["done (pool shut down)", stamp()])
print(json.dumps(marks))
"""


def stages(name: str, episodes: int, folder: Path) -> None:
    """``forklab plan``'s own run, stamped stage by stage (``STAGES``): wall and CPU of
    this process; the CPU of its pool's processes shows once they are reaped."""
    _, path = scaled_spec(name, episodes, folder)
    got = measure([sys.executable, "-c", STAGES, str(path)], EXAMPLES)
    marks = json.loads(got["stdout"])
    print(f"\n{name}, {episodes:,} episodes: forklab plan by stage [load {load()}]")
    print(f"  {'stage (ends at)':<62} {'wall s':>7} {'CPU s':>7} {'pool CPU':>8}")
    start = marks[0][1]
    print(
        f"  {'interpreter start (from the process start)':<62} "
        f"{got['seconds'] - (marks[-1][1][0] - start[0]):>7.2f}"
    )
    for (label, (wall, cpu, kids)), (_, (wall0, cpu0, kids0)) in zip(
        marks[1:], marks[:-1], strict=True
    ):
        print(f"  {label:<62} {wall - wall0:>7.2f} {cpu - cpu0:>7.2f} {kids - kids0:>8.2f}")
    end = marks[-1][1]
    print(
        f"  {'whole process':<62} {got['seconds']:>7.2f} {got['cpu']:>7.2f}"
        f"  (this process {end[1]:.2f} + pool {end[2]:.2f})"
    )


IMPORTS = (
    "import forklab.cli.main, forklab.cli.experiment.rehearsal, "
    "forklab.experiments.experiment.analysis.build, "
    "forklab.experiments.experiment.report.render_text"
)


def profile(name: str, episodes: int, folder: Path) -> None:
    """Where ``forklab plan``'s CPU goes, stage by stage (see ``PROFILE``)."""
    spec, path = scaled_spec(name, episodes, folder)
    imports = measure([sys.executable, "-c", IMPORTS], EXAMPLES)
    plain = measure([sys.executable, "-c", PLAIN, json.dumps(spec)], EXAMPLES)
    got = json.loads(measure([sys.executable, "-c", PROFILE, str(path)], EXAMPLES)["stdout"])
    print(f"\n{name}, {episodes:,} episodes: CPU seconds by stage [load {load()}]")
    print(f"  plain loop (whole process)                 {plain['cpu']:7.2f}")
    print(f"  interpreter start and imports              {imports['cpu']:7.2f}")
    print(f"  twin, one process (experiment + held-out)  {got['one']:7.2f}")
    for stage, share in sorted(got["shares"].items(), key=lambda kv: -kv[1]):
        print(f"    {stage:<40} {share:6.1%}  (cProfile's share)")
    print(
        f"  twin as the plan runs it ({got['processes']} process(es), CPU of all) "
        f"{got['pool']:7.2f}  ({got['pool'] - got['one']:+.2f} against one process; "
        f"{got['pool_wall']:.2f} s wall)"
    )
    print("  the pool's processes under cProfile (the experiment's chunks, 2 processes):")
    for stage, share in sorted(got["workers"].items(), key=lambda kv: -kv[1]):
        print(f"    {stage:<40} {share:6.1%}  (cProfile's share)")
    print(
        f"  twin on 2 processes, forced (CPU of all)    {got['two']:7.2f}  "
        f"({got['two'] - got['one']:+.2f} against one process: the pool's start, transfer, "
        f"merge; {got['two_wall']:.2f} s wall)"
    )
    print(f"  analysis (held-out batch already run)      {got['analysis']:7.2f}")
    print(f"  report (text + JSON)                       {got['report']:7.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--episodes", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=sorted(WORKLOADS), default=None)
    parser.add_argument(
        "--profile", action="store_true", help="also print the CPU of each stage of a plan"
    )
    parser.add_argument(
        "--stages", action="store_true", help="also time forklab plan's own run stage by stage"
    )
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}, load average (1, 5, 15 min): {load()}")
    # Byte-compiled as an installed package is (this machine sets PYTHONDONTWRITEBYTECODE:
    # otherwise every fresh process would compile ForkLab's modules from source).
    for folder in (ROOT / "forklab", EXAMPLES):
        compileall.compile_dir(folder, quiet=1)
    names = [args.only] if args.only else list(WORKLOADS)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            if args.repeat:
                ok = compare(name, args.episodes, args.repeat, Path(tmp)) and ok
            if args.stages:
                stages(name, args.episodes, Path(tmp))
            if args.profile:
                profile(name, args.episodes, Path(tmp))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
