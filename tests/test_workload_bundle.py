"""Workloads travel with the experiment: ``forklab start`` bundles the workload's package,
or its module with the siblings, where the operator runs it; workers unpack the bundle
from the artifact store with path checks and its digest verified, and need no
``PYTHONPATH``. Bad bundles are refused with one sentence, before any compute."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from orchestration_lab import FORKLAB, ROOT, Lab, cli_env, make_spec
from temporalio.client import WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode

from forklab.activities.experiment.approval_keys import key_path
from forklab.activities.experiment.workload_bundles import (
    WorkloadBundleError,
    WorkloadBundles,
    ship_workload,
)
from forklab.activities.stores.artifacts import LocalArtifactStore
from forklab.cli.experiment.workload_files import collect_workload
from forklab.experiments.experiment.bundle import (
    MAX_BUNDLE_BYTES,
    MAX_BUNDLE_FILES,
    MAX_FILE_BYTES,
    BundleError,
    read_manifest,
    workload_sources,
)
from forklab.runtime.canon import digest, sha256_hex
from forklab.workflows.experiment.messages import (
    ExperimentInput,
    ExperimentResult,
    Stage,
    Status,
    workflow_id,
)
from forklab.workflows.experiment.workflow import ExperimentWorkflow
from tests.helpers import forklab_in_process, run_cli

# --- the manifest (pure) ------------------------------------------------------------------


def test_the_manifest_is_content_addressed_and_order_free() -> None:
    files = {"pkg/__init__.py": b"", "pkg/odds.py": b"P = 0.5\n", "pkg/workload.py": b"x = 1\n"}
    bundle = workload_sources(files)
    again = workload_sources(dict(reversed(list(files.items()))))
    assert bundle == again
    assert bundle.manifest() == [
        ["pkg/__init__.py", sha256_hex(b""), 0],
        ["pkg/odds.py", sha256_hex(b"P = 0.5\n"), 8],
        ["pkg/workload.py", sha256_hex(b"x = 1\n"), 6],
    ]
    assert bundle.digest == digest(bundle.manifest())
    changed = workload_sources(files | {"pkg/odds.py": b"P = 0.6\n"})
    assert changed.digest != bundle.digest


@pytest.mark.parametrize(
    ("relpath", "sentence"),
    [
        (
            "../escape.py",
            "bundle path '../escape.py' climbs out of the bundle's root ('..')",
        ),
        (
            "pkg/../../escape.py",
            "bundle path 'pkg/../../escape.py' climbs out of the bundle's root ('..')",
        ),
        (
            "/etc/escape.py",
            "bundle path '/etc/escape.py' is absolute; paths in a bundle are relative to its root",
        ),
        (
            "pkg/data.json",
            "bundle path 'pkg/data.json' is not a Python module path (folders and file named "
            "like identifiers, the file ending in .py, at most 400 characters)",
        ),
        (
            "forklab/runtime/runner.py",
            "bundle path 'forklab/runtime/runner.py' lies in forklab/, ForkLab's own "
            "package, which a workload may not replace; rename the workload's package",
        ),
    ],
)
def test_paths_that_leave_the_bundle_or_replace_forklab_are_refused(
    relpath: str, sentence: str
) -> None:
    with pytest.raises(BundleError) as caught:
        workload_sources({"pkg/__init__.py": b"", relpath: b"x = 1\n"})
    assert str(caught.value) == sentence


def test_oversized_files_and_bundles_are_refused_naming_the_file_and_the_limit() -> None:
    big = b"#" * (MAX_FILE_BYTES + 1)
    with pytest.raises(BundleError) as caught:
        workload_sources({"pkg/__init__.py": b"", "pkg/table.py": big})
    assert str(caught.value) == (
        f"workload file pkg/table.py is {MAX_FILE_BYTES + 1:,} bytes, over the "
        f"{MAX_FILE_BYTES:,}-byte (1 MiB) limit per bundled file; make it smaller or move it "
        "out of the bundle"
    )
    chunk = b"#" * MAX_FILE_BYTES
    many = {f"pkg/part{i:02}.py": chunk for i in range(MAX_BUNDLE_BYTES // MAX_FILE_BYTES + 1)}
    with pytest.raises(BundleError) as caught:
        workload_sources(many)
    last = sorted(many)[-1]
    assert str(caught.value) == (
        f"the workload bundle passes its {MAX_BUNDLE_BYTES:,}-byte (8 MiB) limit at {last} "
        f"({MAX_BUNDLE_BYTES + MAX_FILE_BYTES:,} bytes so far); move what the workload does "
        "not import out of its folder, or make the workload a package of its own"
    )
    crowd = {f"pkg/m{i:04}.py": b"" for i in range(MAX_BUNDLE_FILES + 1)}
    with pytest.raises(BundleError, match=f"limit of {MAX_BUNDLE_FILES:,} files at pkg/m1000"):
        workload_sources(crowd)


def test_a_manifest_read_back_is_checked_like_files_and_against_its_digest() -> None:
    bundle = workload_sources({"pkg/__init__.py": b"", "pkg/workload.py": b"x = 1\n"})
    assert read_manifest(bundle.manifest(), bundle.digest) == bundle
    other = workload_sources({"pkg/__init__.py": b"", "pkg/workload.py": b"x = 2\n"})
    with pytest.raises(BundleError) as caught:
        read_manifest(other.manifest(), bundle.digest)
    assert str(caught.value) == (
        f"workload bundle {bundle.digest[:12]} hashes to {other.digest[:12]}; it was changed "
        "after it was shipped, start the experiment again"
    )
    evil = [["../../etc/cron.py", "0" * 64, 1]]
    with pytest.raises(BundleError, match="climbs out of the bundle's root"):
        read_manifest(evil, digest(evil))
    with pytest.raises(BundleError, match="entry 1 is not \\[path, sha256, size\\]"):
        read_manifest([["pkg/a.py", "0" * 64, True]], "f" * 64)
    twice = [["pkg/a.py", "0" * 64, 1], ["pkg/a.py", "0" * 64, 1]]
    with pytest.raises(BundleError, match=r"'pkg/a\.py' is out of order or twice"):
        read_manifest(twice, digest(twice))


# --- collecting the files where the operator runs -----------------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for relpath, text in files.items():
        path = root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_a_package_is_bundled_whole_and_a_module_with_its_siblings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(
        tmp_path,
        {
            "bpkg/__init__.py": "",
            "bpkg/workload.py": "from bpkg import odds\n",
            "bpkg/odds.py": "P = 0.5\n",
            "bpkg/sub/__init__.py": "",
            "bpkg/sub/deep.py": "D = 1\n",
            "bpkg/data.json": "{}",  # not a module: not bundled
            "bpkg/notes/readme.py": "",  # a folder that is no package: not bundled
            "bpkg/.hidden.py": "",
            "bpkg/__pycache__/odds.cpython-312.pyc": "",
            "bmod.py": "import bsib\n",
            "bsib.py": "S = 1\n",
            "bsibpkg/__init__.py": "",
            "not a module.py": "",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert sorted(collect_workload("bpkg.workload:W") or {}) == [
        "bpkg/__init__.py",
        "bpkg/odds.py",
        "bpkg/sub/__init__.py",
        "bpkg/sub/deep.py",
        "bpkg/workload.py",
    ]
    siblings = collect_workload("bmod:W") or {}
    assert sorted(siblings) == [
        "bmod.py",
        "bpkg/__init__.py",
        "bpkg/odds.py",
        "bpkg/sub/__init__.py",
        "bpkg/sub/deep.py",
        "bpkg/workload.py",
        "bsib.py",
        "bsibpkg/__init__.py",
    ]
    assert siblings["bsib.py"] == b"S = 1\n"
    assert collect_workload("retry-cascade") is None  # built in: ships with ForkLab


def test_links_out_of_the_folder_and_device_files_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = tmp_path / "secret.py"
    outside.write_text("TOKEN = 'x'\n")
    root = tmp_path / "proj"
    _write(root, {"lpkg/__init__.py": "", "lpkg/workload.py": "", "lpkg/real.py": "R = 1\n"})
    monkeypatch.syspath_prepend(str(root))
    (root / "lpkg" / "inside.py").symlink_to(root / "lpkg" / "real.py")  # stays inside: fine
    assert (collect_workload("lpkg.workload:W") or {})["lpkg/inside.py"] == b"R = 1\n"

    (root / "lpkg" / "leak.py").symlink_to(outside)
    with pytest.raises(BundleError) as caught:
        collect_workload("lpkg.workload:W")
    assert str(caught.value) == (
        f"workload file {root / 'lpkg' / 'leak.py'} is a link to {outside}, outside "
        f"{root / 'lpkg'}; a bundle holds only what lies in the workload's folder: copy the "
        "file in"
    )
    (root / "lpkg" / "leak.py").unlink()
    os.mkfifo(root / "lpkg" / "pipe.py")  # reading it would block forever
    with pytest.raises(BundleError) as caught:
        collect_workload("lpkg.workload:W")
    assert str(caught.value) == (
        f"workload file {root / 'lpkg' / 'pipe.py'} is not a regular file (a device, pipe or "
        "socket); remove it from the workload's folder"
    )


def test_an_oversized_sibling_stops_the_bundle_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path, {"omod.py": "", "table.py": "#" * (MAX_FILE_BYTES + 1)})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BundleError, match=f"workload file {tmp_path / 'table.py'} is 1,048,577"):
        collect_workload("omod:W")


# --- unpacking on a worker ----------------------------------------------------------------


def test_a_worker_unpacks_verified_files_and_rebuilds_a_tampered_copy(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    files = {"upkg/__init__.py": b"", "upkg/workload.py": b"from upkg import odds\n"}
    bundle = ship_workload(store, files)
    bundles = WorkloadBundles(store, tmp_path / "bundles")
    unpacked = bundles.files(bundle.digest)
    assert {f.relpath: f.source.read_bytes() for f in unpacked} == files
    folder = tmp_path / "bundles" / bundle.digest
    assert all(f.source.parent.is_relative_to(folder) for f in unpacked)

    (folder / "upkg" / "workload.py").write_bytes(b"import os; os.system('evil')\n")
    (folder / "upkg" / "extra.py").symlink_to("/etc/passwd")
    again = bundles.files(bundle.digest)  # verified before use: made again from the store
    assert {f.relpath: f.source.read_bytes() for f in again} == files
    assert not (folder / "upkg" / "extra.py").exists()


def test_a_tampered_blob_or_a_hostile_manifest_is_refused(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    bundle = ship_workload(store, {"tpkg/__init__.py": b"", "tpkg/workload.py": b"x = 1\n"})
    entry = bundle.entries[1]
    store.path(entry.sha256).write_bytes(b"x = 666\n")
    bundles = WorkloadBundles(store, tmp_path / "bundles")
    with pytest.raises(WorkloadBundleError) as caught:
        bundles.files(bundle.digest)
    assert str(caught.value) == (
        f"workload bundle {bundle.digest[:12]} cannot be used: file tpkg/workload.py: artifact "
        f"{entry.sha256} is corrupt in {store.location} (it hashes to "
        f"{sha256_hex(b'x = 666' + bytes([10]))}); delete that blob and re-run the step that "
        "produced it"
    )
    hostile = store.put_json([["../../outside.py", store.put_bytes(b"x = 1\n"), 6]])
    with pytest.raises(WorkloadBundleError) as caught:
        bundles.files(hostile)
    assert str(caught.value) == (
        f"workload bundle {hostile[:12]} cannot be used: bundle path '../../outside.py' "
        "climbs out of the bundle's root ('..')"
    )
    assert not (tmp_path / "outside.py").exists()
    assert [p.name for p in (tmp_path / "bundles").iterdir()] == []  # nothing half-done


# --- the durable path ---------------------------------------------------------------------


async def test_a_tampered_bundle_fails_the_run_before_approval_never_retried(lab: Lab) -> None:
    spec = make_spec(episodes=12)
    bundle = lab.ship(spec)
    assert bundle is not None
    manifest = lab.store.get_json(bundle)
    (sha,) = [row[1] for row in manifest if row[0] == "orchestration_workloads.py"]
    lab.store.path(sha).write_bytes(b"raise SystemExit('swapped')\n")
    handle = await lab.client.start_workflow(
        ExperimentWorkflow.run,
        ExperimentInput(spec=spec, rehearsal_episodes=0, workload_bundle=bundle),
        id=workflow_id(spec.id),
        task_queue=lab.settings.task_queue,
        result_type=ExperimentResult,
    )
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    view = await lab.status(handle)
    assert view.status is Status.failed and view.plan is None
    assert view.error is not None
    assert view.error.startswith(
        f"workload bundle {bundle[:12]} cannot be used: file orchestration_workloads.py: "
        f"artifact {sha} is corrupt in "
    )
    history = await handle.fetch_history()
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
    ]
    assert attempts and max(attempts) == 1  # deterministic: never retried
    assert "run_prefixes" not in await lab.activity_types(handle)
    row = lab.ledger.experiment(spec.id)
    assert row is not None and row.workload_bundle == bundle and row.error == view.error


async def test_a_workload_not_built_in_needs_its_bundle(lab: Lab) -> None:
    spec = make_spec(episodes=12)
    handle = await lab.client.start_workflow(
        ExperimentWorkflow.run,
        ExperimentInput(spec=spec, rehearsal_episodes=0),  # as a raw start without one
        id=workflow_id(spec.id),
        task_queue=lab.settings.task_queue,
        result_type=ExperimentResult,
    )
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    assert (await lab.status(handle)).error == (
        "workload 'orchestration_workloads:Toy' is not built into ForkLab and came without its "
        "bundle; start the experiment with forklab start, which bundles it"
    )


#: A newcomer's package: the support-ticket workload of ``newcomer_workloads`` (copied
#: in as a module of the package), and a workload that imports two sibling modules.
TICKETS = (Path(__file__).with_name("newcomer_workloads.py")).read_text()
NEWCOMER = {
    "ticketlab/__init__.py": '"""A support desk, as a newcomer writes it: a package."""\n',
    "ticketlab/tickets.py": TICKETS,
    "ticketlab/odds.py": "ESCALATED = {'factor': 0.8}\n",
    "ticketlab/workload.py": """
        from ticketlab import odds
        from ticketlab.tickets import SupportTicket


        class Desk(SupportTicket):
            interventions = {"escalate": odds.ESCALATED}
        """,
}
#: The same workload as a top-level module that imports its sibling modules.
NEWCOMER_MODULE = {
    "desk.py": NEWCOMER["ticketlab/workload.py"]
    .replace("from ticketlab import odds", "import desk_odds as odds")
    .replace("from ticketlab.tickets import", "from desk_tickets import"),
    "desk_odds.py": NEWCOMER["ticketlab/odds.py"],
    "desk_tickets.py": TICKETS,
}
LAYOUTS = {
    "package": (NEWCOMER, "ticketlab.workload:Desk", 4),
    "module with siblings": (NEWCOMER_MODULE, "desk:Desk", 3),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
async def test_a_newcomer_workload_with_a_sibling_import_runs_durably_without_pythonpath(
    lab: Lab, tmp_path: Path, layout: str
) -> None:
    """Started from a folder the worker does not have on its path, with no PYTHONPATH: the
    bundle carries the package (or the module and its sibling), and the durable run gives
    ``forklab plan``'s outcomes and code digest."""
    files, name, count = LAYOUTS[layout]
    project = tmp_path / "project"
    _write(project, files)
    experiment = f"desk-{count}"
    spec = {
        "id": experiment,
        "hypothesis": {
            "text": "escalating solves more tickets",
            "expected": {"escalate": "decrease"},
        },
        "seed": 5,
        "episodes": 24,
        "workload": {"name": name, "params": {}},
        "worlds": [
            {"name": "baseline", "role": "baseline"},
            {"name": "escalate", "role": "treatment", "intervention": {"name": "escalate"}},
        ],
        "budget": {"max_world_seconds": 300, "max_concurrent_sandboxes": 2},
    }
    (project / "desk.yaml").write_text(yaml.safe_dump(spec))
    assert importlib.util.find_spec(name.split(".")[0].split(":")[0]) is None  # not on our path
    assert not any(str(project) in p for p in sys.path)
    env = {k: v for k, v in cli_env(lab.settings).items() if k != "PYTHONPATH"}

    async def forklab(*args: str) -> subprocess.CompletedProcess[str]:
        """The real CLI, in a thread: the worker answers it from this test's event loop. A
        process, not the CLI in this one: the subject is a project on the CLI's import path
        and on no path of the worker's (which runs in this process)."""
        return await asyncio.to_thread(
            subprocess.run,
            [FORKLAB, *args],
            env=env,
            cwd=project,
            capture_output=True,
            text=True,
            timeout=120,
        )

    planned = await forklab("plan", "desk.yaml", "--json")
    assert planned.returncode == 0, planned.stderr
    twin = json.loads(planned.stdout)
    started = await forklab(
        "start", "desk.yaml", "--batch-episodes", "12", "--rehearsal-episodes", "4"
    )
    assert started.returncode == 0, started.stderr
    bundle = twin["experiment"]["workload_bundle"]
    assert f"workload bundle {bundle} ({count} files, " in started.stdout
    handle = lab.client.get_workflow_handle(workflow_id(experiment), result_type=ExperimentResult)
    view = await lab.wait_for(handle, Stage.awaiting_approval, timeout=120)
    assert view.error is None and view.plan is not None
    assert view.plan.snapshot.workload_bundle == bundle
    metadata = await handle.query("__temporal_workflow_metadata")
    assert f"- workload bundle: `{bundle}`" in metadata.current_details  # the Web UI's
    assert view.plan.snapshot.code_digest == twin["experiment"]["code_digest"]
    assert key_path(lab.settings.home, handle.id, view.approval.run_id).is_file()
    approved = await forklab("approve", experiment, "--approver", "kim")
    assert approved.returncode == 0, approved.stderr
    result = await handle.result()
    assert result.status is Status.completed, result.error
    assert result.analysis is not None
    worlds = [(w.name, w.status, w.episodes, w.error) for w in result.analysis.worlds]
    assert worlds == [(w, "completed", 24, None) for w in ("baseline", "escalate")], worlds
    assert result.analysis.outcomes_digest == twin["outcomes_digest"]
    report = lab.store.get_json(result.analysis.report_digest)
    assert report["experiment"]["workload_bundle"] == bundle
    assert report["experiment"]["code_digest"] == twin["experiment"]["code_digest"]
    row = lab.ledger.experiment(experiment)
    assert row is not None and row.workload_bundle == bundle
    markdown = lab.store.get_bytes(result.analysis.markdown_digest).decode()
    assert markdown.count("| workload bundle |") == 1, markdown  # once, in the provenance
    assert f"| workload bundle | `{bundle}` (shipped by forklab start) |" in markdown


