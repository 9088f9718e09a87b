"""Where one world batch's time goes: the twin's share of the same work, and each piece a
sandbox adds on top, in CPU seconds on this host's local backend (bubblewrap when it works).

CPU seconds, not wall time: on a shared machine wall time measures the neighbours. Wall
time of the whole path (Temporal included) is what ``bench/campaign.py`` reports.
One chunk of the spec's episodes, every world of it:

- twin share: ``run_batch`` (what ``forklab plan`` runs: each prefix once, then every
  world, one draw table per episode for all worlds) minus the prefixes, per world;
- the world alone: the same world continued from the checkpoints (``continue_checkpoints``,
  what the runner does in a box), with a draw table of its own (it hashes every
  coordinate it draws, where the twin hashes each once for all worlds) and parsing each
  checkpoint's state itself;
- the world with the prefix's draws: the same, preloading each episode's block runs from
  the draws file the prefix's box wrote (reading the file included), and what writing
  that file adds to the prefix's box, per world batch (its chunk's cost over the worlds);
- in the box (the box's own CPU, launcher included): its start running ``pass``, the
  runner's imports (with the worker's bytecode, and compiled from source as boxes did
  before it), the runner's rest (reading checkpoints, writing columns);
- the worker: creating the box, uploads, exec bookkeeping (snapshot and bytecode
  checks, registry), download, delete, and parsing, validating and storing the columns.

Each is the least of ``repeats`` runs, per world batch (the mean over the worlds).

    python bench/batch_profile.py [--episodes 1000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from activities.artifacts import LocalArtifactStore
from activities.runner_bundle import bundle_files
from activities.sandbox.base import Limits
from activities.sandbox.jail import bubblewrap
from activities.sandbox.local import LocalSandboxBackend
from experiments.engine import spec_world_plans
from experiments.outcomes import StoredColumns
from experiments.runtime.draws_file import DrawsWriter, draws_key, read_draws
from experiments.runtime.file_format import (
    CHECKPOINTS_FILE,
    DRAWS_FILE,
    OUT_FILE,
    REQUEST_FILE,
    RUNNER_MODULE,
    WorldPlan,
    checkpoint_line,
    parse_columns,
    request_text,
)
from experiments.runtime.runner import (
    continue_checkpoints,
    prefix_with_runs,
    run_batch,
    run_prefix,
    workload_class,
)
from experiments.spec import ExperimentSpec
from forklab.specfile import load_spec

ROOT = Path(__file__).resolve().parent.parent


def least(fn: Callable[[], object], repeats: int) -> float:
    """The least CPU seconds (of this process) ``fn`` took over ``repeats`` runs."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


#: A module run in a box as the runner is (``python -m``): the Python code given, then
#: the CPU seconds the box's process has used since the launcher started (``execve``
#: keeps them; a runner's ``sys.exit`` is caught). A PID namespace hides the box's CPU
#: from the worker's ``getrusage``.
_CPU_PROBE = (
    "import resource, sys\n"
    "try:\n{code}\nexcept SystemExit:\n    pass\n"
    "u = resource.getrusage(resource.RUSAGE_SELF)\n"
    "print(u.ru_utime + u.ru_stime, file=sys.stderr)\n"
)
_PROBE = "forklab_cpu_probe"


def box_cpu(backend: LocalSandboxBackend, box: str, code: str, repeats: int) -> float:
    """The least CPU seconds a box's process spent to run ``code`` (indented)."""
    backend.upload(box, f"{_PROBE}.py", _CPU_PROBE.format(code=code).encode())
    seconds = []
    for _ in range(repeats):
        ran = backend.exec(box, ["python", "-m", _PROBE], 3600)
        if ran.exit_code != 0:
            raise RuntimeError(f"the box failed: {ran.stderr[-500:]}")
        seconds.append(float(ran.stderr.strip().splitlines()[-1]))
    return min(seconds)


