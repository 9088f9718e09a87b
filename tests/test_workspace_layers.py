"""Copy-on-write workspaces with real overlayfs mounts (and the copy fallback): isolation
of parent, children and sealed layers, whiteouts, verification, and clean unmounting."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from orchestration_lab import WorkerProcesses, lab_settings
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from forklab.activities.experiment.runner_bundle import bundle_files
from forklab.activities.experiment.world_batches import SandboxActivities
from forklab.activities.sandbox import Limits, LocalSandboxBackend, SandboxError
from forklab.activities.sandbox.shared_snapshots import SharedSnapshots
from forklab.activities.sandbox.workspace import (
    WorkspaceError,
    Workspaces,
    mount_point,
    mounts_under,
    unmount_under,
)
from forklab.activities.stores.artifacts import LocalArtifactStore, run_name
from forklab.cli.experiment.specfile import load_spec
from forklab.contracts.experiment import (
    BatchInput,
    BatchStatus,
    CleanupInput,
    CleanupResult,
    EpisodeChunk,
    PrefixInput,
    RunnerJob,
)
from forklab.experiments.experiment.analysis.checks import common_checkpoints
from forklab.experiments.experiment.outcomes import ExperimentOutcomes, WorldOutcomes
from forklab.experiments.experiment.worlds import spec_world_plans
from forklab.experiments.workspace import (
    FileRecord,
    WorkspaceCheckpoint,
    WorkspaceEvidence,
    WorkspaceManifest,
    diff_manifests,
)
from forklab.runtime.file_format import checkpoint_id
from forklab.runtime.runner import continue_checkpoints, run_prefix
from forklab.workloads.coding_fix import CodingFix
from tests.helpers import ROOT, run_cli
from tests.sandbox_lab import without_sys_admin

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="overlayfs mounts need root")


def _start(folder: Path) -> Path:
    (folder / "pkg" / "sub").mkdir(parents=True)
    (folder / "pkg" / "mod.py").write_text("x = 1\n")
    (folder / "pkg" / "sub" / "a.txt").write_text("a\n")
    (folder / "blob.bin").write_bytes(bytes(range(256)) * 4096)
    (folder / "link").symlink_to("pkg/mod.py")
    return folder


def _tree(folder: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = path.read_bytes()
        else:
            out[rel] = "dir"
    return out


def test_children_see_the_parent_at_once_and_keep_their_writes(
    workspaces: Workspaces, root: Path
) -> None:
    base = workspaces.layers.import_tree(_start(root / "start"))
    parent = workspaces.attach("parent", root / "mnt" / "parent", base.digest)
    p = Path(parent.target)
    (p / "pkg" / "mod.py").write_text("x = 2\n")  # the parent's own work before the fork
    (p / "pkg" / "sub" / "a.txt").unlink()
    before = _tree(p)

    layer, kids = workspaces.fork("parent", [(f"k{i}", root / "mnt" / f"k{i}") for i in range(3)])
    if workspaces.overlay:  # only what the parent wrote is sealed (and hashed)
        assert layer.parent == base.digest and layer.hashed_bytes == len("x = 2\n")
        assert [k.stack for k in kids] == [(layer.digest, base.digest)] * 3
    else:  # a copy records no changes: its whole tree becomes the layer
        assert layer.parent is None and layer.hashed_bytes > 1 << 20
        assert [k.stack for k in kids] == [(layer.digest,)] * 3
    for k in kids:
        assert _tree(Path(k.target)) == before  # the parent's bytes, at once
    k0, k1, k2 = (Path(k.target) for k in kids)
    (k0 / "pkg" / "mod.py").write_text("x = 'child0'\n")
    (k1 / "blob.bin").unlink()
    shutil.rmtree(k2 / "pkg")
    (k2 / "pkg").mkdir()
    (k2 / "pkg" / "new.py").write_text("fresh\n")

    assert _tree(p) == before  # the parent never changes
    assert (k1 / "pkg" / "mod.py").read_text() == "x = 2\n"  # nor do siblings
    assert (k0 / "blob.bin").exists() and not (k1 / "blob.bin").exists()
    assert sorted(_tree(k2 / "pkg")) == ["new.py"]
    for digest in (layer.digest, base.digest):
        workspaces.layers.verify(digest, full=True)  # sealed layers untouched

    # a child's deletions survive its own freeze: grandchildren do not see them again
    for i, expect in ((1, None), (2, ["new.py"])):
        sealed = workspaces.freeze(f"k{i}")
        grand = workspaces.attach(f"g{i}", root / "mnt" / f"g{i}", sealed.digest)
        g = Path(grand.target)
        if expect is None:
            assert not (g / "blob.bin").exists() and (g / "pkg" / "mod.py").exists()
        else:
            assert sorted(_tree(g / "pkg")) == expect
    for ws_id in workspaces.ids():
        workspaces.remove(ws_id)
    assert not (root / "mnt" / "k0").exists() or not any((root / "mnt" / "k0").iterdir())


@needs_root
def test_overlay_fork_shares_the_bytes_and_the_fallback_says_it_copied(root: Path) -> None:
    start = root / "start"
    start.mkdir()
    (start / "big.bin").write_bytes(os.urandom(4 << 20))
    overlay = Workspaces(root / "store")
    base = overlay.layers.import_tree(start)
    overlay.attach("parent", root / "mnt" / "parent", base.digest)
    _, kids = overlay.fork("parent", [(f"k{i}", root / "mnt" / f"k{i}") for i in range(3)])
    assert {k.mode for k in kids} == {"overlay"} and all(k.note is None for k in kids)
    assert all(overlay.own_bytes(k.id) < 64 * 1024 for k in kids)  # folders, no data

    copying = Workspaces(root / "store", overlay=False)
    copy = copying.attach("copied", root / "mnt" / "copied", kids[0].stack[0])
    assert copy.mode in ("copy", "reflink") and "copied" in (copy.note or "")
    assert copying.own_bytes("copied") >= 4 << 20
    assert (Path(copy.target) / "big.bin").read_bytes() == (start / "big.bin").read_bytes()
    for ws_id in overlay.ids():
        overlay.remove(ws_id)


FALLBACK = """
import sys
from pathlib import Path
from forklab.activities.sandbox.workspace import Workspaces
ws = Workspaces(Path(sys.argv[1]))
info = ws.attach("child", Path(sys.argv[1]) / "mnt", sys.argv[2])
print(info.model_dump_json())
ws.remove("child")
"""


@needs_root
def test_without_permission_to_mount_it_falls_back_and_says_so(root: Path) -> None:
    store = Workspaces(root / "store")
    base = store.layers.import_tree(_start(root / "start"))
    ran = without_sys_admin(FALLBACK, str(root / "store"), base.digest)
    assert ran.returncode == 0, ran.stderr
    assert '"mode":"copy"' in ran.stdout or '"mode":"reflink"' in ran.stdout
    assert "overlay mount not permitted (Operation not permitted)" in ran.stdout


def test_a_tampered_layer_is_refused(root: Path) -> None:
    store = Workspaces(root / "store", overlay=False)
    base = store.layers.import_tree(_start(root / "start"))
    tree = store.layers.tree(base.digest)
    store.layers.verify(base.digest, full=True)

    with (tree / "blob.bin").open("r+b") as fh:  # same size, one byte changed in place
        fh.write(b"\xff")
    with pytest.raises(WorkspaceError, match=r"modified after sealing.*blob\.bin"):
        store.layers.verify(base.digest)
    with pytest.raises(WorkspaceError, match="modified after sealing"):
        store.attach("child", root / "mnt", base.digest)
    assert not (root / "mnt").exists() or not any((root / "mnt").iterdir())
    assert store.ids() == []  # nothing half-made is left

    # the same content sealed again is the same layer; the damaged copy is replaced
    again = store.layers.import_tree(_start(root / "start1"))
    assert again.digest == base.digest
    store.layers.verify(base.digest, full=True)

    other = store.layers.import_tree(_start(root / "start2"))
    assert other.digest == base.digest
    (store.layers.tree(other.digest) / "planted.py").write_text("evil\n")
    with pytest.raises(WorkspaceError, match=r"planted\.py"):
        store.layers.verify(other.digest)

    third_start = _start(root / "start3")
    (third_start / "marker").write_text("3\n")
    third = store.layers.import_tree(third_start)
    store.layers.verify(third.digest)  # checked once and cached by the files' identity...
    manifest = store.layers.root / third.digest / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"mode":420', '"mode":511', 1))
    with pytest.raises(WorkspaceError, match="does not hash to its name"):
        store.layers.verify(third.digest)  # ...which a rewrite changes: checked again
    for bad in ("../" * 3 + "etc", "0" * 64):
        with pytest.raises(WorkspaceError, match=r"not a sha256|does not exist"):
            store.attach("x", root / "mnt-x", bad)


@needs_root
def test_a_special_file_stops_the_freeze_and_the_workspace_stays_usable(root: Path) -> None:
    ws = Workspaces(root / "store")
    info = ws.attach("w", root / "mnt", None)
    target = Path(info.target)
    (target / "keep.txt").write_text("kept\n")
    os.mkfifo(target / "pipe")
    with pytest.raises(WorkspaceError, match=r"'pipe'.*only files, folders and symlinks"):
        ws.freeze("w")
    assert (target / "keep.txt").read_text() == "kept\n"  # mounted again as it was
    (target / "pipe").unlink()
    assert ws.freeze("w").files == 1
    ws.remove("w")


def test_manifest_diff_and_checkpoint_digest() -> None:
    def rec(path: str, sha: str) -> FileRecord:
        return FileRecord(path=path, size=1, md5="m", sha256=sha * 64)

    a = WorkspaceManifest(files=(rec("a", "1"), rec("b", "2"), rec("c", "3")))
    b = WorkspaceManifest(files=(rec("a", "1"), rec("b", "4"), rec("d", "5")))
    d = diff_manifests(a, b)
    assert (d.added, d.removed, d.changed, d.unchanged) == (("d",), ("c",), ("b",), 1)
    assert d.diverged and not diff_manifests(a, a).diverged
    state = "a" * 64
    plain = WorkspaceCheckpoint(state_sha256=state)
    assert plain.digest == state  # a workload without files: the state digest alone
    one = WorkspaceCheckpoint(state_sha256=state, layer="b" * 64)
    two = WorkspaceCheckpoint(state_sha256=state, layer="c" * 64)
    assert len({plain.digest, one.digest, two.digest}) == 3  # the files count


def test_a_mountinfo_field_reads_as_the_path_it_names() -> None:
    """The bytes of a UTF-8 name stay that name (``unicode_escape`` would make mojibake of
    them, and a box under such a root would keep its mounts); only octal escapes are undone."""
    name = "/srv/r\u00e9sum\u00e9 \u6f22\u5b57\tx\\y"
    field = name.encode().replace(b"\\", b"\\134").replace(b" ", b"\\040")
    field = field.replace(b"\t", b"\\011")
    assert mount_point(field) == name
    assert mount_point(b"/a\\012b") == "/a\nb"
    assert mount_point("/caf\u00e9\\101".encode()) == "/caf\u00e9A"  # an escape, not text


@needs_root
def test_mounts_under_a_non_ascii_root_are_found_and_detached(tmp_path: Path) -> None:
    """mountinfo writes a path's own bytes (octal escapes only for space, tab, newline,
    backslash): a root named in UTF-8, with a space in it, must still see its mounts, or a
    box's delete would leave them mounted."""
    root = tmp_path / "r\u00e9sum\u00e9 \u6f22\u5b57"
    point = root / "boxes" / "x" / "workspace"
    point.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "none", str(point)], check=True)
    try:
        assert mounts_under(root) == [point]
        unmount_under(root)
        assert mounts_under(root) == []
        assert point.is_dir() and not os.path.ismount(point)
    finally:
        if os.path.ismount(point):
            subprocess.run(["umount", "-l", str(point)], check=False)


