"""A hostile workload against the workspace copy-on-write path, on the real local backend:
what it leaves in its workspace (links to host files, special files, trees nested
thousands deep, names that forge lines or are not UTF-8, hard links kept outside) is
refused with a sentence naming it, never read through, and leaves nothing behind."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from forklab.activities.experiment.runner_bundle import bundle_files
from forklab.activities.experiment.world_batches import _Files
from forklab.activities.sandbox import Limits, LocalSandboxBackend
from forklab.activities.sandbox.base import WorkspaceRefusedError
from forklab.activities.sandbox.workspace import mounts_under, remove_tree
from forklab.activities.stores.artifacts import LocalArtifactStore
from forklab.contracts.errors import ExperimentErrorType
from forklab.experiments.experiment.workspace_report import (
    PathChange,
    WorkspaceSection,
    WorldWorkspace,
    workspace_markdown,
)
from forklab.runtime.files import WorkspaceContentError, folder_digest
from tests.sandbox_lab import run_python

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="boxes with a sandbox uid need root")

SECRET = "HOST-SECRET\n"


@pytest.fixture(params=["overlay", "copy"])
def backend(request: pytest.FixtureRequest, root: Path) -> Iterator[LocalSandboxBackend]:
    made = LocalSandboxBackend(root / "sb", overlay=request.param == "overlay")
    yield made
    for box in made.list({}):
        made.delete(box)


def _box(backend: LocalSandboxBackend, labels: dict[str, str] | None = None) -> str:
    snapshot = backend.prepare_snapshot(bundle_files("counter-recovery"))
    box = backend.create(snapshot.id, labels or {"x": "parent"}, Limits())
    backend.attach_workspace(box, None)
    return box


def _run(backend: LocalSandboxBackend, box: str, code: str) -> None:
    ran = run_python(backend, box, code, timeout=120)
    assert ran.exit_code == 0, ran.stderr


def _host_secret(root: Path) -> Path:
    """A host folder the sandbox cannot reach (0700, root's), holding a readable file."""
    secret = root / "host-secret"
    (secret / "sub").mkdir(parents=True)
    (secret / "sub" / "key").write_text(SECRET)
    secret.chmod(0o700)
    return secret


def _layers_holding(backend: LocalSandboxBackend, text: str) -> list[Path]:
    store = backend.workspaces.layers.root
    return [
        p
        for p in store.rglob("*")
        if p.is_file() and not p.is_symlink() and text.encode() in p.read_bytes()
    ]


def _nothing_left(backend: LocalSandboxBackend, root: Path) -> None:
    for box in backend.list({}):
        backend.delete(box)
    assert mounts_under(root) == []
    assert list((root / "sb" / "boxes").iterdir()) == []
    assert list((root / "sb" / "workspaces").iterdir()) == []


def test_a_workspace_replaced_by_a_link_to_a_host_folder_is_not_read_or_copied(
    backend: LocalSandboxBackend, root: Path
) -> None:
    """In the copy fallback the workspace is a plain folder of the box: a command can put a
    link in its place. The freeze moved the link into the store and read through it: the
    host folder became the layer, and a child read the host's file."""
    secret = _host_secret(root)
    box = _box(backend)
    _run(
        backend,
        box,
        f"""
        import os, shutil
        os.chdir("/work")
        try:
            shutil.rmtree("workspace")
        except OSError:
            raise SystemExit(0)  # an overlay mount point cannot be replaced
        os.symlink({str(secret)!r}, "workspace")
        """,
    )
    if backend.workspaces.info(box).mode == "overlay":
        pytest.skip("only a copied workspace can be replaced by a link")
    with pytest.raises(WorkspaceRefusedError, match=r"workspace is not a folder"):
        backend.workspace_manifest(box)
    with pytest.raises(WorkspaceRefusedError, match=r"workspace is not a folder"):
        backend.fork(box, [{"x": "child"}])
    assert backend.list({"x": "child"}) == []  # no child half-made
    assert _layers_holding(backend, SECRET) == []  # no host byte in the store
    assert (secret / "sub" / "key").read_text() == SECRET  # the host folder untouched
    _nothing_left(backend, root)


def test_an_episode_folder_that_links_to_a_host_folder_fails_the_prefix(
    backend: LocalSandboxBackend, root: Path
) -> None:
    """The prefix's check read every episode folder with ``folder_digest``, which followed
    a link: the worker hashed the host folder (``/proc`` there would block it for ever)."""
    secret = _host_secret(root)
    box = _box(backend)
    _run(backend, box, f"import os; os.symlink({str(secret)!r}, '/work/workspace/0')")
    files = _Files(backend, LocalArtifactStore(root / "art"), None, "run-1", freeze=True)
    with pytest.raises(ApplicationError, match=r"workspace/0 is not a folder") as raised:
        files.read(box)
    assert raised.value.non_retryable and raised.value.type == ExperimentErrorType.prefix_failed
    assert files.folders == {}
    _nothing_left(backend, root)


def test_a_fifo_in_the_workspace_fails_the_prefix_once_and_leaves_nothing(
    backend: LocalSandboxBackend, root: Path
) -> None:
    """A FIFO stopped the freeze with a plain ``SandboxError``: the unit was retried (and
    charged) as a fault of the infrastructure, to fail the same way each time."""
    box = _box(backend)
    _run(backend, box, "import os; os.mkdir('/work/workspace/0'); os.mkfifo('/work/workspace/0/p')")
    files = _Files(backend, LocalArtifactStore(root / "art"), None, "run-1", freeze=True)
    with pytest.raises(ApplicationError, match=r"'0/p' is a 'p'-type special file") as raised:
        files.read(box)
    assert raised.value.non_retryable and raised.value.type == ExperimentErrorType.prefix_failed
    assert (Path(backend.workspace_folder(box)) / "0").is_dir()  # the workspace as it was
    _nothing_left(backend, root)


def test_a_tree_nested_thousands_deep_is_refused_and_its_box_deleted(
    backend: LocalSandboxBackend, root: Path
) -> None:
    """3,000 nested folders: the freeze failed on a path too long for the host
    (``OSError``, retried), the overlay was not mounted back and the copy's files were
    left in the store; deleting the box raised ``RecursionError`` and left it for ever."""
    box = _box(backend)
    _run(
        backend,
        box,
        """
        import os
        open("/work/workspace/keep.txt", "w").write("kept")
        os.chdir("/work/workspace")
        for _ in range(3000):
            os.mkdir("d")
            os.chdir("d")
        open("leaf", "w").write("x")
        """,
    )
    for call in (backend.freeze_workspace, backend.workspace_manifest):
        with pytest.raises(WorkspaceRefusedError, match=r"longer than 1024 bytes"):
            call(box)
    workspace = Path(backend.workspace_folder(box))
    assert (workspace / "keep.txt").read_text() == "kept"  # mounted (or put) back as it was
    assert [p.name for p in backend.workspaces.layers.root.iterdir()] == [
        backend.workspaces.layers.empty()
    ]
    _nothing_left(backend, root)


@pytest.mark.parametrize(
    "name",
    [
        b"ok\n| forged | 9 | row |\n## Verdicts",
        b"esc\x1b]0;owned\x07\x1b[2J",
        b"not-utf8-\xff\xfe",
        "sep\u2028line".encode(),
    ],
)
def test_a_name_that_is_not_one_printable_line_is_refused(
    backend: LocalSandboxBackend, root: Path, name: bytes
) -> None:
    """A name with a line break or an escape went as it was into manifests and the report
    (``forklab report`` writes the paths into ``report.md``); one that is not UTF-8 made
    the freeze raise ``PydanticSerializationError`` after it had moved the files into its
    staging folder: the workspace's files were deleted and it was not mounted back."""
    box = _box(backend)
    _run(
        backend,
        box,
        f"""
        import os
        os.mkdir("/work/workspace/0")
        open("/work/workspace/0/keep.txt", "w").write("kept")
        open(b"/work/workspace/0/" + {name!r}, "w").write("x")
        """,
    )
    for call in (backend.freeze_workspace, backend.workspace_manifest):
        with pytest.raises(WorkspaceRefusedError, match=r"not valid UTF-8|one printable line"):
            call(box)
    folder = Path(backend.workspace_folder(box)) / "0"
    assert (folder / "keep.txt").read_text() == "kept"
    with pytest.raises(WorkspaceContentError):  # the runner's digest refuses it too
        folder_digest(folder)
    _nothing_left(backend, root)


def test_a_hard_link_kept_outside_the_workspace_cannot_change_the_layer(
    backend: LocalSandboxBackend, root: Path
) -> None:
    """In the copy fallback the freeze moved the workspace's own inodes into the store: a
    hard link the command kept in its box still reached the sealed file. Writing through
    it changed the layer (its bytes, under every workspace that shares it by content) and
    deleting the box changed its link count, so every later use was refused as
    corrupted."""
    box = _box(backend)
    _run(
        backend,
        box,
        """
        import os
        open("/work/workspace/f", "w").write("v1\\n")
        try:
            os.link("/work/workspace/f", "/work/keep")
        except OSError:  # under an overlay the workspace is another mount: EXDEV
            pass
        """,
    )
    layer = backend.freeze_workspace(box).digest
    backend.workspaces.layers.verify(layer, full=True)
    _run(
        backend,
        box,
        "import os\nif os.path.exists('/work/keep'): open('/work/keep', 'r+').write('XX')",
    )
    backend.delete(box)
    backend.workspaces.layers.verify(layer, full=True)  # same bytes, same seal
    snapshot = backend.prepare_snapshot(bundle_files("counter-recovery"))
    other = backend.create(snapshot.id, {"x": "other"}, Limits())
    info = backend.attach_workspace(other, layer)
    assert (Path(info.target) / "f").read_text() == "v1\n"
    _nothing_left(backend, root)


def test_a_path_with_a_pipe_or_backticks_stays_in_its_cell_of_the_report() -> None:
    """The report's Workspaces table put each changed path in a plain code span: a `|` in a
    path split the row into more cells, and a backtick closed the span early."""
    hostile = ["a|b", "x``y", "`lead", "ok.txt"]
    world = WorldWorkspace(
        world="retry",
        layers=(),
        files_at_branch=1,
        bytes_at_branch=1,
        files_at_end=1,
        bytes_at_end=1,
        added=4,
        removed=0,
        changed=0,
        unchanged=0,
        episodes_diverged=1,
        paths=tuple(PathChange(path=p, added=1, changed=0, removed=0) for p in hostile),
        end_manifest="0" * 64,
    )
    section = WorkspaceSection(episodes=1, branch_manifest="0" * 64, files=(), worlds=(world,))
    lines = workspace_markdown(section)
    header = next(line for line in lines if line.startswith("| world |"))
    row = next(line for line in lines if line.startswith("| retry |"))
    cells = re.split(r"(?<!\\)\|", row)
    assert len(cells) == len(re.split(r"(?<!\\)\|", header))
    assert cells[-2].strip() == ("`a\\|b` ×1, ```x``y``` ×1, `` `lead `` ×1, `ok.txt` ×1")


def test_a_workspace_of_too_many_paths_is_refused_before_the_worker_holds_them(
    backend: LocalSandboxBackend, root: Path
) -> None:
    """Empty files cost a sandbox no disk quota, and the worker held an entry per path
    (100,001 files: 259 MiB); nothing bounded their number. The store's bound is lowered
    here to keep the test quick; the walk stops at it whatever it is."""
    backend.workspaces.layers.max_entries = 100
    box = _box(backend)
    _run(
        backend,
        box,
        "import os\nos.mkdir('/work/workspace/0')\n"
        "for i in range(100): open(f'/work/workspace/0/f{i}', 'w').close()",
    )  # 101 paths: the folder and its files
    for call in (backend.freeze_workspace, backend.workspace_manifest):
        with pytest.raises(WorkspaceRefusedError, match=r"more than 100 paths"):
            call(box)
    files = _Files(backend, LocalArtifactStore(root / "art"), None, "run-1", freeze=True)
    with pytest.raises(ApplicationError, match=r"more than 100 paths") as raised:
        files.read(box)
    assert raised.value.non_retryable and raised.value.type == ExperimentErrorType.prefix_failed
    workspace = Path(backend.workspace_folder(box))
    assert len(list((workspace / "0").iterdir())) == 100  # the workspace as it was
    _run(backend, box, "import os; os.remove('/work/workspace/0/f0')")  # 100 paths: enough
    assert backend.freeze_workspace(box).files == 99
    _nothing_left(backend, root)


def test_a_mounted_workspace_is_nosuid_and_nodev(backend: LocalSandboxBackend) -> None:
    """A sandbox can leave a setuid file of its own uid in its workspace; the host's mount
    of it honoured setuid bits and device nodes for whoever reached it."""
    box = _box(backend)
    if backend.workspaces.info(box).mode != "overlay":
        pytest.skip("a copied workspace is no mount")
    target = os.path.realpath(backend.workspace_folder(box))
    with open("/proc/self/mountinfo") as mountinfo:
        options = next(
            line.split()[5].split(",") for line in mountinfo if line.split()[4] == target
        )
    assert {"nosuid", "nodev"} <= set(options)


def test_a_tree_holding_the_names_remove_tree_moves_to_is_still_deleted(tmp_path: Path) -> None:
    """``remove_tree`` moves nested folders up as ``.flat-N``: a sandbox that made a
    ``.flat-1`` of its own made that move fail (``ENOTEMPTY``), and its box could never be
    deleted."""
    tree = tmp_path / "workspace"
    (tree / ".flat-1").mkdir(parents=True)
    (tree / ".flat-1" / "kept").write_text("x")
    (tree / ".flat-2").write_text("a file")
    (tree / "a" / "b" / "c").mkdir(parents=True)
    remove_tree(tree)
    assert not tree.exists()


WHITEOUT_PROBE = """
import ctypes, errno, os, stat
os.chdir("/work/workspace")
tried = {}
for name, mode in (("whiteout", stat.S_IFCHR), ("block", stat.S_IFBLK)):
    try:
        os.mknod(name, mode | 0o600, os.makedev(0, 0))
        tried[name] = "made"
    except OSError as exc:
        tried[name] = errno.errorcode[exc.errno]
open("victim", "w").close()
libc = ctypes.CDLL(None, use_errno=True)
RENAME_WHITEOUT = 4
AT_FDCWD = -100
done = libc.renameat2(AT_FDCWD, b"victim", AT_FDCWD, b"moved", RENAME_WHITEOUT)
tried["rename_whiteout"] = "made" if done == 0 else errno.errorcode[ctypes.get_errno()]
os.mkfifo("fifo")  # a FIFO is still the workload's to make (and the freeze's to refuse)
os.remove("fifo")
print(tried)
assert tried == {"whiteout": "EPERM", "block": "EPERM", "rename_whiteout": "EPERM"}, tried
"""


def test_a_box_cannot_make_whiteouts_or_device_nodes(
    backend: LocalSandboxBackend, root: Path
) -> None:
    """The kernel lets any user make a whiteout (``mknod c 0 0``, ``RENAME_WHITEOUT``)
    since Linux 5.8; a copied workspace sealed it as a whiteout entry, which deletes the
    path from every workspace stacked on the layer. Boxes run under a seccomp filter that
    answers both with ``EPERM`` (a FIFO is still allowed), as docs/security.md says."""
    box = _box(backend)
    ran = run_python(backend, box, WHITEOUT_PROBE, timeout=120)
    assert ran.exit_code == 0, ran.stdout + ran.stderr
    assert backend.freeze_workspace(box).files == 1  # `victim` (not renamed), no whiteout
    if backend.workspaces.info(box).mode != "overlay":
        # and a copied workspace refuses one at collection (a box without bubblewrap, or
        # anyone with the worker's rights, can still make it): the freeze names it
        folder = Path(backend.workspace_folder(box))
        os.mknod(folder / "planted", stat.S_IFCHR | 0o600, os.makedev(0, 0))
        with pytest.raises(WorkspaceRefusedError, match=r"'planted' is a 'c'-type special"):
            backend.freeze_workspace(box)
        assert sorted(os.listdir(folder)) == ["planted", "victim"]  # as it was
    _nothing_left(backend, root)
