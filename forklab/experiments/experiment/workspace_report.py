"""The state evidence of a workspace fork: per agent, the manifest at the branch and at the
end and what diverged, the test verdicts, and named checks over them. Pure: built from
what the sandboxes reported, rendered as ``summary.json`` and ``summary.md``.

The same evidence for an experiment (``workspace_section``): per world, the workspace at
the branch and at the end of every episode, and what diverged, as a report section and as
manifest and diff files next to the report."""

from __future__ import annotations

import difflib
import json
import re
from itertools import combinations
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from forklab.experiments.workspace import (
    ManifestDiff,
    WorkspaceCheckpoint,
    WorkspaceManifest,
    diff_manifests,
)

PYCACHE = "__pycache__/"
_UNEXPECTED = re.compile(r"unexpected successes=(\d+)")


class TestRun(BaseModel):
    """One ``python3 -m unittest`` run inside a sandbox."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    exit_code: int
    verdict: str  # unittest's last line, e.g. "FAILED (failures=3)"
    unexpected_successes: int = Field(ge=0)

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    @classmethod
    def parse(cls, exit_code: int, output: str) -> TestRun:
        lines = [line.strip() for line in output.splitlines() if line.strip()]
        verdict = lines[-1] if lines else "no output"
        match = _UNEXPECTED.search(verdict)
        return cls(
            exit_code=exit_code,
            verdict=verdict[:200],
            unexpected_successes=int(match.group(1)) if match else 0,
        )


class AgentEvidence(BaseModel):
    """What one agent's workspace held at the branch and at the end."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    strategy: str | None  # None for the source agent
    sandbox: str
    mode: str  # overlay | reflink | copy
    note: str | None = None
    inherited: WorkspaceCheckpoint  # for the source: the checkpoint it was forked at
    tests: TestRun
    branch: WorkspaceManifest
    end: WorkspaceManifest
    edited: dict[str, str]  # source files (not bytecode) changed since the branch → text
    #: The same files' text at the branch ("" for a file the agent added): what the
    #: summary diffs ``edited`` against, so it shows the edit rather than the whole file.
    before: dict[str, str] = Field(default_factory=dict)

    @property
    def diverged(self) -> ManifestDiff:
        return diff_manifests(self.branch, self.end)