def test_the_flaky_tool_example_plans_without_pythonpath(tmp_path: Path) -> None:
    # a fresh process: the subject is the import path it starts with (no PYTHONPATH)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["FORKLAB_HOME"] = str(tmp_path / "home")
    done = subprocess.run(
        [FORKLAB, "plan", str(ROOT / "examples" / "flaky-tool.yaml"), "--json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["experiment"]["workload"] == "flaky_tool:FlakyTool"
    assert len(report["experiment"]["workload_bundle"]) == 64


async def test_start_refuses_a_bundle_it_cannot_ship_before_anything_starts(
    lab: Lab, tmp_path: Path
) -> None:
    """One sentence naming the file and the limit, exit 2; no workflow, no key, no blob."""
    project = tmp_path / "project"
    _write(project, NEWCOMER)
    table = project / "ticketlab" / "table.py"
    table.write_text("#" * (MAX_FILE_BYTES + 1))
    spec = yaml.safe_load((ROOT / "examples" / "flaky-tool.yaml").read_text())
    spec |= {"id": "desk-too-big", "workload": {"name": "ticketlab.workload:Desk", "params": {}}}
    spec["worlds"][1]["intervention"]["name"] = "escalate"
    spec["hypothesis"]["expected"] = {"backup": "decrease"}
    (project / "desk.yaml").write_text(yaml.safe_dump(spec))
    env = {k: v for k, v in cli_env(lab.settings).items() if k != "PYTHONPATH"}
    done = await asyncio.to_thread(forklab_in_process, env, "start", "desk.yaml", cwd=project)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"forklab: error: desk.yaml: field workload.name: workload file {table} is "
        f"{MAX_FILE_BYTES + 1:,} bytes, over the {MAX_FILE_BYTES:,}-byte (1 MiB) limit per "
        "bundled file; make it smaller or move it out of the bundle\n"
    )
    with pytest.raises(RPCError) as missing:  # never started
        await lab.client.get_workflow_handle(workflow_id("desk-too-big")).describe()
    assert missing.value.status is RPCStatusCode.NOT_FOUND
    assert not (lab.settings.home / "approval-keys").exists()
    assert not lab.settings.artifacts_dir.exists() or not any(lab.settings.artifacts_dir.iterdir())


def test_a_workload_found_nowhere_says_where_forklab_looks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = yaml.safe_load((ROOT / "examples" / "flaky-tool.yaml").read_text())
    spec["workload"]["name"] = "nowhere_to_be_found:FlakyTool"
    path = tmp_path / "lost.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, out, err = run_cli(capsys, "plan", str(path))
    assert (code, out) == (2, "")
    assert err == (
        f"forklab: error: {path}: field workload.name: cannot import module "
        "'nowhere_to_be_found' (No module named 'nowhere_to_be_found'); put it beside the spec "
        "file, run forklab in the folder that holds it, or add that folder to PYTHONPATH\n"
    )
    (tmp_path / "nowhere_to_be_found.py").write_text(
        (ROOT / "examples" / "flaky_tool.py").read_text()
    )
    code, out, err = run_cli(capsys, "plan", str(path), "--json")  # beside the spec: found
    assert code == 0, err
    assert json.loads(out)["experiment"]["workload_bundle"] is not None