@needs_root
def test_sandbox_fork_and_delete_unmount(root: Path) -> None:
    backend = LocalSandboxBackend(root / "sandboxes")
    snapshot = backend.prepare_snapshot(bundle_files("counter-recovery"))
    base = backend.import_workspace(_start(root / "start"))
    parent = backend.create(snapshot.id, {"x": "parent"}, Limits())
    backend.attach_workspace(parent, base.digest)
    wrote = backend.exec(parent, ["sh", "-c", "echo work > workspace/out.txt"], 30)
    assert wrote.exit_code == 0, wrote.stderr
    fork = backend.fork(parent, [{"x": "a"}, {"x": "b"}])
    a, b = (c.id for c in fork.children)
    assert backend.download(a, "workspace/out.txt") == b"work\n"
    assert backend.exec(a, ["sh", "-c", "echo mine > workspace/out.txt"], 30).exit_code == 0
    assert backend.download(a, "workspace/out.txt") == b"mine\n"
    assert backend.download(b, "workspace/out.txt") == b"work\n"
    assert backend.download(parent, "workspace/out.txt") == b"work\n"
    assert len(mounts_under(root)) == 3
    with pytest.raises(SandboxError, match="already has a workspace"):
        backend.attach_workspace(b, base.digest)
    bare = backend.create(snapshot.id, {"x": "bare"}, Limits())
    with pytest.raises(SandboxError, match="does not exist"):
        backend.attach_workspace(bare, "f" * 64)
    # leftovers of a crash are listed whatever the labels: a box without its registry
    # entry, and a mounted workspace whose sandbox was never registered
    (root / "sandboxes" / "registry" / f"{b}.json").unlink()
    orphan = "lsb-0123456789abcdef"
    backend.workspaces.attach(orphan, root / "sandboxes" / "boxes" / orphan / "workspace", None)
    assert {b, orphan} <= set(backend.list({"x": "nothing matches"}))
    for box in backend.list({}):
        backend.delete(box)
    assert mounts_under(root) == [] and backend.list({}) == []


