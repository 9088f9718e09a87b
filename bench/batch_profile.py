"""Where one chunk's time goes on the durable path, against the twin, in CPU seconds on
this host's local backend (bubblewrap when it works).

CPU seconds, not wall time: on a shared machine wall time measures the neighbours. Wall
time of the whole path (Temporal included) is what ``bench/campaign.py`` reports. One
chunk of the spec's episodes, every world of it, each side in fresh processes as the
campaign runs them (CPU read with ``wait4``, children included):

- the twin: ``run_batch`` of the chunk (what ``forklab plan`` runs in each of its
  processes: each prefix once, then every world, one draw table per episode);
- the prefixes: the runner's ``prefix`` mode over the chunk (what the rehearsal hands
  over, or the prefix's sandbox runs);
- the world group outside a box: the runner's ``continue`` mode with every world
  (``forklab.runtime.world_group``): its first process reads the checkpoints and
  works out what the worlds share, then each world runs in a forked process of its own;
  split into that shared part and the worlds' own (as each world's process timed itself);
- the same group in a real box (its own CPU, read inside it: a PID namespace hides it
  from the worker), and the worker's part: creating the box, uploads, exec bookkeeping,
  download, delete, and parsing, validating and storing each world's columns.

Each figure is the least of ``repeats`` runs.

    python bench/batch_profile.py [--episodes 5000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forklab.activities.experiment.runner_bundle import bundle_files
from forklab.activities.sandbox.base import Limits
from forklab.activities.sandbox.jail import bubblewrap
from forklab.activities.sandbox.local import LocalSandboxBackend
from forklab.activities.stores.artifacts import LocalArtifactStore
from forklab.cli.experiment.specfile import load_spec
from forklab.experiments.experiment.outcomes import StoredColumns
from forklab.experiments.experiment.spec import ExperimentSpec
from forklab.experiments.experiment.worlds import spec_world_plans
from forklab.runtime.file_format import (
    CHECKPOINTS_FILE,
    OUT_FILE,
    REQUEST_FILE,
    RUNNER_MODULE,
    parse_world_outputs,
    request_text,
)

ROOT = Path(__file__).resolve().parent.parent

#: The twin's inner loop over one chunk, in a fresh process.
_TWIN = """
import json, sys
from forklab.experiments.experiment.worlds import spec_world_plans
from forklab.runtime.runner import run_batch, workload_class
from forklab.experiments.experiment.spec import ExperimentSpec
spec = ExperimentSpec.model_validate_json(open(sys.argv[1]).read())
workload = workload_class(spec.workload.name)(dict(spec.workload.params))
run_batch(workload, spec.seed, range(int(sys.argv[2])), spec_world_plans(spec), memo=False)
"""

#: The runner run in a box as it runs there (``python -m``), then the CPU seconds the
#: box's process and the worlds it forked and waited for have used.
_CPU_PROBE = f"""import resource, runpy, sys
sys.argv = ['runner', 'continue', '--request', '{REQUEST_FILE}', '--checkpoints',
            '{CHECKPOINTS_FILE}', '--out', '{OUT_FILE}']
try:
    runpy.run_module('{RUNNER_MODULE}', run_name='__main__', alter_sys=True)
except SystemExit:
    pass
cpu = sum(u.ru_utime + u.ru_stime for u in (
    resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))
