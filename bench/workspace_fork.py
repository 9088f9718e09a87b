"""Forking a coding agent's workspace into three children: overlay layers vs plain copies.

Run as root (overlayfs mounts): ``python bench/workspace_fork.py [--big-gib 1]``.

The workspace is the one of ``forklab demo workspace``: the ``calc`` package (about
twenty source files) and a synthetic ``vendored/vendored.bin``. A source workspace sits
on the sealed starting layer and runs the package's tests (so it wrote ``__pycache__/``
since). Measured, in one process, median of ``--repeat`` runs:

- **fork**: freeze the source's workspace into a layer and mount one writable workspace
  per child over it, until every child has read the first and the last byte of the blob;
- **copy**: the baseline, ``shutil.copytree`` of the source's workspace into three folders,
  until every child has read the same two bytes;
- the disk the children hold right after the fork (``st_blocks`` of everything the fork
  created for them), against the copies';
- the same fork with a 1 GiB blob, to show the fork does not grow with the files' size;
- the fork when the source wrote the blob itself since its last freeze (the freeze then
  hashes it: this is the cost a fork does pay per byte written, shown beside the rest);
- the whole sandbox fork (``LocalSandboxBackend.fork``: three new sandboxes, registry
  entries written with fsync, and the workspaces);
- the fork without the layer cache (``LayerStore(cache=False)``: every use re-reads and
  re-hashes each layer's manifest and seal), in the same rounds;
- the store's lock (``LayerLock``, ``flock``): a fork takes it once, shared, so that
  ``gc`` cannot remove a layer the fork is starting to use; its cost is shown against the
  fork's median.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forklab.activities.experiment.runner_bundle import bundle_files
from forklab.activities.runfork.coding_agent import BLOB, write_workspace
from forklab.activities.sandbox.base import Limits
from forklab.activities.sandbox.local import LocalSandboxBackend
from forklab.activities.sandbox.workspace import Workspaces, unmount_under
from forklab.workloads.coding_fix import DEMO_CASES, package_files, vendored_chunks

CHILDREN = 3
MIB = 1 << 20


def _touch_blob(folder: Path) -> None:
    """Read the blob's first and last byte: the child can read it."""
    with (folder / BLOB).open("rb") as fh:
        fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.read(1)