_KILLED_AFTER_MOUNTING = """
import os, signal, sys
from pathlib import Path
from forklab.activities.sandbox import Limits, LocalSandboxBackend, workspace
from forklab.activities.experiment.runner_bundle import bundle_files

mount = workspace._mount_overlay

def mount_then_die(*args):  # the worker is killed right after the mount syscall
    mount(*args)
    os.kill(os.getpid(), signal.SIGKILL)

workspace._mount_overlay = mount_then_die
backend = LocalSandboxBackend(Path(sys.argv[1]))
box = backend.create(backend.prepare_snapshot(bundle_files("counter-recovery")).id, {}, Limits())
print(box, flush=True)
backend.attach_workspace(box, None)
"""


@needs_root
def test_a_worker_killed_as_it_mounts_a_workspace_leaves_no_mount(root: Path) -> None:
    """SIGKILL between the overlay mount and anything after it: the workspace's record,
    written before the mount, lets ``remove`` unmount it; and the box's delete unmounts
    what is mounted in it even when that record is lost."""
    sandboxes = root / "sandboxes"
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_AFTER_MOUNTING, str(sandboxes)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    box = killed.stdout.strip()
    assert mounts_under(root) == [sandboxes / "boxes" / box / "workspace"]
    backend = LocalSandboxBackend(sandboxes)
    backend.workspaces.remove(box)  # what the box's delete does first
    assert mounts_under(root) == []
    backend.delete(box)
    assert backend.list({}) == []

    # the record lost (here: removed by hand) while the overlay is mounted
    snapshot = backend.prepare_snapshot(bundle_files("counter-recovery"))
    other = backend.create(snapshot.id, {}, Limits())
    backend.attach_workspace(other, None)
    shutil.rmtree(sandboxes / "workspaces" / other)
    assert len(mounts_under(root)) == 1
    backend.delete(other)
    assert mounts_under(root) == [] and backend.list({}) == []


