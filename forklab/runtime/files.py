"""Files of an episode: the digest of its folder, and copies of it for forks.

A workload that declares ``has_workspace`` keeps part of its state as files: each episode
gets a folder (``Workload.workspace``). At the boundary the folder's content is digested
(``folder_digest``: every path, and each file's size and sha256, never time stamps or
owners, so the local twin and a sandbox agree on the same bytes) and that digest joins the
state's sha256 into the checkpoint's identity (``checkpoint_digest``). Every world that
continues the episode digests the folder it was given before it touches it, so a world
that saw other files than the prefix left reports another inherited checkpoint and the
``common_checkpoints`` validity check fails. Standard library only: this file ships
inside every sandbox bundle.
"""

from __future__ import annotations

import hashlib
import os
import stat
from typing import TYPE_CHECKING

from forklab.runtime.canon import digest

if TYPE_CHECKING:
    from pathlib import Path  # (every box imports this file; few have a workspace)

_CHUNK = 1 << 20
#: An episode folder with more entries than this is refused (a runaway workload).
MAX_ENTRIES = 100_000
#: The longest path (in UTF-8 bytes) a workspace may hold, relative to its root. The host
#: sees it under a longer prefix (the layer store) and PATH_MAX is 4096: a deeper tree
#: could be written in a box but not frozen, hashed or deleted by ordinary path calls.
MAX_PATH_BYTES = 1024


class WorkspaceContentError(ValueError):
    """An episode folder holds something a checkpoint cannot pin (a device, a fifo, too
    many entries); the message names the path."""


def check_path(path: str) -> None:
    """Refuse a workspace path that is not one printable line of UTF-8, or is too long.

    A name with a line break or an escape would forge lines in a report or drive the
    terminal that shows it; one that is not UTF-8 (Python's lone surrogates) cannot be
    written as JSON at all."""
    try:
        size = len(path.encode())
    except UnicodeEncodeError:
        raise WorkspaceContentError(
            f"workspace path {path!a} is not valid UTF-8; rename it"
        ) from None
    if not path.isprintable():
        raise WorkspaceContentError(
            f"workspace path {path!a} holds a line break, an escape or another control "
            "character; a path must be one printable line"
        )
    if size > MAX_PATH_BYTES:
        raise WorkspaceContentError(
            f"workspace path {path[:80]!a}... is longer than {MAX_PATH_BYTES} bytes "
            "(a tree nested too deep); shorten it"
        )


def check_folder(folder: Path) -> None:
    """Refuse ``folder`` unless it is a folder itself, not a symlink to one: reading
    through a link would read (and copy) what it points at on the host."""
    if not stat.S_ISDIR(os.lstat(folder).st_mode):
        raise WorkspaceContentError(
            f"{folder} is not a folder (a symlink or a file in its place); "
            "a workspace and each episode's folder must be real folders"
        )


def checkpoint_digest(state_sha256: str, workspace: str | None) -> str:
    """A checkpoint's identity: the state's sha256 alone, or with the digest of the files
    (a content digest or a sealed layer) that belong to it."""
    if workspace is None:
        return state_sha256
    return digest({"state": state_sha256, "workspace": workspace})


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def folder_entries(folder: Path) -> list[list[str | int]]:
    """``[path, "dir"]``, ``[path, "link", target]`` or ``[path, size, sha256]`` for
    everything below ``folder``, sorted by path (``/``-separated, relative). Links are
    recorded, never followed; ``folder`` itself must be a real folder."""
    check_folder(folder)
    entries: list[list[str | int]] = []
    stack = [("", str(folder))]
    while stack:
        rel, here = stack.pop()
        with os.scandir(here) as it:
            for e in it:
                path = rel + e.name
                check_path(path)
                st = e.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    entries.append([path, "dir"])
                    stack.append((path + "/", e.path))
                elif stat.S_ISLNK(st.st_mode):
                    entries.append([path, "link", os.readlink(e.path)])
                elif stat.S_ISREG(st.st_mode):
                    entries.append([path, st.st_size, _sha256(e.path)])
                else:
                    raise WorkspaceContentError(
                        f"workspace path {path!r} is a special file; an episode's folder may "
                        "hold only files, folders and symlinks"
                    )
                if len(entries) > MAX_ENTRIES:
                    raise WorkspaceContentError(
                        f"the episode's folder holds more than {MAX_ENTRIES} entries"
                    )
    entries.sort(key=lambda e: str(e[0]))
    return entries


def folder_digest(folder: Path) -> str:
    """sha256 of ``folder_entries`` (canonical JSON): what the files of an episode are."""
    return digest(folder_entries(folder))


class FolderFork:
    """Hands out ``copies`` folders with the content of ``source``, one at a time: copies
    in ``scratch`` and, when ``own``, the last one is ``source`` itself (no copy, as the
    last state a ``_Fork`` hands out is the parsed state). A copy is removed when the next
    one is taken or at ``close``. Without ``own`` the source is never written."""

    __slots__ = ("_last", "_left", "_n", "_own", "_scratch", "_source")

    def __init__(self, source: Path, copies: int, scratch: Path, own: bool) -> None:
        self._source = source
        self._left = copies
        self._scratch = scratch
        self._own = own
        self._last: Path | None = None
        self._n = 0

    def take(self) -> Path:
        self._drop()
        self._left -= 1
        if self._left < 0:
            raise RuntimeError("more folders taken than announced")
        if self._left == 0 and self._own:
            return self._source
        import shutil  # here: only a workload with a workspace forks folders

        self._n += 1
        copy = self._scratch / f"fork-{os.getpid()}-{self._n}"
        shutil.copytree(self._source, copy, symlinks=True)
        self._last = copy
        return copy

    def _drop(self) -> None:
        if self._last is not None:
            import shutil

            shutil.rmtree(self._last, ignore_errors=True)
            self._last = None

    def close(self) -> None:
        self._drop()