class Check(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    ok: bool
    detail: str


class ForkFigures(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    import_seconds: float  # sealing the starting workspace (once, before the source ran)
    fork_seconds: float  # freeze + one workspace per child, until all were mounted
    hashed_bytes: int  # bytes read to seal the fork layer (only what the source wrote)
    children_extra_bytes: int  # disk the children's own folders used right after the fork
    workspace_bytes: int


class WorkspaceDemoSummary(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal[1] = 1
    blob: str  # the path of the vendored blob inside the workspace
    checkpoint: WorkspaceCheckpoint
    figures: ForkFigures
    agents: tuple[AgentEvidence, ...]
    checks: tuple[Check, ...] = ()


def _pycache(manifest: WorkspaceManifest) -> dict[str, str]:
    return {f.path: f.sha256 for f in manifest.files if PYCACHE in f.path}


def _md5(manifest: WorkspaceManifest, path: str) -> str:
    return manifest.by_path()[path].md5 if path in manifest.by_path() else "missing"


def demo_checks(summary: WorkspaceDemoSummary) -> tuple[Check, ...]:
    """The claims of the coding-agent fork, each checked on the evidence."""
    agents = {a.name: a for a in summary.agents}
    source = agents["source"]
    children = [a for a in summary.agents if a.strategy is not None]
    checks: list[Check] = []
    blob_md5s = {_md5(m, summary.blob) for a in summary.agents for m in (a.branch, a.end)}
    checks.append(
        Check(
            name="blob identical",
            ok=len(blob_md5s) == 1 and "missing" not in blob_md5s,
            detail=f"md5 of {summary.blob} at branch and end in all agents: {sorted(blob_md5s)}",
        )
    )
    branch_caches = {str(sorted(_pycache(a.branch).items())) for a in summary.agents}
    checks.append(
        Check(
            name="pycache identical at branch",
            ok=len(branch_caches) == 1 and bool(_pycache(source.branch)),
            detail=f"{len(_pycache(source.branch))} .pyc files, same bytes in every agent",
        )
    )
    for child in children:
        moved = tuple(p for p in (*child.diverged.added, *child.diverged.changed) if PYCACHE in p)
        checks.append(
            Check(
                name=f"pycache diverged in {child.name}",
                ok=bool(moved),
                detail=", ".join(moved) or "no .pyc changed",
            )
        )
    edits = {c.name: c.edited for c in children}
    distinct = all(edits.values()) and all(
        edits[a] != edits[b] for a, b in combinations(sorted(edits), 2)
    )
    checks.append(
        Check(
            name="edits differ",
            ok=distinct,
            detail="; ".join(f"{n}: {', '.join(e) or 'nothing'}" for n, e in sorted(edits.items())),
        )
    )
    for child in children:
        expected = child.strategy != "skip"
        ok = child.tests.passed == expected and (expected or child.tests.unexpected_successes > 0)
        checks.append(
            Check(
                name=f"{child.name} {'passes' if expected else 'fails by unexpected success'}",
                ok=ok,
                detail=child.tests.verdict,
            )
        )
    checks.append(
        Check(
            name="source untouched",
            ok=source.branch == source.end and not source.tests.passed,
            detail="the source's workspace is the same after its children ran",
        )
    )
    inherited = {c.inherited.digest for c in children}
    checks.append(
        Check(
            name="one inherited checkpoint",
            ok=inherited == {summary.checkpoint.digest},
            detail=f"state {summary.checkpoint.state_sha256[:12]} + layer "
            f"{(summary.checkpoint.layer or '')[:12]}",
        )
    )
    return tuple(checks)


def human_size(n: int) -> str:
    """Bytes as a person reads them: 812 B, 4.0 KiB, 50.0 MiB, 1.2 GiB."""
    size, unit = float(n), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"


def edit_diff(path: str, before: str, after: str) -> list[str]:
    """The unified diff of one edited file (one line of context): the edit itself."""
    return [
        line.rstrip("\n")
        for line in difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            f"a/{path}",
            f"b/{path}",
            n=1,
        )
    ]


def render_markdown(summary: WorkspaceDemoSummary) -> str:
    f = summary.figures
    lines = [
        "# Coding agent, forked three ways",
        "",
        f"Workspace: {human_size(f.workspace_bytes)} ({summary.blob} and the `calc` package). "
        f"Checkpoint at the branch: state `{summary.checkpoint.state_sha256[:16]}`, "
        f"layer `{(summary.checkpoint.layer or '')[:16]}`.",
        "",
        f"- sealing the starting workspace (once): {f.import_seconds * 1000:.1f} ms",
        f"- fork into {len(summary.agents) - 1} children: **{f.fork_seconds * 1000:.1f} ms** "
        f"(hashed {human_size(f.hashed_bytes)} the source wrote since its last freeze)",
        "- extra disk used by the children right after the fork: "
        f"{human_size(f.children_extra_bytes)}",
        "",
        "| agent | workspace | tests | unexpected successes | changed since branch |",
        "|---|---|---|---|---|",
    ]
    for a in summary.agents:
        d = a.diverged
        changed = ", ".join((*d.added, *d.changed, *d.removed)) or "nothing"
        lines.append(
            f"| {a.name} | {a.mode} | {'pass' if a.tests.passed else 'FAIL'} "
            f"(`{a.tests.verdict}`) | {a.tests.unexpected_successes} | {changed} |"
        )
    lines += ["", "## Checks", ""]
    lines += [f"- {'✅' if c.ok else '❌'} **{c.name}**: {c.detail}" for c in summary.checks]
    for a in summary.agents:
        for path, text in sorted(a.edited.items()):
            diff = edit_diff(path, a.before.get(path, ""), text)
            lines += ["", f"## `{path}` in {a.name}", "", "```diff", *diff, "```"]
    lines += ["", "## Blob md5", ""]
    lines += [f"- {a.name}: `{_md5(a.end, summary.blob)}`" for a in summary.agents]
    return "\n".join(lines) + "\n"


# --- workspaces in experiment reports -----------------------------------------------------
class PathChange(BaseModel):
    """One path inside an episode's folder and in how many episodes a world changed it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    added: int = Field(ge=0)
    changed: int = Field(ge=0)
    removed: int = Field(ge=0)


class WorldWorkspace(BaseModel):
    """One world's workspace over the whole run: what it forked from (the chunks' layers)
    and held at the branch, what it held at its end, and what diverged, counted in files
    and in episodes, with the paths (within an episode's folder) it changed most."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    world: str
    layers: tuple[str, ...]
    files_at_branch: int
    bytes_at_branch: int
    files_at_end: int
    bytes_at_end: int
    added: int
    removed: int
    changed: int
    unchanged: int
    episodes_diverged: int
    paths: tuple[PathChange, ...]
    end_manifest: str  # digest of the end manifest (the file written next to the report)


class WorkspaceSection(BaseModel):
    """The workspace evidence of an experiment whose workload keeps files. The full
    manifests and diffs are files next to the report (``files``), named here."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    episodes: int
    branch_manifest: str  # digest of the manifest at the branch, every world's start
    files: tuple[str, ...]
    worlds: tuple[WorldWorkspace, ...]


#: How many changed paths per world the report lists (the diff file has them all).
TOP_PATHS = 8


def _merge(manifests: list[WorkspaceManifest]) -> WorkspaceManifest:
    files = sorted((f for m in manifests for f in m.files), key=lambda f: f.path)
    return WorkspaceManifest(files=tuple(files))


def _episode_path(path: str) -> tuple[str, str]:
    episode, _, rest = path.partition("/")
    return episode, rest


def _file_name(world: str, what: str) -> str:
    return f"workspace-{world}-{what}.json"


def workspace_section(
    branch: list[WorkspaceManifest],
    worlds: dict[str, tuple[list[str], list[WorkspaceManifest]]],
) -> tuple[WorkspaceSection, dict[str, str]]:
    """The section and the files it names: ``branch`` holds each chunk's manifest at the
    branch; ``worlds`` maps a world to the layers it forked from and each of its batches'
    manifests at the end. The paths in a manifest start with the episode's number."""
    start = _merge(branch)
    files = {"workspace-branch.json": _dump(start)}
    rows = []
    for name, (layers, ends) in worlds.items():
        end = _merge(ends)
        diff = diff_manifests(start, end)
        counts: dict[str, dict[str, int]] = {}
        episodes: set[str] = set()
        for kind, paths in (
            ("added", diff.added),
            ("changed", diff.changed),
            ("removed", diff.removed),
        ):
            for path in paths:
                episode, rest = _episode_path(path)
                episodes.add(episode)
                row = counts.setdefault(rest, {"added": 0, "changed": 0, "removed": 0})
                row[kind] += 1
        top = sorted(counts.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))[:TOP_PATHS]
        files[_file_name(name, "end")] = _dump(end)
        files[_file_name(name, "diff")] = _dump(diff)
        rows.append(
            WorldWorkspace(
                world=name,
                layers=tuple(sorted(set(layers))),
                files_at_branch=len(start.files),
                bytes_at_branch=start.bytes,
                files_at_end=len(end.files),
                bytes_at_end=end.bytes,
                added=len(diff.added),
                removed=len(diff.removed),
                changed=len(diff.changed),
                unchanged=diff.unchanged,
                episodes_diverged=len(episodes),
                paths=tuple(PathChange(path=p, **c) for p, c in top),
                end_manifest=end.digest(),
            )
        )
    section = WorkspaceSection(
        episodes=len({_episode_path(f.path)[0] for f in start.files}),
        branch_manifest=start.digest(),
        files=tuple(sorted(files)),
        worlds=tuple(rows),
    )
    return section, files


def _dump(model: BaseModel) -> str:
    return json.dumps(model.model_dump(mode="json"), indent=1, sort_keys=True) + "\n"


def code_cell(text: str) -> str:
    """``text`` as a code span in a Markdown table cell: fenced by more backticks than any
    run of them it holds (so it cannot close the span early) and with ``|`` escaped (GFM
    splits a row at any bare ``|``, inside a code span too). A workload names its paths."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    escaped = text.replace("|", "\\|")
    return f"{fence}{pad}{escaped}{pad}{fence}"


def workspace_markdown(section: WorkspaceSection) -> list[str]:
    """The report's "Workspaces" section, as Markdown lines."""
    lines = [
        "## Workspaces",
        "",
        f"Every world forked each of {section.episodes} episodes from the files its prefix "
        f"left (manifest `{section.branch_manifest[:16]}`); the full manifests and diffs "
        f"(path, size, md5, sha256) are next to this report: "
        + ", ".join(f"`{f}`" for f in section.files)
        + ".",
        "",
        "| world | files at branch → end | bytes at branch → end | added | changed | removed "
        "| episodes diverged | most changed paths |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w in section.worlds:
        paths = ", ".join(
            f"{code_cell(p.path)} ×{p.added + p.changed + p.removed}" for p in w.paths
        )
        lines.append(
            f"| {w.world} | {w.files_at_branch} → {w.files_at_end} | {w.bytes_at_branch} → "
            f"{w.bytes_at_end} | {w.added} | {w.changed} | {w.removed} | "
            f"{w.episodes_diverged} of {section.episodes} | {paths or 'none'} |"
        )
    layers = sorted({f"`{d[:12]}`" for w in section.worlds for d in w.layers})
    if layers:  # none on the twin (``forklab plan``): it copies folders, seals no layers
        lines += ["", "Layers forked from: " + ", ".join(layers)]
    return [*lines, ""]
