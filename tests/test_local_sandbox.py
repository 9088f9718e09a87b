"""The local sandbox backend, exercised with real processes: life cycle, labels, crash
recovery, network isolation, resource limits, timeouts, and runner parity with the twin."""

from __future__ import annotations

import json
import os
import py_compile
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from forklab.activities.experiment.runner_bundle import bundle_files, code_digest
from forklab.activities.sandbox import (
    ExecResult,
    Limits,
    LocalSandboxBackend,
    SandboxError,
    SandboxNotFoundError,
    SnapshotInfo,
)
from forklab.experiments.experiment.bundle import BundleFile
from forklab.experiments.experiment.spec import parse_spec, resolve_workload
from forklab.experiments.experiment.worlds import spec_world_plans
from forklab.runtime.canon import canonical_json
from forklab.runtime.file_format import checkpoint_line, parse_world_outputs, request_text
from forklab.runtime.runner import continue_checkpoints, run_prefix
from tests.helpers import ROOT
from tests.sandbox_lab import (
    marked_sleeper,
    pids_running,
    process_gone,
    run_python,
    wait_for,
    without_sys_admin,
)

LABELS = {"forklab.experiment": "exp-1", "forklab.world": "baseline", "forklab.batch": "0"}


@pytest.fixture
def backend(tmp_path: Path) -> LocalSandboxBackend:
    return LocalSandboxBackend(tmp_path / "sandboxes")


@pytest.fixture
def snapshot(backend: LocalSandboxBackend) -> SnapshotInfo:
    return backend.prepare_snapshot(bundle_files("counter-recovery"))


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP server listening on 127.0.0.1 in the test's (the host's) network namespace."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def connect_snippet(port: int) -> str:
    return f"""
        import socket, sys
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
        except OSError as exc:
            print("connect failed:", exc)
            sys.exit(3)
        print("connected")
    """


# --- life cycle ---------------------------------------------------------------------------
def test_snapshot_is_prepared_once_and_named_by_the_code_digest(
    backend: LocalSandboxBackend,
) -> None:
    files = bundle_files("counter-recovery")
    first = backend.prepare_snapshot(files)
    again = backend.prepare_snapshot(files)
    assert first == again
    assert first.id == "local:" + code_digest(files) == "local:" + first.code_digest
    assert (first.backend, first.files) == ("local", len(files))
    folder = backend.root / "snapshots" / first.code_digest
    stored = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert stored == sorted(f.relpath for f in files)
    assert not [p for p in (backend.root / "snapshots").iterdir() if p.name.startswith(".")]


def test_create_upload_exec_download_delete(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo
) -> None:
    box = backend.create(snapshot.id, LABELS, Limits())
    folder = backend.root / "boxes" / box
    assert list(folder.iterdir()) == [], "a box starts as an empty scratch folder"

    backend.upload(box, "inputs/words.txt", b"fork the world")
    result = run_python(
        backend,
        box,
        """
        import pathlib
        text = pathlib.Path("inputs/words.txt").read_text()
        pathlib.Path("out.txt").write_text(text.upper())
        print("wrote", len(text))
        """,
    )
    assert (result.exit_code, result.timed_out, result.stdout) == (0, False, "wrote 14\n")
    assert 0 < result.seconds < 30
    assert backend.download(box, "out.txt") == b"FORK THE WORLD"

    backend.delete(box)
    assert not folder.exists()
    assert not (backend.root / "registry" / f"{box}.json").exists()
    with pytest.raises(SandboxNotFoundError):
        backend.download(box, "out.txt")
    with pytest.raises(SandboxNotFoundError):
        backend.exec(box, ["python", "-c", "pass"], 5)


def test_each_sandbox_gets_a_fresh_folder(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo
) -> None:
    first = backend.create(snapshot.id, LABELS, Limits())
    backend.upload(first, "forklab/runtime/runner.py", b"# written by a world")
    second = backend.create(snapshot.id, LABELS, Limits())
    assert list((backend.root / "boxes" / second).iterdir()) == []
    code = "import forklab.runtime.runner as r; print(open(r.__file__).read()[:20])"
    result = run_python(backend, second, code)
    assert result.stdout == (ROOT / "forklab/runtime/runner.py").read_text()[:20] + "\n"