OWNER = 54_321


def _as_owner(folder: Path, script: str) -> subprocess.CompletedProcess[str]:
    setpriv = shutil.which("setpriv")
    assert setpriv is not None
    return subprocess.run(
        [setpriv, f"--reuid={OWNER}", f"--regid={OWNER}", "--clear-groups", "sh", "-c", script],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
    )


@needs_root
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is needed")
def test_the_owner_can_write_its_workspace_and_its_childrens(
    workspaces: Workspaces, root: Path
) -> None:
    """Sandboxed commands run as an unprivileged uid: the workspace must be theirs."""
    owned = Workspaces(root / "store", overlay=workspaces.overlay, owner=OWNER)
    base = owned.layers.import_tree(_start(root / "start"), owner=OWNER)
    parent = Path(owned.attach("parent", root / "mnt" / "parent", base.digest).target)
    wrote = _as_owner(parent, "echo y = 2 >> pkg/mod.py && mkdir made && echo x > made/f")
    assert wrote.returncode == 0, wrote.stderr
    _, (kid,) = owned.fork("parent", [("kid", root / "mnt" / "kid")])
    again = _as_owner(Path(kid.target), "echo z = 3 >> pkg/mod.py && echo y > made/f")
    assert again.returncode == 0, again.stderr
    assert (parent / "made" / "f").read_text() == "x\n"

    # without an owner the files stay root's: the same commands are refused
    plain = workspaces.attach(
        "plain",
        root / "mnt" / "plain",
        workspaces.layers.import_tree(_start(root / "start2")).digest,
    )
    refused = _as_owner(Path(plain.target), "echo y = 2 >> pkg/mod.py")
    assert refused.returncode != 0 and "Permission denied" in refused.stderr
    for ws_id in owned.ids():
        owned.remove(ws_id)