@dataclass
class BatchProfile:
    episodes: int
    worlds: int
    confinement: str
    twin_share: float  # CPU seconds per world batch
    prefix: float  # CPU seconds of the chunk's prefixes (once in the twin, twice durable)
    own_draws: float
    shipped_draws: float  # the world preloading the prefix's runs (None: the workload names none)
    prefix_added: float  # what writing the draws file adds to the prefix box, per world batch
    draws_bytes: int
    box_start: float
    imports: float
    imports_from_source: float
    runner_rest: float
    runner_rest_shipped: float  # the same, the draws file named in the request
    host: float

    @property
    def per_batch(self) -> float:
        return self.box_start + self.imports + self.own_draws + self.runner_rest + self.host

    @property
    def per_batch_shipped(self) -> float:
        fixed = self.box_start + self.imports + self.runner_rest_shipped + self.host
        return fixed + self.shipped_draws + self.prefix_added

    def durable_floor(self, prefix_runs: int) -> float:
        """The durable path's CPU for the chunk over the twin's, before Temporal, planning
        and analysis, with every world batch reading the prefix's draws: the prefixes
        once (``prefix_runs`` 1: the rehearsal runs them for good and hands them over) or
        twice (2: the rehearsal only checks them and the prefix's box runs them again, as
        for a workload with files or prefixes past the rehearsal's share of its box)."""
        durable = prefix_runs * self.prefix + self.worlds * self.per_batch_shipped
        return durable / (self.prefix + self.worlds * self.twin_share)

    def lines(self) -> list[str]:
        def row(name: str, seconds: float) -> str:
            return f"  {name:<46} {seconds * 1000:8.1f} ms  {seconds / self.twin_share:6.1%}"

        return [
            f"one world batch of {self.episodes:,} episodes, CPU time ({self.confinement}; "
            f"mean of {self.worlds} worlds; % of the twin's CPU for the same world-runs):",
            row("twin share (one draw table for all worlds)", self.twin_share),
            row(
                "+ the world alone (own draw table, state parse)", self.own_draws - self.twin_share
            ),
            row("box start (launcher + interpreter)", self.box_start),
            row("runner imports (worker's bytecode)", self.imports),
            row("  (runner imports compiled from source)", self.imports_from_source),
            row("runner rest (read checkpoints, write columns)", self.runner_rest),
            row("worker: box admin, columns parsed + stored", self.host),
            row("= one world batch, before Temporal", self.per_batch),
            f"with the prefix's draws ({self.draws_bytes / self.episodes:,.0f} B per episode):",
            row(
                "+ the world with the prefix's draws",
                self.shipped_draws - self.twin_share,
            ),
            row("runner rest (the same, reading the draws file)", self.runner_rest_shipped),
            row("+ the prefix box's writing them (per world)", self.prefix_added),
            row("= one world batch with them, before Temporal", self.per_batch_shipped),
            row("(a second run of every prefix, per world)", self.prefix / self.worlds),
            f"the chunk on the durable path ({self.worlds} world batches with the draws) "
            "against the whole twin's, CPU before Temporal, planning and analysis: "
            f"{self.durable_floor(1):.3f}x with the prefixes run once (the rehearsal hands "
            f"them over), {self.durable_floor(2):.3f}x with them run twice (checked by the "
            "rehearsal, run again by the prefix's box)",
        ]


_SHIPPED_REQUEST = "request-draws.json"