def test_bad_requests_say_what_is_wrong(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo
) -> None:
    with pytest.raises(SandboxError, match="call prepare_snapshot"):
        backend.create("local:" + "0" * 64, LABELS, Limits())
    with pytest.raises(SandboxError, match="not a local snapshot"):
        backend.create("daytona:abc", LABELS, Limits())
    box = backend.create(snapshot.id, LABELS, Limits())
    with pytest.raises(SandboxError, match=r"without '\.\.'"):
        backend.upload(box, "../escape.txt", b"x")
    with pytest.raises(SandboxError, match=r"has no file 'missing\.json'"):
        backend.download(box, "missing.json")
    with pytest.raises(SandboxError, match="argv is empty"):
        backend.exec(box, [], 5)
    missing = backend.exec(box, ["no-such-program-here"], 5)
    assert missing.exit_code == 127 and "cannot start" in missing.stderr


# --- labels, deletion, crash recovery ------------------------------------------------------
def test_list_by_labels(backend: LocalSandboxBackend, snapshot: SnapshotInfo) -> None:
    a0 = backend.create(snapshot.id, LABELS, Limits())
    a1 = backend.create(snapshot.id, {**LABELS, "forklab.world": "jitter"}, Limits())
    b0 = backend.create(snapshot.id, {**LABELS, "forklab.experiment": "exp-2"}, Limits())
    assert backend.list({"forklab.experiment": "exp-1"}) == sorted([a0, a1])
    assert backend.list({"forklab.experiment": "exp-1", "forklab.world": "jitter"}) == [a1]
    assert backend.list({"forklab.experiment": "exp-2"}) == [b0]
    assert backend.list({"forklab.experiment": "exp-3"}) == []
    assert backend.list({}) == sorted([a0, a1, b0])


def test_delete_is_idempotent(backend: LocalSandboxBackend, snapshot: SnapshotInfo) -> None:
    box = backend.create(snapshot.id, LABELS, Limits())
    backend.delete(box)
    backend.delete(box)
    backend.delete("lsb-0123456789abcdef")  # never existed
    assert backend.list({}) == []


def test_leftovers_the_registry_cannot_vouch_for_are_listed_and_removed(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo
) -> None:
    # A folder without a registry entry, and an entry without its folder.
    stray = backend.root / "boxes" / "lsb-00000000000000aa"
    (stray / "forklab").mkdir(parents=True)
    half = backend.create(snapshot.id, LABELS, Limits())
    shutil.rmtree(backend.root / "boxes" / half)
    assert backend.list({"forklab.experiment": "exp-1"}) == sorted([stray.name, half])
    for box in backend.list({"forklab.experiment": "exp-1"}):
        backend.delete(box)
    assert backend.list({}) == []
    assert not stray.exists()


HOST = """
import sys
from pathlib import Path
from forklab.activities.sandbox import Limits, LocalSandboxBackend
backend = LocalSandboxBackend(Path(sys.argv[1]))
snapshot_id = sys.argv[2]
box = backend.create(snapshot_id, {"forklab.experiment": "crash"}, Limits())
print(box, flush=True)
code = "import time; open('up', 'w'); time.sleep(300)  # " + sys.argv[3]
backend.exec(box, ["python", "-c", code], 600)
"""


