"""Hostile code in a local sandbox: every attack here must fail, measured on real processes.

Each test plays the attacker inside a bubblewrap box (escape the folder, read the home's
tokens, poison the snapshot, fork-bomb, leave a detached child, fill the disk) and checks
on the host that nothing happened. Where bubblewrap cannot run on a host, the tests skip
and say so (the fallback is covered in test_local_sandbox.py).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from forklab.activities.experiment.runner_bundle import bundle_files
from forklab.activities.sandbox import (
    ExecResult,
    Limits,
    LocalSandboxBackend,
    SnapshotCorruptedError,
    SnapshotInfo,
)
from forklab.activities.sandbox.jail import bubblewrap, process_allowance
from tests.sandbox_lab import marked_sleeper, pids_running, run_python, wait_for

LABELS = {"forklab.experiment": "attack", "forklab.world": "hostile", "forklab.batch": "0"}

pytestmark = pytest.mark.skipif(
    bubblewrap()[0] is None, reason=f"bubblewrap cannot run here: {bubblewrap()[1]}"
)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A FORKLAB_HOME with the secrets an attacker wants: a token and a signing key."""
    home = tmp_path / "home"
    (home / "tokens").mkdir(parents=True)
    (home / "tokens" / "victim.token").write_text("s3cret-token\n")
    (home / "keys").mkdir()
    (home / "keys" / "victim.key").write_text("PRIVATE KEY\n")
    return home


@pytest.fixture
def backend(home: Path) -> LocalSandboxBackend:
    return LocalSandboxBackend(home / "sandboxes")


@pytest.fixture
def snapshot(backend: LocalSandboxBackend) -> SnapshotInfo:
    return backend.prepare_snapshot(bundle_files("counter-recovery"))


def hostile(backend: LocalSandboxBackend, box: str, code: str, timeout: float = 60) -> ExecResult:
    """``code`` run in the box, which must really be a bubblewrap box."""
    result = run_python(backend, box, code, timeout)
    assert result.confinement == "bubblewrap", result.note
    return result


def test_writes_outside_the_box_fail_and_leave_nothing_on_the_host(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo, home: Path, tmp_path: Path
) -> None:
    box = backend.create(snapshot.id, LABELS, Limits())
    targets = [
        "/tmp/escaped",
        str(tmp_path / "escaped"),
        str(home / "escaped"),
        str(home / "tokens" / "victim.token"),
        "/code/forklab/runtime/runner.py",
        "/code/forklab/poison.py",
        "/usr/escaped",
        "../escaped",
    ]
    result = hostile(
        backend,
        box,
        f"""
        import json
        outcome = {{}}
        for path in {targets!r}:
            try:
                with open(path, "a") as fh:
                    fh.write("pwned")
                outcome[path] = "written"
            except OSError as exc:
                outcome[path] = type(exc).__name__
        print(json.dumps(outcome))
        """,
    )
    outcome = json.loads(result.stdout)
    assert "written" not in outcome.values(), outcome
    assert not Path("/tmp/escaped").exists() or "pwned" not in Path("/tmp/escaped").read_text()
    assert not (tmp_path / "escaped").exists() and not (home / "escaped").exists()
    assert (home / "tokens" / "victim.token").read_text() == "s3cret-token\n"
    backend.prepare_snapshot(bundle_files("counter-recovery"))  # still intact: no repair needed
    backend.create(snapshot.id, LABELS, Limits())


def test_the_home_its_tokens_and_keys_are_invisible(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo, home: Path
) -> None:
    box = backend.create(snapshot.id, LABELS, Limits())
    secrets = [
        str(home / "tokens" / "victim.token"),
        str(home / "keys" / "victim.key"),
        "../../tokens/victim.token",
        "../../../tokens/victim.token",
        "/root/.forklab/ledger.sqlite",
        "/etc/shadow",
        "/proc/1/environ",
    ]
    result = hostile(
        backend,
        box,
        f"""
        import json, os, sys
        read = {{}}
        for path in {secrets!r}:
            try:
                read[path] = open(path).read()
            except OSError as exc:
                read[path] = None
        walk = [os.path.join(d, f) for d, _, files in os.walk("/")
                if not d.startswith(("/proc", "/usr", "/sys", sys.base_prefix))
                for f in files if f.endswith((".token", ".key", ".sqlite"))]
        env = dict(os.environ)
        print(json.dumps({{"read": read, "walk": walk, "uid": os.getuid(), "env": env}}))
        """,
    )
    seen = json.loads(result.stdout)
    leaked = {path: text for path, text in seen["read"].items() if text}
    assert not leaked, leaked
    assert seen["walk"] == []
    assert not [k for k in seen["env"] if k.startswith("FORKLAB")]
    assert "s3cret-token" not in result.stdout + result.stderr


