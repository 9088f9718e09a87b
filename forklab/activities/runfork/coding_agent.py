"""The coding-agent fork, run for real in local sandboxes (``forklab demo workspace``).

A source agent gets a workspace — the ``calc`` package of ``coding-fix`` with its bug,
twenty-odd files, and a large synthetic ``vendored/vendored.bin`` — and runs the failing
tests, which fills ``__pycache__/``. Its sandbox is then forked: the workspace is frozen
as a layer and three children get their own writable layer over it, one per strategy
(``minimal``, ``rewrite``, ``skip``). Each child applies its strategy and runs the tests
again. The evidence (manifests at the branch and at the end, logs, changed files) is
written to a folder; ``forklab.experiments.experiment.workspace_report`` checks the claims on it.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from forklab.activities.experiment.runner_bundle import bundle_files
from forklab.activities.sandbox.base import Limits
from forklab.activities.sandbox.local import WORKSPACE_DIR, LocalSandboxBackend
from forklab.activities.sandbox.workspace import WorkspaceInfo
from forklab.experiments.experiment.workspace_report import (
    PYCACHE,
    AgentEvidence,
    ForkFigures,
    TestRun,
    WorkspaceDemoSummary,
    demo_checks,
    render_markdown,
)
from forklab.experiments.workspace import WorkspaceCheckpoint, WorkspaceManifest, diff_manifests
from forklab.runtime.canon import canonical_json, sha256_hex
from forklab.workloads.coding_fix import DEMO_CASES, STRATEGIES, package_files, vendored_chunks

BLOB = "vendored/vendored.bin"
DEFAULT_BLOB_BYTES = 50 << 20
#: The bug the source agent's workspace holds (``add`` returns ``a - b``).
DEMO_BUG = "sub"
#: Every file of the starting workspace gets this modification time (2026-01-01 UTC), so
#: its bytecode is the same on every run and an edit made a second later is always seen
#: as newer by Python's mtime-based ``__pycache__`` check.
FIXED_MTIME = 1_767_225_600
DEMO_LABEL = "forklab.demo"
AGENT_LABEL = "forklab.agent"
_LIMITS = Limits(memory_mb=1024, cpu_seconds=120, wall_seconds=300)
_TESTS = ["sh", "-c", f"cd {WORKSPACE_DIR} && python3 -m unittest -v 2>&1"]
_TIMEOUT = 120.0


def write_workspace(folder: Path, blob_bytes: int) -> None:
    """The source agent's starting workspace: the buggy package and the vendored blob."""
    for rel, text in package_files(DEMO_BUG, DEMO_CASES).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    (folder / BLOB).parent.mkdir(parents=True, exist_ok=True)
    with (folder / BLOB).open("wb") as fh:
        for chunk in vendored_chunks(blob_bytes):
            fh.write(chunk)
    for path in [*folder.rglob("*"), folder]:
        os.utime(path, (FIXED_MTIME, FIXED_MTIME))


class _Agent:
    """One agent's sandbox and the log of what it ran."""

    def __init__(self, backend: LocalSandboxBackend, name: str, sandbox: str) -> None:
        self.backend = backend
        self.name = name
        self.sandbox = sandbox
        self.log: list[str] = []

    def run(self, argv: list[str]) -> tuple[int, str]:
        result = self.backend.exec(self.sandbox, argv, _TIMEOUT)
        output = result.stdout + result.stderr
        self.log.append(f"$ {' '.join(argv)}\n{output}[exit {result.exit_code}]\n")
        return result.exit_code, output

    def tests(self) -> TestRun:
        return TestRun.parse(*self.run(_TESTS))


def _changed_files(
    backend: LocalSandboxBackend, sandbox: str, branch: WorkspaceManifest, end: WorkspaceManifest
) -> dict[str, bytes]:
    diff = diff_manifests(branch, end)
    return {
        p: backend.download(sandbox, f"{WORKSPACE_DIR}/{p}") for p in (*diff.added, *diff.changed)
    }


