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
  entries written with fsync, and the workspaces).
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
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from activities.coding_agent import BLOB, write_workspace
from activities.sandbox.base import Limits
from activities.sandbox.local import LocalSandboxBackend
from activities.sandbox.workspace import Workspaces, unmount_under
from experiments.bundle import bundle_files

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

    def __init__(self, root: Path, blob_bytes: int, blob_in_base: bool = True) -> None:
        self.ws = Workspaces(root / "store")
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
            from experiments.workloads.coding_fix import vendored_chunks

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


def _median(fn: Callable[[], tuple[float, ...]], repeat: int) -> tuple[float, ...]:
    runs = [fn() for _ in range(repeat)]
    return tuple(statistics.median(col) for col in zip(*runs, strict=True))


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
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("overlay mounts need root; run as root (the fallback copies instead)")
    root = Path(tempfile.mkdtemp(prefix="forklab-bench-ws-"))
    try:
        small = Case(root / "small", args.blob_mib * MIB)
        fork_s, fork_disk, hashed = _median(small.fork, args.repeat)
        copy_s, copy_disk = _median(small.copy, args.repeat)
        print(
            f"workspace: {args.blob_mib} MiB blob + {len(list(bundle_files('coding-fix')))} "
            f"runner files; {CHILDREN} children; median of {args.repeat}"
        )
        print(f"  sealing the starting layer (once): {small.import_seconds * 1000:8.1f} ms")
        print(
            f"  fork (freeze + {CHILDREN} overlays, blob read): {fork_s * 1000:8.1f} ms  "
            f"(hashed {hashed:.0f} bytes written since the last freeze)"
        )
        print(f"  plain recursive copy ×{CHILDREN}:            {copy_s * 1000:8.1f} ms")
        print(f"  ratio copy / fork:                      {copy_s / fork_s:8.1f}×")
        print(
            f"  children's disk right after: fork {fork_disk / 1024:.0f} KiB, "
            f"copies {copy_disk / MIB:.1f} MiB"
        )
        written = Case(root / "written", args.blob_mib * MIB, blob_in_base=False)
        w_s, _, w_hashed = _median(written.fork, args.repeat)
        print(
            f"  fork when the source wrote the blob since its last freeze: {w_s * 1000:.1f} ms "
            f"(hashed {w_hashed / MIB:.1f} MiB)"
        )
        sb = _sandbox_fork(root / "sb", args.blob_mib * MIB, args.repeat)
        print(f"  whole sandbox fork (3 new sandboxes + workspaces): {sb * 1000:.1f} ms")
        del small, written
        if args.big_gib > 0:
            big_bytes = int(args.big_gib * 1024) * MIB
            big = Case(root / "big", big_bytes)
            b_s, b_disk, _ = _median(big.fork, args.repeat)
            c_s, _ = _median(big.copy, 1) if args.big_gib <= 1 else (float("nan"), 0)
            print(f"workspace: {args.big_gib:g} GiB blob")
            print(f"  sealing the starting layer (once): {big.import_seconds * 1000:8.1f} ms")
            print(
                f"  fork (freeze + {CHILDREN} overlays, blob read): {b_s * 1000:8.1f} ms  "
                f"(vs {fork_s * 1000:.1f} ms at {args.blob_mib} MiB: ×{b_s / fork_s:.2f})"
            )
            print(f"  plain recursive copy ×{CHILDREN} (one run):  {c_s * 1000:8.1f} ms")
            print(f"  children's disk right after: fork {b_disk / 1024:.0f} KiB")
    finally:
        unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