def test_a_world_that_sees_other_files_fails_common_checkpoints(tmp_path: Path) -> None:
    """The checkpoint of a workload with files pins them: a world handed a folder whose
    files differ from the prefix's reports another inherited checkpoint, and the validity
    check says so (the state alone is the same)."""
    spec = load_spec(str(ROOT / "forklab" / "workloads" / "coding-fix.yaml"))
    workload = CodingFix(dict(spec.workload.params))
    root = tmp_path / "chunk"
    checkpoints = [run_prefix(workload, spec.seed, e, root / str(e)) for e in range(4)]
    assert all("workspace" in cp for cp in checkpoints)
    plan = spec_world_plans(spec)[0]
    honest = continue_checkpoints(workload, spec.seed, checkpoints, plan, root)
    assert honest["inherited"] == [checkpoint_id(cp) for cp in checkpoints]
    assert all(checkpoint_id(cp) != cp["sha256"] for cp in checkpoints)  # files count

    arith = root / "2" / "calc" / "arith.py"
    arith.write_text(arith.read_text().replace("return a", "return  a"))  # same behaviour
    tampered = continue_checkpoints(workload, spec.seed, checkpoints, plan, root)
    assert tampered["outcomes"] == honest["outcomes"]
    assert [
        i
        for i, (a, b) in enumerate(zip(tampered["inherited"], honest["inherited"], strict=True))
        if a != b
    ] == [2]
    outcomes = ExperimentOutcomes(
        episodes=[0, 1, 2, 3],
        requested=[1] * 4,
        resolved=[1] * 4,
        checkpoints=[checkpoint_id(cp) for cp in checkpoints],
        features=[cp["features"] for cp in checkpoints],
        worlds=[WorldOutcomes(name=plan.name, **tampered)],
    )
    check = common_checkpoints(outcomes)
    assert not check.passed and plan.name in check.reason


def test_gc_keeps_what_a_live_run_or_workspace_needs_and_removes_the_rest(
    workspaces: Workspaces, root: Path, tmp_path: Path
) -> None:
    base = workspaces.layers.import_tree(_start(tmp_path / "base")).digest
    workspaces.attach("ws-live", root / "live", base)
    (root / "live" / "new.txt").write_text("written by the live sandbox\n")
    top = workspaces.freeze("ws-live").digest  # over ``base`` (overlay) or alone (copy)
    pinned_src = tmp_path / "pinned"
    pinned_src.mkdir()
    (pinned_src / "only.txt").write_text("pinned by a run\n")
    pinned = workspaces.layers.import_tree(pinned_src).digest
    workspaces.pin("wf-1/run-1", pinned)
    orphan_src = tmp_path / "orphan"
    orphan_src.mkdir()
    (orphan_src / "gone.txt").write_text("nobody needs me\n")
    orphan = workspaces.layers.import_tree(orphan_src).digest
    workspaces.attach("ws-done", root / "done", orphan)
    workspaces.remove("ws-done")  # its sandbox was deleted

    assert workspaces.gc(min_age_seconds=3600).removed == ()  # everything is too young
    result = workspaces.gc(min_age_seconds=0)
    live = {top, pinned} | ({base} if workspaces.overlay else set())
    assert orphan in result.removed and not live & set(result.removed)
    assert result.bytes_freed > 0
    for digest in live:
        workspaces.layers.verify(digest, full=True)  # untouched
    assert _tree(root / "live")["new.txt"] == b"written by the live sandbox\n"

    workspaces.release("wf-1/run-1")  # the run cleaned up
    assert pinned in workspaces.gc(min_age_seconds=0).removed
    workspaces.remove("ws-live")
    left = workspaces.gc(min_age_seconds=0)
    assert top in left.removed and left.kept == 0
    assert not list(workspaces.layers.root.iterdir())


