"""What one experiment leaves in the shared stores: bytes in the artifact store (an S3
bucket, a moto server here) and rows in the PostgreSQL ledger.

Runs the retry-cascade experiment through the real durable flow (`forklab demo --yes`:
dev server, worker, rehearsal, approval, sandboxes, analysis, ledger) at two episode
counts, each into its own bucket prefix, and prints per run the objects and bytes stored,
the bytes per episode, the marginal bytes per extra episode (the difference of the two
runs, which cancels the fixed part: the snapshot bundle, the reports) and the ledger rows.

    .venv/bin/python bench/store_sizes.py            # needs PostgreSQL on 127.0.0.1:5432
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
import psycopg
import yaml

ROOT = Path(__file__).resolve().parent.parent
FORKLAB = str(Path(sys.executable).parent / "forklab")
EPISODES = (160, 640)
ADMIN = "postgresql://root@127.0.0.1:5432/postgres"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench-secret",
    "AWS_REGION": "us-east-1",
}


def s3(endpoint: str) -> Any:
    return boto3.session.Session(
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=CREDENTIALS["AWS_REGION"],
    ).client("s3", endpoint_url=endpoint)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(
    work: Path, endpoint: str, bucket: str, database: str, episodes: int
) -> tuple[str, int, int]:
    """Run one experiment of ``episodes`` episodes; return its id, objects and bytes."""
    spec = yaml.safe_load((ROOT / "forklab" / "workloads" / "retry-cascade.yaml").read_text())
    spec["episodes"] = episodes
    spec_file = work / f"spec-{episodes}.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    prefix = f"run-{episodes}"
    env = {
        **os.environ,
        **CREDENTIALS,
        "FORKLAB_HOME": str(work / f"home-{episodes}"),
        "FORKLAB_ADDRESS": f"127.0.0.1:{free_port()}",
        "FORKLAB_UI_PORT": str(free_port()),
        "FORKLAB_ARTIFACTS": f"s3://{bucket}/{prefix}",
        "FORKLAB_S3_ENDPOINT": endpoint,
        "FORKLAB_LEDGER": database,
    }
    done = subprocess.run(
        [FORKLAB, "demo", "--yes", "--spec", str(spec_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"the experiment of {episodes} episodes failed:\n{done.stdout}\n{done.stderr}")
    found = re.search(r"started experiment (\S+)", done.stdout)
    assert found, done.stdout
    client = s3(endpoint)
    objects = total = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            objects += 1
            total += obj["Size"]
    return found.group(1), objects, total


def main() -> None:
    port = free_port()
    moto = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    name = f"forklab_bench_{uuid.uuid4().hex[:8]}"
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "the moto server did not start"
            time.sleep(0.2)
        bucket = "forklab-bench"
        s3(endpoint).create_bucket(Bucket=bucket)
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}".encode())
        database = f"postgresql://root@127.0.0.1:5432/{name}"
        runs = []
        with tempfile.TemporaryDirectory(prefix="forklab-sizes-") as tmp:
            for episodes in EPISODES:
                runs.append((episodes, *measure(Path(tmp), endpoint, bucket, database, episodes)))
        print("episodes  objects      bytes  bytes/episode  ledger rows (experiment + worlds)")
        with psycopg.connect(database) as conn:
            for episodes, experiment, objects, total in runs:
                roots = conn.execute(
                    "SELECT count(*) FROM ledger_experiments WHERE experiment_id = %s",
                    (experiment,),
                ).fetchone()
                worlds = conn.execute(
                    "SELECT count(*) FROM ledger_worlds WHERE experiment_id = %s", (experiment,)
                ).fetchone()
                assert roots is not None and worlds is not None
                rows = f"{roots[0] + worlds[0]} ({roots[0]} + {worlds[0]})"
                print(f"{episodes:8d}  {objects:7d}  {total:9d}  {total / episodes:13.0f}  {rows}")
        (small, _, _, b_small), (large, _, _, b_large) = runs
        marginal = (b_large - b_small) / (large - small)
        print(f"marginal bytes per extra episode ({small} -> {large}): {marginal:.0f}")
    finally:
        moto.kill()
        moto.wait()
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)".encode())


if __name__ == "__main__":
    main()