def test_a_poisoned_snapshot_is_refused_then_rebuilt(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo
) -> None:
    folder = backend.root / "snapshots" / snapshot.code_digest
    runner = folder / "forklab" / "runtime" / "runner.py"
    assert runner.stat().st_mode & 0o222 == 0, "snapshot files are read-only on disk"
    box = backend.create(snapshot.id, LABELS, Limits())
    # Someone with the host's rights (not a sandbox: it cannot) appends to the runner.
    runner.chmod(0o644)
    runner.write_text(runner.read_text() + "\nPOISON = True\n")
    with pytest.raises(SnapshotCorruptedError, match="modified after it was made"):
        backend.exec(box, ["python", "-c", "pass"], 10)
    with pytest.raises(SnapshotCorruptedError):
        backend.create(snapshot.id, LABELS, Limits())
    # An added file is tampering too.
    again = backend.prepare_snapshot(bundle_files("counter-recovery"))
    assert again == snapshot and "POISON" not in runner.read_text()
    (folder / "forklab").chmod(0o755)
    (folder / "forklab" / "extra.py").write_text("x = 1\n")
    with pytest.raises(SnapshotCorruptedError):
        backend.create(snapshot.id, LABELS, Limits())
    backend.prepare_snapshot(bundle_files("counter-recovery"))
    fresh = backend.create(snapshot.id, LABELS, Limits())
    assert hostile(backend, fresh, "import forklab.runtime.runner").exit_code == 0


def test_a_fork_bomb_hits_the_process_limit(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo
) -> None:
    box = backend.create(snapshot.id, LABELS, Limits(processes=16))
    result = hostile(
        backend,
        box,
        """
        import os, time
        started, refused = 0, 0
        for _ in range(200):
            try:
                pid = os.fork()
            except OSError:
                refused += 1
                continue
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            started += 1
        print(started, refused)
        """,
        timeout=60,
    )
    started, refused = map(int, result.stdout.split())
    assert started < 16 and refused > 150, (started, refused)


def test_a_box_keeping_the_workers_uid_has_room_beyond_the_users_threads() -> None:
    """``RLIMIT_NPROC`` counts a user's threads, not its processes: a box that keeps the
    worker's uid (no uid of its own: a worker not run as root, or no bubblewrap) is allowed
    the user's tasks now plus its limit, so a worker with many threads still leaves it
    room to fork; a box with a uid of its own gets its limit alone."""
    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait, daemon=True) for _ in range(150)]
    for t in threads:
        t.start()
    try:
        assert process_allowance(16, None) >= 150 + 16
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert process_allowance(16, 60_000) == 16


def test_a_detached_setsid_child_dies_with_its_sandbox(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo
) -> None:
    marker, sleeper = marked_sleeper("detached")
    box = backend.create(snapshot.id, LABELS, Limits())
    result = hostile(
        backend,
        box,
        f"""
        import os, subprocess, sys
        subprocess.Popen({sleeper},
                         start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.fork() or (os.setsid(), __import__("time").sleep(300))
        print("parent leaves")
        """,
    )
    assert "parent leaves" in result.stdout
    wait_for(lambda: not pids_running(marker), 10)


def test_file_size_and_scratch_writes_are_bounded(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo
) -> None:
    box = backend.create(snapshot.id, LABELS, Limits(file_mb=1))
    result = hostile(
        backend,
        box,
        """
        try:
            with open("big", "wb") as fh:
                fh.write(b"x" * (4 * 1024 * 1024))
            print("wrote")
        except OSError as exc:
            print("refused", exc.strerror)
        """,
    )
    assert "refused File too large" in result.stdout, result.stdout + result.stderr
    assert (backend.root / "boxes" / box / "big").stat().st_size <= 1024 * 1024