def test_crash_recovery_no_sandbox_outlives_its_dead_worker_and_cleanup_finds_it(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo
) -> None:
    marker = f"crash-{time.monotonic_ns()}"
    host = subprocess.Popen(
        [sys.executable, "-c", HOST, str(backend.root), snapshot.id, marker],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert host.stdout is not None
        box = host.stdout.readline().strip()
        wait_for(lambda: (backend.root / "boxes" / box / "up").exists())
        registry = backend.root / "registry" / f"{box}.json"
        wait_for(lambda: json.loads(registry.read_text())["pid"] is not None)
        running = pids_running(marker)
        assert running, "the sandboxed command should be running"
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait()
    # bubblewrap's --die-with-parent and its PID namespace end the command with the worker.
    wait_for(lambda: all(process_gone(pid) for pid in running), 10)

    recovered = LocalSandboxBackend(backend.root)
    assert recovered.list({"forklab.experiment": "crash"}) == [box]
    recovered.delete(box)
    assert recovered.list({}) == []
    assert list((backend.root / "boxes").iterdir()) == []
    assert list((backend.root / "registry").iterdir()) == []


def test_delete_during_exec_kills_the_command_and_leaves_nothing(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo
) -> None:
    box = backend.create(snapshot.id, LABELS, Limits())
    results: list[ExecResult] = []
    worker = threading.Thread(
        target=lambda: results.append(
            run_python(backend, box, "import time; open('up', 'w'); time.sleep(300)", 120)
        )
    )
    worker.start()
    wait_for(lambda: (backend.root / "boxes" / box / "up").exists())
    backend.delete(box)
    worker.join(10)
    assert not worker.is_alive()
    assert results[0].exit_code == -signal.SIGKILL and not results[0].timed_out
    assert backend.list({}) == []


# --- confinement ----------------------------------------------------------------------------
def test_python_sees_only_the_bundle_and_a_clean_environment(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORKLAB_TEST_SECRET", "do-not-leak")
    box = backend.create(snapshot.id, LABELS, Limits())
    result = run_python(
        backend,
        box,
        """
        import json, os
        import forklab.runtime.runner as runner
        try:
            import pydantic
            pydantic_found = True
        except ImportError:
            pydantic_found = False
        print(json.dumps({"file": runner.__file__, "env": dict(os.environ),
                          "pydantic": pydantic_found}))
        """,
    )
    assert result.exit_code == 0, result.stderr
    seen = json.loads(result.stdout)
    assert result.confinement == "bubblewrap", result.note
    assert seen["file"] == "/code/forklab/runtime/runner.py"
    assert seen["pydantic"] is False, "site-packages must not be importable in a sandbox"
    assert "FORKLAB_TEST_SECRET" not in seen["env"]
    assert seen["env"]["PYTHONPATH"] == "/code"


def namespaces_permitted() -> bool:
    """Can an unprivileged process of this host make a user + network namespace? Asked of
    the kernel directly (``unshare``), independently of the sandbox under test."""
    probe = (  # unshare(CLONE_NEWUSER | CLONE_NEWNET) through libc (os.unshare is 3.12+)
        "import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "
        "sys.exit(0 if libc.unshare(0x10000000 | 0x40000000) == 0 else 1)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=30)
    return done.returncode == 0


def test_no_network_inside_the_sandbox(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo, listener: int
) -> None:
    # The same connection succeeds from an unconfined process: the listener is reachable.
    outside = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(connect_snippet(listener))],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert outside.returncode == 0, outside.stdout
    box = backend.create(snapshot.id, LABELS, Limits())
    result = run_python(backend, box, connect_snippet(listener))
    if not result.network_isolated:
        why = f"the sandbox ran without a private network namespace: {result.note}"
        if os.environ.get("CI") or namespaces_permitted():
            pytest.fail(why)  # the host allows them: falling back would be a regression
        pytest.skip(f"private network namespaces are not permitted here ({why})")
    assert result.note is None and result.confinement == "bubblewrap"
    assert result.exit_code == 3, result.stdout + result.stderr
    assert "connect failed" in result.stdout


FALLBACK_HOST = """
import sys, textwrap
from pathlib import Path
from forklab.activities.sandbox import Limits, LocalSandboxBackend
backend = LocalSandboxBackend(Path(sys.argv[1]))
box = backend.create(sys.argv[2], {}, Limits())
result = backend.exec(box, ["python", "-c", textwrap.dedent(sys.argv[3])], 30)
print(result.model_dump_json())
"""


def test_without_permission_for_a_network_namespace_it_falls_back_and_says_so(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo, listener: int
) -> None:
    host = without_sys_admin(
        FALLBACK_HOST, str(backend.root), snapshot.id, connect_snippet(listener)
    )
    assert host.returncode == 0, host.stderr
    result = ExecResult.model_validate_json(host.stdout)
    assert result.network_isolated is False and result.confinement == "process"
    assert result.note is not None and "not permitted" in result.note
    assert "bubblewrap unavailable" in result.note and "setsid()" in result.note
    assert (result.exit_code, result.stdout) == (0, "connected\n")


def test_memory_limit(backend: LocalSandboxBackend, snapshot: SnapshotInfo) -> None:
    box = backend.create(snapshot.id, LABELS, Limits(memory_mb=256))
    small = run_python(backend, box, "b = bytearray(64 * 1024 * 1024); print(len(b))")
    assert small.exit_code == 0, small.stderr
    big = run_python(backend, box, "b = bytearray(512 * 1024 * 1024); print(len(b))")
    assert big.exit_code != 0
    assert "MemoryError" in big.stderr


def test_cpu_time_and_open_file_limits(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo
) -> None:
    box = backend.create(snapshot.id, LABELS, Limits(cpu_seconds=1, open_files=16))
    files = run_python(backend, box, "handles = [open('f%d' % i, 'w') for i in range(64)]")
    assert files.exit_code != 0 and "Too many open files" in files.stderr
    spin = run_python(backend, box, "while True: pass", timeout=30)
    assert spin.exit_code in (-signal.SIGXCPU, -signal.SIGKILL)
    assert not spin.timed_out and spin.seconds < 15


def test_wall_timeout_kills_the_whole_process_group(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo
) -> None:
    marker, sleeper = marked_sleeper("wall")
    box = backend.create(snapshot.id, LABELS, Limits())
    result = run_python(
        backend,
        box,
        f"""
        import subprocess, sys, time
        child = subprocess.Popen({sleeper})
        open("child", "w").write(str(child.pid))
        while True:
            time.sleep(0.05)
        """,
        timeout=1.0,
    )
    assert result.timed_out and result.exit_code == -signal.SIGKILL
    assert 1.0 <= result.seconds < 10
    assert backend.download(box, "child")
    wait_for(lambda: not pids_running(marker), 5)


def test_wall_limit_of_the_sandbox_caps_the_timeout(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo
) -> None:
    box = backend.create(snapshot.id, LABELS, Limits(wall_seconds=0.5))
    result = run_python(backend, box, "import time; time.sleep(60)", timeout=60)
    assert result.timed_out and result.seconds < 10


def test_output_is_bounded_keeping_head_and_tail(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo
) -> None:
    box = backend.create(snapshot.id, LABELS, Limits())
    result = run_python(
        backend, box, "import sys; sys.stdout.write('HEAD' + 'x' * 300_000 + 'TAIL')"
    )
    assert result.exit_code == 0
    assert len(result.stdout) < 64 * 1024 + 100
    assert result.stdout.startswith("HEAD") and result.stdout.endswith("TAIL")
    assert "bytes cut" in result.stdout


# --- the runner, in a sandbox and in-process -------------------------------------------------
def test_runner_in_a_sandbox_matches_the_in_process_runner(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo
) -> None:
    spec_path = ROOT / "forklab" / "workloads" / "recovery-counter.yaml"
    spec = parse_spec(spec_path.read_text(), str(spec_path))
    workload = resolve_workload(spec)
    checkpoints = [run_prefix(workload, spec.seed, episode) for episode in range(120)]
    checkpoint_lines = "".join(checkpoint_line(cp) for cp in checkpoints)
    worlds = spec_world_plans(spec)
    params = spec.workload.params
    request = request_text(
        spec.workload.name, params, spec.seed, worlds=worlds, seconds=[60] * len(worlds)
    )
    box = backend.create(snapshot.id, {**LABELS, "forklab.world": "all"}, Limits())
    backend.upload(box, "request.json", request.encode())
    backend.upload(box, "checkpoints.jsonl", checkpoint_lines.encode())
    runner = ["python", "-m", "forklab.runtime.box", "continue"]
    files = ["--request", "request.json", "--checkpoints", "checkpoints.jsonl"]
    result = backend.exec(box, [*runner, *files, "--out", "out.json"], 60)
    assert result.exit_code == 0, result.stderr
    outputs = parse_world_outputs(backend.download(box, "out.json"), 120, len(worlds))
    backend.delete(box)
    for world, output in zip(worlds, outputs, strict=True):
        in_process = continue_checkpoints(workload, spec.seed, checkpoints, world)
        assert canonical_json(output.columns) == canonical_json(in_process)
        assert output.seconds > 0 and output.error is None
    assert backend.list({}) == []


# --- bytecode -----------------------------------------------------------------------------
def _bytecode_read(result: ExecResult) -> list[str]:
    """The ``.pyc`` files of the snapshot that ``python -v`` says code objects came from
    (a module compiled from source names its ``.py``)."""
    return [
        line.split("from ", 1)[1]
        for line in result.stderr.splitlines()
        if line.startswith("# code object from '/code/") and line.endswith(".pyc'")
    ]


def test_boxes_read_the_bytecode_the_worker_compiled_and_cannot_change_it(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo
) -> None:
    box = backend.create(snapshot.id, LABELS, Limits())
    code = "import forklab.runtime.runner"
    result = backend.exec(box, ["python", "-v", "-c", code], 30)
    assert result.exit_code == 0, result.stderr
    pyc = f"runner.{sys.implementation.cache_tag}.pyc"
    assert f"'/code/forklab/runtime/__pycache__/{pyc}'" in _bytecode_read(result)
    written = run_python(
        backend,
        box,
        """
        import pathlib, sys
        try:
            cache = pathlib.Path("/code/forklab/runtime/__pycache__")
            (cache / f"runner.{sys.implementation.cache_tag}.pyc").write_bytes(b"x")
            print("wrote")
        except OSError as exc:
            print("refused", exc.errno)
        """,
    )
    assert written.stdout.startswith("refused"), written.stdout
    # the snapshot itself still holds exactly the bundle's files (its id digests them)
    folder = backend.root / "snapshots" / snapshot.code_digest
    assert not [p for p in folder.rglob("*.pyc")]
    # without the worker's bytecode a box compiles from source, as before
    plain = LocalSandboxBackend(backend.root, bytecode=False)
    result = plain.exec(box, ["python", "-v", "-c", code], 30)
    assert result.exit_code == 0 and not _bytecode_read(result), _bytecode_read(result)


def test_bytecode_changed_on_the_host_is_compiled_again_never_run(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo, tmp_path: Path
) -> None:
    box = backend.create(snapshot.id, LABELS, Limits())
    assert run_python(backend, box, "import forklab.runtime.runner").exit_code == 0
    (cached,) = (backend.root / "bytecode").rglob("runtime/__pycache__/runner.*.pyc")
    # an unchecked-hash .pyc is run without a look at its source: the worker must notice
    evil = tmp_path / "evil.py"
    evil.write_text("print('tampered bytecode ran')\n")
    py_compile.compile(
        str(evil),
        cfile=str(tmp_path / "evil.pyc"),
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    cached.chmod(0o644)
    cached.write_bytes((tmp_path / "evil.pyc").read_bytes())
    result = run_python(backend, box, "import forklab.runtime.runner; print('ok')")
    assert (result.exit_code, result.stdout) == (0, "ok\n"), result.stdout + result.stderr


#: A workload bundle's module; ``{imports}`` is the line that imports its siblings.
_BUNDLED = """
{imports}
from forklab.runtime.workload import Workload


class Bundled(Workload):
    name = "bundled"
"""

_IMPORT_IT = """
from forklab.runtime.runner import workload_class
from forklab.runtime.workload import WorkloadError
try:
    print(workload_class("bundled:Bundled").__name__)
except WorkloadError as exc:
    print(exc.message)
"""


def _bundled_box(backend: LocalSandboxBackend, tmp_path: Path, imports: str) -> str:
    """A box of a snapshot whose workload bundle holds ``broken.py``, which does not
    compile, beside ``bundled.py`` (importing it when ``imports`` says so)."""
    (tmp_path / "bundled.py").write_text(_BUNDLED.format(imports=imports))
    (tmp_path / "broken.py").write_text("x = (\n")
    bundle = [BundleFile(n, tmp_path / n) for n in ("broken.py", "bundled.py")]
    snapshot = backend.prepare_snapshot(bundle_files("bundled:Bundled", bundle))
    return backend.create(snapshot.id, LABELS, Limits())


def test_a_bundle_file_that_does_not_compile_is_left_to_the_box(
    backend: LocalSandboxBackend, tmp_path: Path
) -> None:
    """The worker compiles none of a workload bundle's (untrusted) files: a file the
    workload does not import does not stop its boxes, and one it imports fails in the
    box with the one sentence of the runner, as it did before the worker compiled."""
    box = _bundled_box(backend, tmp_path, "")
    result = backend.exec(box, ["python", "-c", _IMPORT_IT], 30)
    assert (result.exit_code, result.stdout) == (0, "Bundled\n"), result.stderr
    compiled = [p.name for p in (backend.root / "bytecode").rglob("*.pyc")]
    assert compiled and not [n for n in compiled if n.startswith(("broken.", "bundled."))]

    broken = _bundled_box(backend, tmp_path, "import broken  # noqa: F401")
    result = backend.exec(broken, ["python", "-c", _IMPORT_IT], 30)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("importing 'bundled' raised SyntaxError: "), result.stdout
    assert result.stdout.count("\n") == 1, result.stdout


def test_one_worlds_box_sees_nothing_of_another_worlds_box(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo
) -> None:
    """Two worlds' boxes of one snapshot, alive together (the second one running): each
    sees its own scratch folder, the snapshot and the worker's bytecode (both read-only)
    and nothing of the other — not its files, not its processes, not its host folder."""
    a = backend.create(snapshot.id, {**LABELS, "forklab.world": "a"}, Limits())
    b = backend.create(snapshot.id, {**LABELS, "forklab.world": "b"}, Limits())
    backend.upload(b, "state.json", b"world b's secret state")
    marker, argv = marked_sleeper("world-b")
    running = threading.Thread(
        target=run_python,
        args=(backend, b, f"import subprocess, sys; subprocess.run({argv})", 60),
    )
    running.start()
    try:
        wait_for(lambda: pids_running(marker), 30)
        result = run_python(
            backend,
            a,
            f"""
            import json, os, pathlib
            needle = "{marker[::-1]}"[::-1]  # (its own command line holds the reverse)
            found = []
            for top in ("/work", "/code", "/tmp", "/proc"):
                for root, dirs, files in os.walk(top, onerror=lambda e: None):
                    if root.startswith("/proc/") and root.count("/") > 2:
                        dirs[:] = []
                    for name in files:
                        p = os.path.join(root, name)
                        if name == "state.json" or (p.endswith("/cmdline") and needle
                                in pathlib.Path(p).read_bytes().decode(errors="replace")):
                            found.append(p)
            print(json.dumps({{"found": found, "host": os.path.exists("{backend.root}"),
                              "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}}))
            """,
        )
    finally:
        backend.delete(b)
        running.join(60)
    assert result.exit_code == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["found"] == [], "world a saw world b's files or processes"
    assert seen["host"] is False, "the host's sandbox folders are invisible in a box"
    assert len(seen["pids"]) <= 3, seen["pids"]  # its own (pid namespace), nobody else's
    backend.delete(a)
    assert backend.list({}) == []


def test_a_module_runs_as_python_m_would_run_it(
    backend: LocalSandboxBackend, snapshot: SnapshotInfo
) -> None:
    """``python -m`` (how the runner runs) is run by the launcher itself, sparing a second
    interpreter: the module must see what ``python -S -B -m`` gives it, and its exit."""
    box = backend.create(snapshot.id, LABELS, Limits())
    probe = """
        import json, os, sys
        import forklab.runtime.runner  # found on PYTHONPATH (the snapshot)
        print(json.dumps({"name": __name__, "argv": sys.argv[1:], "path0": sys.path[0],
                          "cwd": os.getcwd(), "no_pyc": sys.dont_write_bytecode,
                          "pid": os.getpid()}))
        sys.exit(int(sys.argv[1]))
        """
    backend.upload(box, "probe.py", textwrap.dedent(probe).encode())
    result = backend.exec(box, ["python", "-m", "probe", "3", "x y"], 30)
    assert result.exit_code == 3, result.stderr
    seen = json.loads(result.stdout)
    assert seen["name"] == "__main__" and seen["argv"] == ["3", "x y"]
    assert seen["path0"] == seen["cwd"] == "/work" and seen["no_pyc"] is True
    backend.upload(box, "boom.py", b"raise KeyError('the module failed')\n")
    result = backend.exec(box, ["python", "-m", "boom"], 30)
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines()[-1] == "KeyError: 'the module failed'"
    missing = backend.exec(box, ["python", "-m", "no_such_module"], 30)
    assert missing.exit_code == 1 and "No module named no_such_module" in missing.stderr