def _run_child(
    backend: LocalSandboxBackend, strategy: str, info: WorkspaceInfo, state: bytes
) -> tuple[_Agent, AgentEvidence, dict[str, bytes]]:
    """One child: receive the agent's state, apply ``strategy``, run the tests again."""
    child = _Agent(backend, strategy, info.id)
    backend.upload(child.sandbox, "agent-state.json", state)
    inherited = WorkspaceCheckpoint(
        state_sha256=sha256_hex(backend.download(child.sandbox, "agent-state.json")),
        layer=info.stack[0],  # the layer its workspace was verified and mounted over
    )
    branch = backend.workspace_manifest(child.sandbox)
    child.run(["python", "-m", "forklab.workloads.coding_fix", "apply", strategy, WORKSPACE_DIR])
    tests = child.tests()
    end = backend.workspace_manifest(child.sandbox)
    changed = _changed_files(backend, child.sandbox, branch, end)
    edited = {p: data.decode(errors="replace") for p, data in changed.items() if PYCACHE not in p}
    started = package_files(DEMO_BUG, DEMO_CASES)
    evidence = AgentEvidence(
        name=strategy,
        strategy=strategy,
        sandbox=child.sandbox,
        mode=info.mode,
        note=info.note,
        inherited=inherited,
        tests=tests,
        branch=branch,
        end=end,
        edited=edited,
        before={p: started.get(p, "") for p in edited},
    )
    return child, evidence, changed


def run_coding_agent_fork(
    backend: LocalSandboxBackend, out: Path, blob_bytes: int = DEFAULT_BLOB_BYTES
) -> WorkspaceDemoSummary:
    """Run the whole fork and write its evidence into ``out``; every sandbox is deleted
    on the way out, whatever happens."""
    run_id = f"ws-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="forklab-workspace-") as tmp:
        write_workspace(Path(tmp), blob_bytes)
        base = backend.import_workspace(Path(tmp))
    snapshot = backend.prepare_snapshot(bundle_files("coding-fix"))
    created: list[str] = []
    try:
        source = _Agent(
            backend,
            "source",
            backend.create(snapshot.id, {DEMO_LABEL: run_id, AGENT_LABEL: "source"}, _LIMITS),
        )
        created.append(source.sandbox)
        source_ws = backend.attach_workspace(source.sandbox, base.digest)
        source_tests = source.tests()
        # The agent's JSON state at the branch; with the frozen layer it is the checkpoint.
        state = canonical_json(
            {"agent": "calc-fixer", "ran": ["unittest"], "tests": source_tests.verdict}
        ).encode()
        branch = backend.workspace_manifest(source.sandbox)
        fork = backend.fork(
            source.sandbox,
            [{DEMO_LABEL: run_id, AGENT_LABEL: s} for s in STRATEGIES],
        )
        created += [c.id for c in fork.children]
        extra = sum(backend.workspaces.own_bytes(c.id) for c in fork.children)
        checkpoint = WorkspaceCheckpoint(state_sha256=sha256_hex(state), layer=fork.layer.digest)
        children = [
            _run_child(backend, strategy, info, state)
            for strategy, info in zip(STRATEGIES, fork.children, strict=True)
        ]
        source_evidence = AgentEvidence(
            name="source",
            strategy=None,
            sandbox=source.sandbox,
            mode=source_ws.mode,
            note=source_ws.note,
            inherited=checkpoint,
            tests=source_tests,
            branch=branch,
            end=backend.workspace_manifest(source.sandbox),
            edited={},
        )
        agents = [source_evidence, *(evidence for _, evidence, _ in children)]
        summary = WorkspaceDemoSummary(
            blob=BLOB,
            checkpoint=checkpoint,
            figures=ForkFigures(
                import_seconds=base.seconds,
                fork_seconds=fork.seconds,
                hashed_bytes=fork.layer.hashed_bytes,
                children_extra_bytes=extra,
                workspace_bytes=branch.bytes,
            ),
            agents=tuple(agents),
        )
        summary = summary.model_copy(update={"checks": demo_checks(summary)})
        _write_evidence(
            out,
            summary,
            [source, *(agent for agent, _, _ in children)],
            {agent.name: changed for agent, _, changed in children},
        )
        return summary
    finally:
        for sandbox in reversed(created):
            backend.delete(sandbox)


def _write_evidence(
    out: Path,
    summary: WorkspaceDemoSummary,
    agents: list[_Agent],
    changed: dict[str, dict[str, bytes]],
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for agent in agents:
        (out / f"{agent.name}-agent.log").write_text("".join(agent.log))
    for name, files in changed.items():
        for rel, data in files.items():
            dest = out / "changed" / name / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
    (out / "summary.json").write_text(
        json.dumps(summary.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
    )
    (out / "summary.md").write_text(render_markdown(summary))
