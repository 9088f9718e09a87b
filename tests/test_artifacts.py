"""The content-addressed artifact store on a real folder: round trips, idempotent puts,
damage detected on read, and concurrent writers of the same blob."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from forklab.activities.stores.artifacts import ArtifactError, LocalArtifactStore, run_name
from forklab.runtime.canon import canonical_json
from tests.helpers import ROOT


@pytest.fixture
def store(tmp_path: Path) -> LocalArtifactStore:
    return LocalArtifactStore(tmp_path / "artifacts")


def test_bytes_round_trip_under_their_sha256(store: LocalArtifactStore) -> None:
    data = b"checkpoint\x00bytes"
    digest = store.put_bytes(data)
    assert digest == hashlib.sha256(data).hexdigest()
    assert store.path(digest).is_file()
    assert store.path(digest) == store.root / digest[:2] / digest[2:]
    assert store.get_bytes(digest) == data


def test_json_is_stored_canonically(store: LocalArtifactStore) -> None:
    value = {"b": [1, 2.5, None], "a": {"z": True, "y": "ü"}}
    digest = store.put_json(value)
    assert store.get_json(digest) == value
    assert store.get_bytes(digest) == canonical_json(value).encode()
    assert store.put_json({"a": {"y": "ü", "z": True}, "b": [1, 2.5, None]}) == digest


def test_put_is_idempotent_and_leaves_no_temporary_files(store: LocalArtifactStore) -> None:
    first = store.put_bytes(b"same")
    mtime = store.path(first).stat().st_mtime_ns
    assert store.put_bytes(b"same") == first
    assert store.path(first).stat().st_mtime_ns == mtime
    files = [p for p in store.root.rglob("*") if p.is_file()]
    assert files == [store.path(first)]


def test_corrupt_artifact_is_detected_and_repaired_by_a_new_put(store: LocalArtifactStore) -> None:
    digest = store.put_bytes(b"the real outcomes")
    store.path(digest).write_bytes(b"tampered outcomes")
    with pytest.raises(ArtifactError, match=f"artifact {digest} is corrupt"):
        store.get_bytes(digest)
    assert store.put_bytes(b"the real outcomes") == digest
    assert store.get_bytes(digest) == b"the real outcomes"


def test_missing_and_malformed_digests_are_clear_errors(store: LocalArtifactStore) -> None:
    absent = hashlib.sha256(b"never stored").hexdigest()
    assert not store.path(absent).is_file()
    with pytest.raises(ArtifactError, match="is missing from"):
        store.get_bytes(absent)
    with pytest.raises(ArtifactError, match="not a sha256 hex digest"):
        store.get_bytes("../../etc/passwd")


WRITER = """
import sys
from pathlib import Path
from forklab.activities.stores.artifacts import LocalArtifactStore
store = LocalArtifactStore(Path(sys.argv[1]))
blob = bytes(range(256)) * 4096
for i in range(40):
    store.put_bytes(blob)
    store.put_json({"writer": sys.argv[2], "i": i})
"""


def test_concurrent_writers_store_every_blob_intact(store: LocalArtifactStore) -> None:
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(store.root), name], cwd=ROOT)
        for name in ("a", "b")
    ]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    shared = store.put_bytes(bytes(range(256)) * 4096)
    assert store.get_bytes(shared) == bytes(range(256)) * 4096
    for name in ("a", "b"):
        for i in range(40):
            digest = store.put_json({"writer": name, "i": i})
            assert store.get_json(digest) == {"writer": name, "i": i}
    assert not [p for p in store.root.rglob(".*") if p.is_file()]


def test_end_marks_name_runs_by_hash_and_answer_only_for_run_names(
    store: LocalArtifactStore,
) -> None:
    store.mark_ended("wf/../../run")
    name = run_name("wf/../../run")
    assert store.mark_path(name) == store.root / "ended" / name and store.mark_path(name).is_file()
    other = run_name("wf/other")
    assert store.ended([name, other, "../ended/" + name, name.upper()]) == {name}
    store.mark_ended("wf/../../run")  # again: no error, one mark
    assert [p.name for p in (store.root / "ended").iterdir()] == [name]
