"""The cold ``make demo``: a fresh clone with no ``.venv`` to the demo's last line, for a
baseline commit and this one in the same run (round robin, ``--repeat`` rounds), and the
size of the virtual environment each builds.

"Cold" is a fresh clone and a new ``.venv``; pip reads its usual configuration, so where
that names a local wheel folder or index (this machine's ``PIP_FIND_LINKS`` and
``file://`` indexes) nothing is downloaded: the figure is pip's resolving, unpacking and
installing, the demo's start and its run. Wall seconds are printed with CPU seconds (the
children's user + system time): on a shared machine the CPU figure is the steadier one.

    python bench/install.py [--baseline COMMIT] [--repeat 1]

Each clone runs the demo with its own ``FORKLAB_HOME`` and the ports of the environment
(``FORKLAB_ADDRESS``, ``FORKLAB_UI_PORT``, …): set them to free ones on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def cold_demo(commit: str, scratch: Path) -> dict[str, float | int | str]:
    """Clone ``commit``, run ``make demo`` there; its wall and CPU seconds, venv size."""
    clone = scratch / commit[:12]
    shutil.rmtree(clone, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
    env = {**os.environ, "FORKLAB_HOME": str(clone / "home")}
    load = os.getloadavg()[0]
    cpu, wall = _cpu(), time.monotonic()
    done = subprocess.run(["make", "demo"], cwd=clone, env=env, capture_output=True, text=True)
    wall, cpu = time.monotonic() - wall, _cpu() - cpu
    if done.returncode != 0:
        sys.exit(f"make demo failed at {commit}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    python = clone / ".venv" / "bin" / "python"
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "freeze"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {
        "commit": commit[:12],
        "load": round(load, 1),
        "wall": round(wall, 1),
        "cpu": round(cpu, 1),
        "venv_mib": round(_bytes(clone / ".venv") / 2**20),
        "packages": len(listed.stdout.splitlines()),
        "stdout_lines": len(done.stdout.splitlines()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="558f59c", help="the commit to compare with")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory(prefix="forklab-install-bench-") as tmp:
        for _ in range(args.repeat):
            for commit in (args.baseline, head):
                rows.append(cold_demo(commit, Path(tmp)))
                print(rows[-1], flush=True)
    base = [r for r in rows if r["commit"] == args.baseline[:12]]
    new = [r for r in rows if r["commit"] == head[:12]]
    for key in ("wall", "cpu", "venv_mib", "packages"):
        b = min(float(r[key]) for r in base)
        n = min(float(r[key]) for r in new)
        print(f"{key:<9} baseline {b:>8g}  this {n:>8g}  ratio {n / b:.2f}")


if __name__ == "__main__":
    main()
