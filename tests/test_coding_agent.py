"""The coding-agent fork (``forklab demo workspace``) and the ``coding-fix`` experiment:
real sandboxes, real overlay mounts, real ``python3 -m unittest`` runs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from itertools import combinations
from pathlib import Path

import pytest
from orchestration_lab import Lab

from forklab.activities.experiment.twin import run_twin
from forklab.activities.experiment.twin_workspace import twin_workspace_section
from forklab.activities.runfork.coding_agent import BLOB, FIXED_MTIME, run_coding_agent_fork
from forklab.activities.sandbox import LocalSandboxBackend
from forklab.activities.sandbox.workspace import mounts_under, unmount_under
from forklab.cli.experiment.experiment_commands import save_report
from forklab.cli.experiment.rehearsal import rehearse
from forklab.cli.experiment.specfile import load_spec
from forklab.experiments.experiment.analysis.pairs import paired_table
from forklab.experiments.experiment.report.model import Report
from forklab.experiments.experiment.workspace_report import PYCACHE, WorkspaceDemoSummary
from forklab.experiments.workspace import ManifestDiff, WorkspaceManifest
from forklab.workflows.experiment.messages import Stage, Status
from forklab.workloads.coding_fix import (
    BUGS,
    CORE_CASES,
    OPTIONAL_CASES,
    STRATEGIES,
    apply_strategy,
    package_files,
    run_suite,
    vendored_chunks,
)
from tests.helpers import ROOT, run_cli

SPEC = ROOT / "forklab" / "workloads" / "coding-fix.yaml"


@pytest.fixture
def backend_root(tmp_path: Path) -> Path:
    yield tmp_path / "sandboxes"
    left = mounts_under(tmp_path)
    unmount_under(tmp_path)
    assert left == [], f"mounts left behind: {left}"


@pytest.mark.skipif(os.geteuid() != 0, reason="overlayfs mounts need root")
def test_the_coding_agent_fork_with_a_50_mib_blob(backend_root: Path, tmp_path: Path) -> None:
    backend = LocalSandboxBackend(backend_root)
    out = tmp_path / "evidence"
    summary = run_coding_agent_fork(backend, out)
    agents = {a.name: a for a in summary.agents}
    assert list(agents) == ["source", *STRATEGIES]
    assert {a.mode for a in summary.agents} == {"overlay"}

    # the blob: 50 MiB, byte-identical in all four, at the branch and at the end
    expected = hashlib.md5(b"".join(vendored_chunks(50 << 20))).hexdigest()
    for a in summary.agents:
        for manifest in (a.branch, a.end):
            blob = manifest.by_path()[BLOB]
            assert (blob.size, blob.md5) == (50 << 20, expected)
    # __pycache__: identical at the branch, and each child's diverged after it re-imported
    caches = [
        {f.path: f.sha256 for f in a.branch.files if PYCACHE in f.path} for a in agents.values()
    ]
    assert caches[0] and all(c == caches[0] for c in caches)
    for name in STRATEGIES:
        diff = agents[name].diverged
        assert [p for p in diff.changed if PYCACHE in p], name
        assert BLOB not in diff.changed
    assert not agents["source"].diverged.diverged  # the parent never changes
    # each child's edit is its own; the tests say what the seed said
    edits = {n: agents[n].edited for n in STRATEGIES}
    assert set(edits["minimal"]) == set(edits["rewrite"]) == {"calc/arith.py"}
    assert set(edits["skip"]) == {"tests/test_arith.py"}
    assert all(edits[a] != edits[b] for a, b in combinations(STRATEGIES, 2))
    assert "return a + b" in edits["minimal"]["calc/arith.py"]
    assert "isinstance" in edits["rewrite"]["calc/arith.py"]
    assert not agents["source"].tests.passed and "failures=3" in agents["source"].tests.verdict
    assert agents["minimal"].tests.passed and agents["rewrite"].tests.passed
    skip = agents["skip"].tests
    assert not skip.passed and skip.unexpected_successes == 1
    # one checkpoint (agent state + frozen layer), inherited by every child
    assert summary.checkpoint.layer is not None
    assert {agents[n].inherited for n in STRATEGIES} == {summary.checkpoint}
    assert summary.figures.children_extra_bytes < 256 * 1024  # folders, not data
    assert all(c.ok for c in summary.checks), [c for c in summary.checks if not c.ok]

    # the evidence on disk
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "changed",
        "minimal-agent.log",
        "rewrite-agent.log",
        "skip-agent.log",
        "source-agent.log",
        "summary.json",
        "summary.md",
    ]
    stored = WorkspaceDemoSummary.model_validate_json((out / "summary.json").read_text())
    assert stored == summary
    assert "unexpected success" in (out / "skip-agent.log").read_text()
    assert (out / "changed" / "minimal" / "calc" / "arith.py").read_text() == edits["minimal"][
        "calc/arith.py"
    ]
    assert "❌" not in (out / "summary.md").read_text()
    assert backend.list({}) == []  # every sandbox deleted


def test_the_copy_fallback_through_the_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "evidence"
    code, stdout, err = run_cli(
        capsys,
        *("demo", "workspace", "--no-overlay", "--blob-mib", "1"),
        *("--home", str(tmp_path / "home"), "--out", str(out)),
    )
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    modes = {a["mode"] for a in summary["agents"]}
    assert modes <= {"copy", "reflink"}
    assert all("overlay disabled" in a["note"] for a in summary["agents"])
    assert all(c["ok"] for c in summary["checks"])
    assert "skip fails by unexpected success" in stdout
    # the edits as diffs (the bug being fixed), not whole files; sizes for people
    minimal = stdout.split("## `calc/arith.py` in minimal", 1)[1].split("## ", 1)[0]
    assert "```diff" in minimal and "-    return a - b\n+    return a + b\n" in minimal
    assert "def mul" not in minimal  # the rest of the file is not repeated
    assert "Workspace: 1.0 MiB" in stdout and not re.search(r"\d bytes", stdout)
    assert mounts_under(tmp_path) == []


def test_plan_writes_the_workspaces_section(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    spec = tmp_path / "coding-fix.yaml"
    spec.write_text(SPEC.read_text().replace("episodes: 400", "episodes: 12"))
    code, stdout, err = run_cli(capsys, "plan", str(spec), "--out", str(tmp_path / "r"))
    assert code == 0, err
    assert "and 9 workspace files" in stdout
    assert "  baseline: 0 changed, 0 added, 0 removed in 0 of 12 episodes" in stdout
    report = Report.model_validate_json((tmp_path / "r" / "report.json").read_text())
    section = report.workspaces
    assert section is not None and section.episodes == 12
    worlds = {w.world: w for w in section.worlds}
    assert (worlds["baseline"].changed, worlds["baseline"].episodes_diverged) == (0, 0)
    assert worlds["skip"].episodes_diverged == 12 and not worlds["skip"].layers
    end = WorkspaceManifest.model_validate_json(
        (tmp_path / "r" / "workspace-skip-end.json").read_text()
    )
    assert end.digest() == worlds["skip"].end_manifest
    markdown = (tmp_path / "r" / "report.md").read_text()
    assert "## Workspaces" in markdown and "Layers forked from" not in markdown


def test_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run_cli(capsys, "demo", "workspace", "--blob-mib", "0", "--home", str(tmp_path))
    assert code == 2
    assert err == "forklab: error: --blob-mib: must be at least 1\n"
    assert not (tmp_path / "sandboxes").exists()


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_the_workload_judges_as_real_unittest_does(bug: str, tmp_path: Path) -> None:
    """The workload's in-process run of the test file against ``python3 -m unittest`` in a
    process of its own, on the same files."""
    cases = (*CORE_CASES, *OPTIONAL_CASES)
    for strategy in (None, *STRATEGIES):
        files = package_files(bug, cases)
        if strategy is not None:
            files = apply_strategy(strategy, files)
        folder = tmp_path / f"{bug}-{strategy}"
        for rel, text in files.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_text(text)
            os.utime(folder / rel, (FIXED_MTIME, FIXED_MTIME))
        real = subprocess.run(
            ["python3", "-m", "unittest", "-q", "tests.test_arith"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=60,
        )
        model = run_suite(folder)
        assert (real.returncode == 0) == model["passed"], (bug, strategy, real.stderr)
        assert len(model["tests"]) == len(cases)
        if model["unexpected"]:
            assert f"unexpected successes={len(model['unexpected'])}" in real.stderr
        assert "calc.arith" not in sys.modules  # the workload's run left no module behind


def test_strategies_as_worlds_count_rescues_and_harms() -> None:
    spec = load_spec(str(SPEC)).model_copy(update={"episodes": 200})
    batch = run_twin(spec).batch
    base = batch["worlds"]["baseline"]["outcomes"]
    counts = {name: paired_table(base, batch["worlds"][name]["outcomes"]) for name in STRATEGIES}
    # minimal: rescues the subtraction bug only and cannot harm (it edits nothing else)
    assert counts["minimal"].rescue > 0 and counts["minimal"].harm == 0
    # rewrite: rescues every bug, harms the suites that add strings
    assert counts["rewrite"].rescue > counts["minimal"].rescue and counts["rewrite"].harm > 0
    # skip: green by marking tests, and harms whenever one passes by accident
    assert counts["skip"].rescue > 0 and counts["skip"].harm > 0


async def test_the_experiment_runs_through_the_durable_path(lab: Lab, tmp_path: Path) -> None:
    spec = load_spec(str(SPEC)).model_copy(update={"id": "flow-coding-fix", "episodes": 40})
    handle, token = await lab.start(spec, batch_episodes=20, rehearsal_episodes=10)
    view = await lab.wait_for(handle, Stage.awaiting_approval)
    assert view.plan is not None and lab.sandbox_folders() == []
    await lab.approve(handle, token, approver="alice")
    result = await handle.result()
    assert result.status is Status.completed, result.error
    assert result.analysis is not None
    assert result.analysis.outcomes_digest == rehearse(spec).outcomes_digest
    assert result.cleanup is not None and result.cleanup.left == 0
    assert lab.backend.workspaces.live_layers() == set()  # the run released its layers

    # the state evidence: per world, the files at the branch and at the end, what diverged
    report = Report.model_validate(lab.store.get_json(result.analysis.report_digest))
    assert report.valid, [c for c in report.checks if not c.passed]
    section = report.workspaces
    assert section is not None and section.episodes == 40
    worlds = {w.world: w for w in section.worlds}
    assert list(worlds) == ["baseline", *STRATEGIES]
    assert {w.files_at_branch for w in worlds.values()} == {40 * 5}  # package + test report
    assert len({layer for w in worlds.values() for layer in w.layers}) == 2  # one per chunk
    base = worlds["baseline"]  # ran the same tests again: the same report, nothing diverged
    assert (base.added, base.changed, base.removed, base.episodes_diverged) == (0, 0, 0, 0)
    paths = {name: {p.path: p.changed for p in worlds[name].paths} for name in STRATEGIES}
    assert paths["rewrite"]["calc/arith.py"] == 40 and "tests/test_arith.py" not in paths["rewrite"]
    assert paths["skip"]["tests/test_arith.py"] == 40 and "calc/arith.py" not in paths["skip"]
    assert 0 < paths["minimal"]["calc/arith.py"] < 40  # only the subtraction bug is edited
    files = save_report(lab.settings, result, tmp_path / "report")
    assert files.workspace_files == section.files
    assert "## Workspaces" in (tmp_path / "report" / "report.md").read_text()
    assert "<h2>Workspaces</h2>" in (tmp_path / "report" / "report.html").read_text()
    end = WorkspaceManifest.model_validate_json(
        (tmp_path / "report" / "workspace-skip-end.json").read_text()
    )
    assert end.digest() == worlds["skip"].end_manifest
    diff = ManifestDiff.model_validate_json(
        (tmp_path / "report" / "workspace-skip-diff.json").read_text()
    )
    assert "0/tests/test_arith.py" in diff.changed
    # the twin's section (``forklab plan``) says the same, file for file; it seals no layers
    twin = twin_workspace_section(spec)
    assert twin is not None
    twin_section, twin_files = twin
    assert twin_section.branch_manifest == section.branch_manifest
    assert twin_section.files == section.files
    assert list(twin_section.worlds) == [
        w.model_copy(update={"layers": ()}) for w in worlds.values()
    ]
    for name in twin_section.files:
        assert twin_files[name] == (tmp_path / "report" / name).read_text(), name
    xfail = [f for f in end.files if f.path == "0/tests/test_arith.py"]
    assert (
        xfail
        and xfail[0].sha256
        != {
            f.path: f.sha256
            for f in WorkspaceManifest.model_validate_json(
                (tmp_path / "report" / "workspace-branch.json").read_text()
            ).files
        }["0/tests/test_arith.py"]
    )