print(cpu, file=sys.stderr)
"""
_PROBE = "forklab_cpu_probe"


def child_cpu(argv: list[str], cwd: Path) -> float:
    """The CPU seconds of ``argv`` run to its end in a fresh process (and what it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(argv, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


@dataclass
class BatchProfile:
    episodes: int
    worlds: int
    confinement: str
    twin: float  # CPU seconds of the chunk, every world
    prefix: float
    group: float  # the world group outside a box, its forked worlds included
    worlds_own: float  # of which the worlds' processes (as each timed itself, wall)
    in_box: float  # the same group in a real box
    host: float  # the worker's part around the box

    @property
    def durable(self) -> float:
        """The chunk on the durable path before Temporal, planning and analysis: the
        prefixes once (the rehearsal hands them over) and the world group in its box."""
        return self.prefix + self.in_box + self.host

    def lines(self) -> list[str]:
        def row(name: str, seconds: float) -> str:
            return f"  {name:<52} {seconds:8.3f} s  {seconds / self.twin:6.1%}"

        return [
            f"one chunk of {self.episodes:,} episodes x {self.worlds} worlds, CPU seconds "
            f"({self.confinement}; % of the twin's CPU for the chunk):",
            row("twin: run_batch of the chunk, one process", self.twin),
            row("prefixes (runner prefix)", self.prefix),
            row("world group, outside a box (runner continue)", self.group),
            row("  of which the worlds' own processes (wall)", self.worlds_own),
            row("  of which the shared part, start and fork", self.group - self.worlds_own),
            row("the same group in its box", self.in_box),
            row("worker: box admin, columns parsed + stored", self.host),
            row("= the chunk on the durable path, before Temporal", self.durable),
            f"durable / twin for the chunk, before Temporal, planning and analysis: "
            f"{self.durable / self.twin:.3f}x",
        ]


def profile_batch(spec: ExperimentSpec, episodes: int, repeats: int = 3) -> BatchProfile:
    plans = spec_world_plans(spec)
    name, params, seed = spec.workload.name, dict(spec.workload.params), spec.seed
    runner = [sys.executable, "-m", RUNNER_MODULE]
    files = ["--request", REQUEST_FILE, "--checkpoints", CHECKPOINTS_FILE, "--out", OUT_FILE]
    with tempfile.TemporaryDirectory(prefix="forklab-profile-") as tmp:
        work = Path(tmp)
        (work / "spec.json").write_text(spec.model_dump_json())
        twin = min(
            child_cpu([sys.executable, "-c", _TWIN, "spec.json", str(episodes)], work)
            for _ in range(repeats)
        )
        (work / REQUEST_FILE).write_text(request_text(name, params, seed, episodes=range(episodes)))
        prefix = min(child_cpu([*runner, "prefix", *files], work) for _ in range(repeats))
        checkpoints = (work / CHECKPOINTS_FILE).read_bytes()
        seconds = [3600.0] * len(plans)
        request = request_text(name, params, seed, worlds=plans, seconds=seconds)
        (work / REQUEST_FILE).write_text(request)
        group, worlds_own = float("inf"), 0.0
        for _ in range(repeats):
            for folder in work.glob("world-*"):
                folder.rmdir()
            cpu = child_cpu([*runner, "continue", *files], work)
            if cpu < group:
                outputs = parse_world_outputs((work / OUT_FILE).read_bytes(), episodes, len(plans))
                group, worlds_own = cpu, sum(o.seconds for o in outputs)
        backend = LocalSandboxBackend(work / "sandboxes")
        store = LocalArtifactStore(work / "artifacts")
        snapshot = backend.prepare_snapshot(bundle_files(name)).id
        limits = Limits(cpu_seconds=3600, wall_seconds=3600)
        in_box, host = float("inf"), float("inf")
        for _ in range(repeats):
            t = time.process_time()
            box = backend.create(snapshot, {"profile": "1"}, limits)
            backend.upload(box, REQUEST_FILE, request.encode())
            backend.upload(box, CHECKPOINTS_FILE, checkpoints)
            backend.upload(box, f"{_PROBE}.py", _CPU_PROBE.encode())
            ran = backend.exec(box, ["python", "-m", _PROBE], 3600)
            if ran.exit_code != 0:
                raise RuntimeError(f"the box failed: {ran.stderr[-500:]}")
            out = backend.download(box, OUT_FILE)
            backend.delete(box)
            for output in parse_world_outputs(out, episodes, len(plans)):
                columns = StoredColumns.model_validate(output.columns)
                store.put_json(columns.model_dump(mode="json"))
            host = min(host, time.process_time() - t)
            in_box = min(in_box, float(ran.stderr.strip().splitlines()[-1]))
    return BatchProfile(
        episodes=episodes,
        worlds=len(plans),
        confinement="bubblewrap" if bubblewrap()[0] else "confined process, no bubblewrap",
        twin=twin,
        prefix=prefix,
        group=group,
        worlds_own=worlds_own,
        in_box=in_box,
        host=host,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--spec", type=Path, default=ROOT / "forklab" / "workloads" / "retry-cascade.yaml"
    )
    parser.add_argument("--episodes", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.episodes < 1 or args.repeats < 1:
        parser.error("--episodes and --repeats must be at least 1")
    for line in profile_batch(load_spec(str(args.spec)), args.episodes, args.repeats).lines():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
