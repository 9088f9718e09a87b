"""How long ``forklab --help`` and ``forklab status`` take to answer, against Python's own start.

Each command runs ``--runs`` times (default 5) as a fresh process of this virtual
environment's ``forklab``, interleaved with the baseline ``python -c pass`` from the same
interpreter, so load that comes and goes falls on all three alike. ``status`` runs twice:
with an experiment id against an address where nothing listens (it must say so at once,
before Temporal's SDK loads), and with no id (the local services under a scratch home).
Printed: each command's median and range in seconds, and the median's ratio to the
baseline's, with the load average before and after. Results: docs/benchmarks/cli-startup.md.

    .venv/bin/python bench/cli_startup.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
#: The goal (issue 32 point 4): each command's median, in seconds.
GOAL_SECONDS = 0.6


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    forklab = str(BIN / "forklab")
    with tempfile.TemporaryDirectory() as home:
        env = {
            **os.environ,
            "FORKLAB_HOME": home,
            "FORKLAB_ADDRESS": f"127.0.0.1:{free_port()}",
        }
        cases = {
            "python -c pass (baseline)": [sys.executable, "-c", "pass"],
            "forklab --help": [forklab, "--help"],
            "forklab status EXP (no server)": [forklab, "status", "no-such-experiment"],
            "forklab status (services)": [forklab, "status"],
        }
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"cores: {os.cpu_count()}; python {sys.version.split()[0]}; runs: {args.runs}")
        times: dict[str, list[float]] = {name: [] for name in cases}
        timed(cases["forklab --help"], env)  # warm the file cache once, untimed
        for _ in range(args.runs):
            for name, argv in cases.items():
                times[name].append(timed(argv, env))
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    base = statistics.median(times["python -c pass (baseline)"])
    print(f"\n{'command':<32} {'median s':>9} {'min-max s':>13} {'x baseline':>11}  goal")
    for name, values in times.items():
        median = statistics.median(values)
        goal = "" if name.startswith("python") else ("ok" if median <= GOAL_SECONDS else "MISS")
        print(
            f"{name:<32} {median:9.3f} {min(values):6.3f}-{max(values):<6.3f} "
            f"{median / base:11.2f}  {goal}"
        )


if __name__ == "__main__":
    main()