def test_layers_gc_through_the_cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    backend = LocalSandboxBackend(home / "sandboxes", overlay=False)
    orphan = backend.import_workspace(_start(tmp_path / "orphan")).digest
    kept = backend.import_workspace(_start(tmp_path / "kept") / "pkg").digest
    backend.pin_layer("wf/run", kept)
    code, out, err = run_cli(capsys, "layers", "gc", "--min-age", "0", "--home", str(home))
    assert code == 0, err
    assert out.startswith("removed 1 layers") and "kept 1 (1 pinned" in out
    assert not (backend.workspaces.layers.root / orphan).exists()
    backend.workspaces.layers.verify(kept, full=True)
    code, out, err = run_cli(
        capsys, "layers", "gc", "--min-age", "0", "--home", str(home), "--json"
    )
    assert code == 0, err
    assert json.loads(out) == {
        "agent_runs": None,
        "bytes_freed": 0,
        "kept": 1,
        "live": 1,
        "released_ended_runs": 0,
        "removed": 0,
    }
    # an artifact store that cannot be opened: the ended runs are not checked, said so
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("FORKLAB_ARTIFACTS", str(blocked))
    code, out, err = run_cli(capsys, "layers", "gc", "--min-age", "0", "--home", str(home))
    assert code == 0 and out.startswith("removed 0 layers") and "kept 1 (1 pinned" in out
    assert err.startswith("forklab: runs that ended on other hosts not checked (")
    assert "their layers stay pinned until the store answers" in err
    code, _, err = run_cli(capsys, "layers", "gc", "--min-age", "-1", "--home", str(home))
    assert code == 2 and err == "forklab: error: --min-age: give a number of at least 0\n"