def _disk(folder: Path) -> int:
    total = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in [*dirnames, *filenames]:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def _run_tests(folder: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(
        [sys.executable, "-m", "unittest", "-q"],
        cwd=folder,
        env=env,
        capture_output=True,
        check=False,
    )


class Case:
    """One workspace (sealed starting layer + a source on it) in a scratch root."""

    def __init__(
        self, root: Path, blob_bytes: int, blob_in_base: bool = True, cache: bool = True
    ) -> None:
        self.ws = Workspaces(root / "store", cache=cache)
        self.root = root
        start = root / "start"
        start.mkdir()
        write_workspace(start, blob_bytes if blob_in_base else 0)
        t = time.perf_counter()
        self.base = self.ws.layers.import_tree(start)
        self.import_seconds = time.perf_counter() - t
        shutil.rmtree(start)
        self.blob_bytes = blob_bytes
        self.blob_in_base = blob_in_base
        self.rounds = 0

    def source(self) -> Path:
        """A fresh source workspace that ran the tests (and, maybe, wrote the blob)."""
        self.rounds += 1
        sid = f"src{self.rounds}"
        target = self.root / "mnt" / sid
        self.ws.attach(sid, target, self.base.digest)
        _run_tests(target)
        if not self.blob_in_base:
            with (target / BLOB).open("wb") as fh:
                for chunk in vendored_chunks(self.blob_bytes):
                    fh.write(chunk)
        return target

    def fork(self) -> tuple[float, int, int]:
        """Seconds until all children read the blob, children's disk, bytes hashed."""
        self.source()
        sid = f"src{self.rounds}"
        kids = [(f"{sid}-k{i}", self.root / "mnt" / f"{sid}-k{i}") for i in range(CHILDREN)]
        t = time.perf_counter()
        layer, infos = self.ws.fork(sid, kids)
        for info in infos:
            _touch_blob(Path(info.target))
        seconds = time.perf_counter() - t
        disk = sum(_disk(self.ws.root / info.id) for info in infos)
        for info in infos:
            self.ws.remove(info.id)
        self.ws.remove(sid)
        return seconds, disk, layer.hashed_bytes

    def copy(self) -> tuple[float, int]:
        src = self.source()
        sid = f"src{self.rounds}"
        dests = [self.root / "copies" / f"{sid}-c{i}" for i in range(CHILDREN)]
        t = time.perf_counter()
        for dest in dests:
            shutil.copytree(src, dest, symlinks=True)
            _touch_blob(dest)
        seconds = time.perf_counter() - t
        disk = sum(_disk(d) for d in dests)
        for dest in dests:
            shutil.rmtree(dest)
        self.ws.remove(sid)
        return seconds, disk


def _stats(runs: list[float]) -> str:
    """Median and fastest: on a loaded machine the two differ a lot."""
    return f"{statistics.median(runs) * 1000:8.1f} ms (fastest {min(runs) * 1000:.1f})"


def _lock_seconds(ws: Workspaces, holds: int = 2000) -> float:
    """Seconds to take and release the store's lock, shared, as a fork does (median of
    ten batches)."""
    batches = []
    for _ in range(10):
        t = time.perf_counter()
        for _ in range(holds // 10):
            with ws.layers.lock.hold():
                pass
        batches.append((time.perf_counter() - t) / (holds // 10))
    return statistics.median(batches)


def _sandbox_fork(root: Path, blob_bytes: int, repeat: int) -> float:
    backend = LocalSandboxBackend(root / "sandboxes")
    start = root / "sbstart"
    start.mkdir()
    write_workspace(start, blob_bytes)
    base = backend.import_workspace(start)
    snapshot = backend.prepare_snapshot(bundle_files("coding-fix"))
    times = []
    for _ in range(repeat):
        source = backend.create(snapshot.id, {"bench": "source"}, Limits())
        backend.attach_workspace(source, base.digest)
        _run_tests(root / "sandboxes" / "boxes" / source / "workspace")
        fork = backend.fork(source, [{"bench": f"child{i}"} for i in range(CHILDREN)])
        times.append(fork.seconds)
        for child in fork.children:
            backend.delete(child.id)
        backend.delete(source)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blob-mib", type=int, default=50)
    parser.add_argument("--big-gib", type=float, default=1.0, help="0 skips the big case")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--big-copy", action="store_true", help="also copy the big workspace 3 times (slow)"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("overlay mounts need root; run as root (the fallback copies instead)")
    root = Path(tempfile.mkdtemp(prefix="forklab-bench-ws-"))
    try:
        print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        small = Case(root / "small", args.blob_mib * MIB)
        big = Case(root / "big", int(args.big_gib * 1024) * MIB) if args.big_gib > 0 else None
        written = Case(root / "written", args.blob_mib * MIB, blob_in_base=False)
        uncached = Case(root / "uncached", args.blob_mib * MIB, cache=False)
        # One round = every variant once, so that the machine's load hits them alike.
        fork_s, copy_s, big_s, written_s, uncached_s = [], [], [], [], []
        fork_disk = copy_disk = big_disk = hashed = written_hashed = 0
        for _ in range(args.repeat):
            seconds, fork_disk, hashed = small.fork()
            fork_s.append(seconds)
            seconds, copy_disk = small.copy()
            copy_s.append(seconds)
            if big is not None:
                seconds, big_disk, _ = big.fork()
                big_s.append(seconds)
            seconds, _, written_hashed = written.fork()
            written_s.append(seconds)
            uncached_s.append(uncached.fork()[0])
        files = len(package_files("sub", DEMO_CASES))
        print(
            f"workspace: {args.blob_mib} MiB blob + {files} source files; {CHILDREN} children; "
            f"{args.repeat} rounds"
        )
        print(
            f"  sealing the starting layer (once):          {small.import_seconds * 1000:8.1f} ms"
        )
        print(f"  fork (freeze + {CHILDREN} overlays, blob read):   {_stats(fork_s)}")
        print(f"    bytes hashed by the freeze (what the source wrote): {hashed}")
        print(f"  the same fork without the layer cache:       {_stats(uncached_s)}")
        lock = _lock_seconds(small.ws)
        share = lock / statistics.median(fork_s) * 100
        print(f"  the store lock, once per fork: {lock * 1e6:8.1f} us = {share:.3f}% of a fork")
        print(f"  plain recursive copy x{CHILDREN}, blob read:     {_stats(copy_s)}")
        ratio = statistics.median(copy_s) / statistics.median(fork_s)
        print(f"  copy / fork (medians): {ratio:.1f}x")
        print(
            f"  children's disk right after: fork {fork_disk / 1024:.0f} KiB (their folders), "
            f"copies {copy_disk / MIB:.1f} MiB"
        )
        print(
            f"  fork when the source wrote the blob itself since its last freeze: "
            f"{_stats(written_s)}, hashed {written_hashed / MIB:.1f} MiB"
        )
        if big is not None:
            print(f"workspace: {args.big_gib:g} GiB blob, same rounds")
            print(
                f"  sealing the starting layer (once):          {big.import_seconds * 1000:8.1f} ms"
            )
            print(f"  fork (freeze + {CHILDREN} overlays, blob read):   {_stats(big_s)}")
            grow = statistics.median(big_s) / statistics.median(fork_s)
            print(f"  fork {args.big_gib:g} GiB / fork {args.blob_mib} MiB (medians): {grow:.2f}x")
            print(f"  children's disk right after: fork {big_disk / 1024:.0f} KiB")
            if args.big_copy:
                seconds, _ = big.copy()
                print(
                    f"  plain recursive copy x{CHILDREN} (one run):      {seconds * 1000:8.1f} ms"
                )
        sb = _sandbox_fork(root / "sb", args.blob_mib * MIB, args.repeat)
        print(
            f"whole sandbox fork (3 new sandboxes + their workspaces), median: {sb * 1000:.1f} ms"
        )
        print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