def profile_batch(spec: ExperimentSpec, episodes: int, repeats: int = 3) -> BatchProfile:
    plans = spec_world_plans(spec)
    workload = workload_class(spec.workload.name)(dict(spec.workload.params))
    seed, ids = spec.seed, list(range(episodes))
    prefix = least(lambda: [run_prefix(workload, seed, e) for e in ids], repeats)
    twin = least(lambda: run_batch(workload, seed, ids, plans), repeats)
    checkpoints = [run_prefix(workload, seed, e) for e in ids]
    own = [
        least(partial(continue_checkpoints, workload, seed, checkpoints, p), repeats) for p in plans
    ]
    key = draws_key(spec.workload.name, dict(spec.workload.params), seed)

    def prefix_and_draws() -> bytes:
        writer = DrawsWriter(key)
        for e in ids:
            writer.add(e, prefix_with_runs(workload, seed, e)[1])
        return writer.data()

    drawn = least(prefix_and_draws, repeats)
    draws = prefix_and_draws()

    def shipped(plan: WorldPlan) -> None:
        continue_checkpoints(workload, seed, checkpoints, plan, shipped=read_draws(draws, key))

    with_draws = [least(partial(shipped, p), repeats) for p in plans]
    data = "".join(checkpoint_line(cp) for cp in checkpoints).encode()
    module = workload_class(spec.workload.name).__module__
    imports = f"    import {RUNNER_MODULE}, {module}"
    runner, runner_shipped = (
        f"    import runpy\n    sys.argv = ['runner', 'continue', '--request', '{name}', "
        f"'--checkpoints', '{CHECKPOINTS_FILE}', '--out', '{OUT_FILE}']\n"
        f"    runpy.run_module('{RUNNER_MODULE}', run_name='__main__', alter_sys=True)"
        for name in (REQUEST_FILE, _SHIPPED_REQUEST)
    )
    with tempfile.TemporaryDirectory(prefix="forklab-profile-") as tmp:
        backend = LocalSandboxBackend(Path(tmp) / "sandboxes")
        # the same boxes, without the worker's bytecode (as every box ran before it)
        plain = LocalSandboxBackend(Path(tmp) / "sandboxes", bytecode=False)
        store = LocalArtifactStore(Path(tmp) / "artifacts")
        snapshot = backend.prepare_snapshot(bundle_files(spec.workload.name)).id
        limits = Limits(cpu_seconds=3600, wall_seconds=3600)
        start, imported, source, rest, rest_shipped, host = ([] for _ in range(6))
        for plan, own_seconds, shipped_seconds in zip(plans, own, with_draws, strict=True):
            request = request_text(spec.workload.name, dict(spec.workload.params), seed, world=plan)
            t = time.process_time()
            box = backend.create(snapshot, {"profile": "1"}, limits)
            backend.upload(box, REQUEST_FILE, request.encode())
            backend.upload(box, CHECKPOINTS_FILE, data)
            worker = time.process_time() - t
            t = time.process_time()
            started = box_cpu(backend, box, "    pass", repeats)
            worker += (time.process_time() - t) / repeats
            loaded = box_cpu(backend, box, imports, repeats)
            # -X beats the environment's PYTHONPYCACHEPREFIX: no bytecode to read
            compiled = box_cpu(plain, box, imports, repeats)
            whole = box_cpu(backend, box, runner, repeats)
            backend.upload(box, DRAWS_FILE, draws)
            named = request_text(
                spec.workload.name, dict(spec.workload.params), seed, world=plan, draws=DRAWS_FILE
            )
            backend.upload(box, _SHIPPED_REQUEST, named.encode())
            whole_shipped = box_cpu(backend, box, runner_shipped, repeats)
            t = time.process_time()
            out = backend.download(box, OUT_FILE)
            backend.delete(box)
            columns = StoredColumns.model_validate(parse_columns(out, episodes))
            store.put_json(columns.model_dump(mode="json"))
            host.append(worker + time.process_time() - t)
            start.append(started)
            imported.append(loaded - started)
            source.append(compiled - started)
            rest.append(max(whole - loaded - own_seconds, 0.0))
            rest_shipped.append(max(whole_shipped - loaded - shipped_seconds, 0.0))
    mean = statistics.mean
    return BatchProfile(
        episodes=episodes,
        worlds=len(plans),
        confinement="bubblewrap" if bubblewrap()[0] else "confined process, no bubblewrap",
        twin_share=(twin - prefix) / len(plans),
        prefix=prefix,
        own_draws=mean(own),
        shipped_draws=mean(with_draws),
        prefix_added=(drawn - prefix) / len(plans),
        draws_bytes=len(draws),
        box_start=mean(start),
        imports=mean(imported),
        imports_from_source=mean(source),
        runner_rest=mean(rest),
        runner_rest_shipped=mean(rest_shipped),
        host=mean(host),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "experiments" / "retry-cascade.yaml")
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.episodes < 1 or args.repeats < 1:
        parser.error("--episodes and --repeats must be at least 1")
    for line in profile_batch(load_spec(str(args.spec)), args.episodes, args.repeats).lines():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