async def test_a_run_that_ended_on_another_host_releases_its_pins_here(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Hosts a and b share an artifact store. Run 1 pinned a layer on host b (a world batch
    rebuilt its chunk's layer there) and ended with its cleanup on host a, which releases a's
    pins only. Its end mark in the store lets b drop its pins at b's next cleanup of any
    run; run 4 ends the same way and b's ``forklab layers gc`` drops its pins. A run still
    going (run 2) keeps its pins and its layer on b throughout."""
    store = LocalArtifactStore(tmp_path / "shared-artifacts")
    homes = {name: tmp_path / f"host-{name}" for name in ("a", "b")}
    hosts = {
        name: LocalSandboxBackend(home / "sandboxes", overlay=False) for name, home in homes.items()
    }

    async def cleanup(host: str, run_key: str) -> CleanupResult:
        acts = SandboxActivities(hosts[host], store, SharedSnapshots(hosts[host], store))
        inp = CleanupInput(experiment_id="e", run_key=run_key)
        return await ActivityEnvironment().run(acts.cleanup_sandboxes, inp)

    b = hosts["b"]
    layers = {}
    for run in ("wf/run-1", "wf/run-2", "wf/run-4"):
        folder = tmp_path / run.replace("/", "-")
        folder.mkdir()
        (folder / "state.txt").write_text(f"the chunk of {run}\n")
        layers[run] = b.import_workspace(folder).digest
        b.pin_layer(run, layers[run])
    assert b.workspaces.pinned_runs() == sorted(run_name(r) for r in layers)

    await cleanup("a", "wf/run-1")
    assert len(b.workspaces.pinned_runs()) == 3  # b has not looked yet
    await cleanup("b", "wf/run-3")  # another run ends on b
    assert b.workspaces.pinned_runs() == sorted(run_name(r) for r in ("wf/run-2", "wf/run-4"))
    live = b.workspaces.live_layers()
    assert layers["wf/run-1"] not in live and {layers["wf/run-2"], layers["wf/run-4"]} <= live

    await cleanup("a", "wf/run-4")
    monkeypatch.setenv("FORKLAB_ARTIFACTS", str(store.root))
    gc = ["layers", "gc", "--min-age", "0", "--home", str(homes["b"])]
    code, out, err = await asyncio.to_thread(run_cli, capsys, *gc)  # it runs its own loop
    assert code == 0, err
    assert out.startswith("released the pins of 1 ended run whose cleanup ran on another host\n")
    assert "removed 2 layers" in out and "kept 1 (1 pinned" in out
    assert b.workspaces.pinned_runs() == [run_name("wf/run-2")]
    b.workspaces.layers.verify(layers["wf/run-2"], full=True)
    for run in ("wf/run-1", "wf/run-4"):
        assert not (b.workspaces.layers.root / layers[run]).exists()


async def test_an_idle_worker_releases_the_pins_of_runs_that_ended_elsewhere(
    temporal_env: WorkflowEnvironment, worker_processes: WorkerProcesses, tmp_path: Path
) -> None:
    """Host b pinned layers for runs 1 and 2 and runs nothing more; run 1 ends with its
    cleanup on another host (its end mark in the shared store). b's ``forklab worker``
    drops run 1's pins and collects its layer on its own, every FORKLAB_COLLECT_SECONDS,
    without a cleanup on b or ``forklab layers gc``; run 2, still going, keeps its layer."""
    store = LocalArtifactStore(tmp_path / "shared-artifacts")
    home = tmp_path / "host-b"
    b = LocalSandboxBackend(home / "sandboxes", overlay=False)
    layers = {}
    for run in ("wf/run-1", "wf/run-2"):
        folder = tmp_path / run.replace("/", "-")
        folder.mkdir()
        (folder / "state.txt").write_text(f"the chunk of {run}\n")
        layers[run] = b.import_workspace(folder).digest
        b.pin_layer(run, layers[run])
        old = time.time() - 3600  # sealed an hour ago: past the grace of a fresh seal
        os.utime(b.workspaces.layers.root / layers[run], (old, old))
    store.mark_ended("wf/run-1")
    settings = lab_settings(temporal_env, home)
    env = {
        **os.environ,
        "FORKLAB_ADDRESS": settings.address,
        "FORKLAB_HOME": str(home),
        "FORKLAB_TASK_QUEUE": settings.task_queue,
        "FORKLAB_ARTIFACTS": str(store.root),
        "FORKLAB_COLLECT_SECONDS": "0.5",
    }
    log = tmp_path / "worker.log"
    worker = worker_processes.start(env, log)
    deadline = time.monotonic() + 60
    while (b.workspaces.layers.root / layers["wf/run-1"]).exists():
        assert worker.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        await asyncio.sleep(0.2)
    assert b.workspaces.pinned_runs() == [run_name("wf/run-2")]
    b.workspaces.layers.verify(layers["wf/run-2"], full=True)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, log.read_text()
    shown = log.read_text()
    assert "housekeeping: released the pins of 1 ended run\n" in shown
    assert "housekeeping: collected 1 workspace layer (" in shown


@pytest.mark.parametrize(
    "argv",
    [["layers", "gc"], ["demo", "workspace"], ["status", "x"], ["worker"], ["doctor"], ["up"]],
)
def test_a_bad_setting_exits_2_from_every_command(
    argv: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """Bad configuration is bad input: exit 2 and one line, whichever command reads it."""
    monkeypatch.setenv("FORKLAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FORKLAB_ADDRESS", "nonsense")
    code, out, err = run_cli(capsys, *argv)
    assert (code, out) == (2, "")
    assert err == (
        "forklab: error: setting address (FORKLAB_ADDRESS) is 'nonsense'; use host:port, "
        "the port from 1 to 65535\n"
    )
    assert not (tmp_path / "home").exists()  # nothing half-done


@pytest.mark.parametrize("value", ["-1", "soon", "86401"])
def test_a_bad_collect_interval_stops_the_worker_before_it_starts(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("FORKLAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FORKLAB_COLLECT_SECONDS", value)
    code, out, err = run_cli(capsys, "worker")
    assert (code, out) == (2, "")
    assert err.startswith(
        "forklab: error: setting collect_seconds (FORKLAB_COLLECT_SECONDS) is invalid: "
    )
    assert err.endswith("; fix its value\n") and err.count("\n") == 1
    assert not (tmp_path / "home").exists()


def test_replicates_of_a_world_with_files_each_get_their_own_folder(tmp_path: Path) -> None:
    """With forks > 1, every replicate but the last works in a copy of the episode's
    folder (a deterministic workload votes as one); without ``own`` the folder the prefix
    left is never written, and no copy is left behind."""
    spec = load_spec(str(ROOT / "forklab" / "workloads" / "coding-fix.yaml"))
    workload = CodingFix(dict(spec.workload.params))
    root = tmp_path / "chunk"
    checkpoints = [run_prefix(workload, spec.seed, e, root / str(e)) for e in range(6)]
    before = {e: _tree(root / str(e)) for e in range(6)}
    single, triple = (
        dataclasses.replace(spec_world_plans(spec)[3], forks=forks) for forks in (1, 3)
    )
    one = continue_checkpoints(workload, spec.seed, checkpoints, single, root)
    three = continue_checkpoints(workload, spec.seed, checkpoints, triple, root)
    assert one["outcomes"] == three["outcomes"] and one["inherited"] == three["inherited"]
    assert {e: _tree(root / str(e)) for e in range(6)} == before
    own = continue_checkpoints(workload, spec.seed, checkpoints, triple, root, own=True)
    assert own["outcomes"] == one["outcomes"]
    assert "@unittest.expectedFailure" in (root / "0" / "tests" / "test_arith.py").read_text()
    assert not list(Path(tempfile.gettempdir()).glob(f"fork-{os.getpid()}-*"))


@needs_root
async def test_a_world_on_another_host_rebuilds_the_chunks_layer(tmp_path: Path) -> None:
    """Two worker hosts share an artifact store, not their disks: the prefix runs on host
    A, one world batch on A and the same world on B, which has no copy of A's layer. B
    rebuilds it from the shipped files, checked against the checkpoints, and gets the same
    columns; a shipped file that does not match fails the world, named."""
    store = LocalArtifactStore(tmp_path / "artifacts")
    hosts = [LocalSandboxBackend(tmp_path / name) for name in ("host-a", "host-b")]
    acts = [SandboxActivities(h, store, SharedSnapshots(h, store)) for h in hosts]
    spec = load_spec(str(ROOT / "forklab" / "workloads" / "coding-fix.yaml"))
    info = SharedSnapshots(hosts[0], store).prepare(bundle_files("coding-fix"))
    job = RunnerJob(
        workload="coding-fix", params=dict(spec.workload.params), seed=spec.seed, workspace=True
    )
    chunk = EpisodeChunk(index=0, first=0, stop=6)
    common = {"experiment_id": "exp", "run_key": "wf/run", "job": job, "snapshot_id": info.id}
    prefix = await ActivityEnvironment().run(
        acts[0].run_prefixes, PrefixInput(**common, chunk=chunk, reservation_seconds=120)
    )
    world = spec_world_plans(spec)[3]  # skip: it edits the tests
    batch = BatchInput(
        **common,
        worlds=[world],
        world_seconds=[120],
        chunk=chunk,
        checkpoints_digest=prefix.checkpoints_digest,
        workspace_digest=prefix.workspace_digest,
    )
    groups = [await ActivityEnvironment().run(a.run_world_group, batch) for a in acts]
    [on_a], [on_b] = (g.outcomes for g in groups)
    assert on_a.status is on_b.status is BatchStatus.completed, (on_a.error, on_b.error)
    assert store.get_json(on_a.columns_digest or "") == store.get_json(on_b.columns_digest or "")
    layer_a = WorkspaceEvidence.model_validate_json(store.get_bytes(prefix.workspace_digest or ""))
    end_b = WorkspaceEvidence.model_validate_json(store.get_bytes(on_b.workspace_digest or ""))
    assert hosts[1].has_layer(end_b.layer) and not hosts[0].has_layer(end_b.layer)
    assert end_b.layer != layer_a.layer  # B's own seal (its sandbox uid owns the files)

    # the shipped bytes of one file replaced: B refuses to rebuild the chunk from them
    hosts[1].release_layers("wf/run")
    hosts[1].collect_layers(0)
    arith = next(f for f in layer_a.manifest.files if f.path == "0/calc/arith.py")
    forged = layer_a.manifest.model_copy(
        update={
            "files": tuple(
                f.model_copy(update={"sha256": store.put_bytes(b"def add(a, b):\n    return 0\n")})
                if f == arith
                else f
                for f in layer_a.manifest.files
            )
        }
    )
    bad = store.put_bytes(
        layer_a.model_copy(update={"manifest": forged}).model_dump_json().encode()
    )
    with pytest.raises(ApplicationError, match="not what its checkpoints pin"):
        await ActivityEnvironment().run(
            acts[1].run_world_group, batch.model_copy(update={"workspace_digest": bad})
        )
    assert hosts[1].list({}) == []
