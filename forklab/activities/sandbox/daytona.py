"""Daytona sandboxes: every prefix and world in a fresh Daytona sandbox created from one
resolved, immutable snapshot (pinned by id, not by name).

What ForkLab's snapshot id means here: ``daytona:<Daytona snapshot id>:<bundle digest>``.
The Daytona snapshot is the image (an interpreter, nothing of ForkLab); the runner bundle
— the exact files whose digest is the workload's code identity — is kept by the worker
and uploaded into each sandbox when it is created. A worker on another host gets the
bundle from the artifact store (``forklab.activities.sandbox.shared_snapshots``) and keeps the
image the id pins; it never resolves the snapshot name again. Every sandbox is labelled (experiment,
world, batch, plus ``forklab.managed``), cut off the network (``network_block_all``),
ephemeral (deleted as soon as it stops), auto-stopped when idle and capped by a TTL, so a
worker that dies mid-batch leaves nothing running for long; cleanup lists by label
against the account and deletes what is left.

Errors: 401/403/404 and bad requests are permanent (``SandboxError``); 409, 429, 5xx and
timeouts may pass (``SandboxUnavailableError``) and the activity's retry policy decides.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from daytona import (
    CreateSandboxFromSnapshotParams,
    Daytona,
    DaytonaConfig,
    DaytonaError,
    DaytonaNotFoundError,
    FileUpload,
    ListSandboxesQuery,
    Sandbox,
)
from daytona.common.errors import (
    DaytonaConflictError,
    DaytonaConnectionError,
    DaytonaRateLimitError,
    DaytonaTimeoutError,
)
from daytona_api_client import OrganizationsApi
from pydantic import BaseModel, ConfigDict, Field

from forklab.activities.experiment.runner_bundle import code_digest
from forklab.activities.files import atomic_write
from forklab.activities.sandbox.base import (
    ExecResult,
    Limits,
    SandboxError,
    SandboxNotFoundError,
    SnapshotCorruptedError,
    SnapshotInfo,
)
from forklab.activities.sandbox.daytona_http import bound_client, plain_sandbox_id, shown
from forklab.activities.sandbox.preflight import SandboxUnavailableError
from forklab.activities.secrets_text import redact
from forklab.experiments.experiment.bundle import BundleFile
from forklab.experiments.experiment.capacity import RegionQuota, SnapshotFacts, capacity_refusals

SNAPSHOT_PREFIX = "daytona:"
#: Every sandbox ForkLab creates carries this label, so the account can be swept for them.
MANAGED_LABEL = ("forklab.managed", "true")
OUTPUT_LIMIT = 64 * 1024
_T = TypeVar("_T")


class DaytonaOptions(BaseModel):
    """How the worker reaches Daytona and what its sandboxes look like."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    api_key: str = Field(min_length=1)
    api_url: str = "https://app.daytona.io/api"
    target: str = Field(min_length=1, description="The region every sandbox must run in.")
    snapshot: str = Field(min_length=1, description="Name or id of the Daytona snapshot.")
    organization_id: str | None = None
    ttl_minutes: int = Field(default=60, ge=1)
    create_timeout: float = Field(default=120.0, gt=0)
    request_timeout: float = Field(default=60.0, gt=0)
    delete_wait: float = Field(default=20.0, ge=0, description="Seconds to wait for a delete.")
    workdir: str = "/home/daytona/forklab"
    python: str = "python3"


def _transient(exc: DaytonaError) -> bool:
    status = exc.status_code or 0
    return (
        isinstance(
            exc,
            DaytonaRateLimitError
            | DaytonaConflictError
            | DaytonaTimeoutError
            | DaytonaConnectionError,
        )
        or status >= 500
        or status in (408, 409, 429)
    )


def _wrap(what: str, exc: DaytonaError, secret: str) -> SandboxError:
    """One error naming Daytona, what failed and what to do; the API key is cut out of
    the server's words (a server may quote the request's credentials back)."""
    status = f"HTTP {exc.status_code}: " if exc.status_code else ""
    message = redact(f"Daytona {what} failed ({status}{exc})", secret, "DAYTONA_API_KEY")
    if isinstance(exc, DaytonaNotFoundError):
        return SandboxNotFoundError(message)
    if _transient(exc):
        return SandboxUnavailableError(message + "; will retry")
    if exc.status_code in (401, 403):
        return SandboxError(message + "; check DAYTONA_API_KEY and its organisation")
    return SandboxError(message)


def _bounded(text: str) -> str:
    if len(text) <= OUTPUT_LIMIT:
        return text
    half = OUTPUT_LIMIT // 2
    return f"{text[:half]}\n…[{len(text) - 2 * half} characters cut]…\n{text[-half:]}"


def parse_snapshot_id(snapshot_id: str) -> tuple[str, str]:
    """``daytona:<snapshot>:<digest>`` → (Daytona snapshot id, bundle digest)."""
    body = snapshot_id.removeprefix(SNAPSHOT_PREFIX)
    snap, _, digest = body.rpartition(":")
    if not snapshot_id.startswith(SNAPSHOT_PREFIX) or not snap or len(digest) != 64:
        raise SandboxError(f"{snapshot_id!r} is not a Daytona snapshot id of this backend")
    return snap, digest


class DaytonaSandboxBackend:
    """Sandboxes in Daytona through the ``daytona`` SDK; see the module docstring."""

    name = "daytona"

    def __init__(self, options: DaytonaOptions, bundles_dir: Path) -> None:
        self._options = options
        self._bundles = bundles_dir
        try:
            self._client = Daytona(
                DaytonaConfig(
                    api_key=options.api_key, api_url=options.api_url, target=options.target
                )
            )
            bound_client(self._client, options.request_timeout)
        except DaytonaError as exc:
            raise _wrap("client set-up", exc, options.api_key) from None

    def _call(self, what: str, fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except DaytonaError as exc:
            raise _wrap(what, exc, self._options.api_key) from None

    # --- snapshot ---------------------------------------------------------------------
    def prepare_snapshot(self, files: list[BundleFile]) -> SnapshotInfo:
        """Resolve the Daytona snapshot to its immutable id and keep the runner bundle.
        Its state, region and quota fit are judged by ``preflight`` (a refusal, not an
        error); a snapshot that does not exist at all is an error."""
        snap = self._call(
            f"snapshot lookup of {self._options.snapshot!r}",
            lambda: self._client.snapshot.get(self._options.snapshot),
        )
        digest = code_digest(files)
        self._keep(files, digest)
        return SnapshotInfo(
            id=f"{SNAPSHOT_PREFIX}{snap.id}:{digest}",
            backend=self.name,
            code_digest=digest,
            files=len(files),
        )

    def restore_snapshot(self, snapshot_id: str, files: list[BundleFile]) -> None:
        """Keep the runner bundle of a snapshot another worker prepared; no Daytona call:
        the image stays the one ``snapshot_id`` pins (its name may point elsewhere now)."""
        _, digest = parse_snapshot_id(snapshot_id)
        found = code_digest(files)
        if found != digest:
            raise SandboxError(
                f"the bundle stored for snapshot {snapshot_id} hashes to {found[:12]}; the "
                "artifact store is inconsistent, start the experiment again"
            )
        self._keep(files, digest)

    def _keep(self, files: list[BundleFile], digest: str) -> None:
        """Copy ``files`` (whose code digest is ``digest``) to this worker's bundle folder,
        atomically and safely against a concurrent keeper; a folder there that no longer
        hashes to its name is replaced."""
        folder = self._bundles / digest
        if folder.is_dir() and self._hashed(folder) == digest:
            return
        self._bundles.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=self._bundles, prefix=".keep-"))
        try:
            for f in files:
                atomic_write(staging / f.relpath, f.source.read_bytes())
            if self._hashed(staging) != digest:
                raise SandboxError("the bundle files changed while they were kept; retry")
            if folder.is_dir() and self._hashed(folder) != digest:
                aside = self._bundles / f".modified-{digest[:12]}-{secrets.token_hex(4)}"
                with contextlib.suppress(OSError):
                    folder.rename(aside)
                shutil.rmtree(aside, ignore_errors=True)
            try:
                staging.rename(folder)
            except OSError:
                if not folder.is_dir():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    @staticmethod
    def _hashed(folder: Path) -> str:
        paths = sorted(p for p in folder.rglob("*") if p.is_file())
        return code_digest([BundleFile(str(p.relative_to(folder)), p) for p in paths])

    def _bundle(self, digest: str) -> list[FileUpload]:
        folder = self._bundles / digest
        if not folder.is_dir():
            raise SandboxError(
                f"runner bundle {digest[:12]} is not on this worker and was not restored from "
                "the artifact store; check FORKLAB_ARTIFACTS is the store the planning worker "
                "uses"
            )
        paths = sorted(p for p in folder.rglob("*") if p.is_file())
        if self._hashed(folder) != digest:
            raise SnapshotCorruptedError(
                f"runner bundle {digest[:12]} on this worker was modified after it was kept; "
                "its worlds cannot be trusted, so the run stops here"
            )
        return [
            FileUpload(p.read_bytes(), f"{self._options.workdir}/{p.relative_to(folder)}")
            for p in paths
        ]

    def preflight(self, snapshot_id: str, peak_sandboxes: int) -> list[str]:
        opts = self._options
        snap_id, _ = parse_snapshot_id(snapshot_id)
        try:
            snap = self._client.snapshot.get(snap_id)
        except DaytonaNotFoundError:
            return [f"Daytona snapshot {snap_id} no longer exists; resolve a current one"]
        except DaytonaError as exc:
            raise _wrap("snapshot lookup", exc, self._options.api_key) from None
        facts = SnapshotFacts(
            id=snap.id,
            name=snap.name,
            state=str(getattr(snap.state, "value", snap.state)),
            regions=list(snap.region_ids or []),
            cpu=snap.cpu,
            memory_gib=snap.mem,
            disk_gib=snap.disk,
        )
        org = opts.organization_id or getattr(snap, "organization_id", None)
        if not org:
            return ["cannot tell the Daytona organisation; set DAYTONA_ORGANIZATION_ID"]
        try:
            usage = OrganizationsApi(self._client._api_client).get_organization_usage_overview(
                org, _request_timeout=opts.request_timeout
            )
        except Exception as exc:  # the generated client raises its own ApiException family
            status = getattr(exc, "status", None)
            if status in (401, 403, 404):
                return [f"cannot read organisation {org}'s usage (HTTP {status})"]
            why = redact(str(exc), opts.api_key, "DAYTONA_API_KEY")
            raise SandboxUnavailableError(f"Daytona usage overview failed: {why}") from None
        quotas = [
            RegionQuota(
                region=r.region_id,
                cpu_total=r.total_cpu_quota,
                cpu_used=r.current_cpu_usage,
                memory_total_gib=r.total_memory_quota,
                memory_used_gib=r.current_memory_usage,
                disk_total_gib=r.total_disk_quota,
                disk_used_gib=r.current_disk_usage,
            )
            for r in usage.region_usage
        ]
        refusals = capacity_refusals(facts, quotas, opts.target, peak_sandboxes)
        return [f"Daytona: {r.reason}" for r in refusals]

    def provenance(self, snapshot_id: str) -> str:
        snap_id, digest = parse_snapshot_id(snapshot_id)
        return (
            f"common_snapshot: every sandbox created from Daytona snapshot {snap_id} "
            f"({self._options.snapshot}, region {self._options.target}) with runner bundle "
            f"{digest}; the worlds share that snapshot and the recorded checkpoints, "
            "not a live ancestor"
        )

    # --- sandboxes --------------------------------------------------------------------
    def create(self, snapshot_id: str, labels: dict[str, str], limits: Limits) -> str:
        opts = self._options
        snap_id, digest = parse_snapshot_id(snapshot_id)
        bundle = self._bundle(digest)
        params = CreateSandboxFromSnapshotParams(
            snapshot=snap_id,
            labels={**labels, MANAGED_LABEL[0]: MANAGED_LABEL[1]},
            env_vars={},
            network_block_all=True,
            ephemeral=True,  # deleted as soon as it stops
            auto_stop_interval=max(1, math.ceil(limits.wall_seconds / 60) + 1),
            ttl_minutes=opts.ttl_minutes,
            target=opts.target,
        )
        try:
            sandbox = self._client.create(params, timeout=opts.create_timeout)
        except DaytonaTimeoutError as exc:
            left = exc.sandbox_id
            if left:
                self._delete_quietly(left)
            raise SandboxUnavailableError(
                f"Daytona did not start a sandbox within {opts.create_timeout:g} s"
                + (f"; deleted the half-created sandbox {left}" if left else "")
            ) from None
        except DaytonaError as exc:
            raise _wrap("sandbox create", exc, self._options.api_key) from None
        sandbox_id = self._plain_created_id(sandbox)
        try:
            if not sandbox.network_block_all:
                raise SandboxError(
                    f"Daytona created sandbox {sandbox.id} without network_block_all; refusing "
                    "to run workload code on the network"
                )
            self._call(
                "bundle upload", lambda: sandbox.fs.upload_files(bundle, self._transfer_timeout)
            )
        except SandboxError:
            self._delete_quietly(sandbox_id)
            raise
        return sandbox_id

    @property
    def _transfer_timeout(self) -> int:
        """Seconds an upload or download may take (the SDK's own default is 30 minutes)."""
        return max(1, math.ceil(self._options.request_timeout))

    def _plain_created_id(self, sandbox: Sandbox) -> str:
        """The new sandbox's id, if it is a plain token. The SDK puts it unquoted into the
        toolbox's URL path (``../`` there reaches other routes, with the API key), and
        ForkLab carries it into progress, errors and the evidence log; any other id is
        refused, and the sandbox deleted through the control plane (which quotes it)."""
        sandbox_id = plain_sandbox_id(sandbox.id)
        if sandbox_id is None:
            with contextlib.suppress(DaytonaError):
                self._client.delete(sandbox, timeout=self._options.request_timeout)
            raise SandboxError(
                f"Daytona answered the sandbox id {shown(str(sandbox.id))}, not a plain id; "
                "refused and asked Daytona to delete it (check DAYTONA_API_URL points at "
                "Daytona; `forklab doctor` lists what is left)"
            )
        return sandbox_id

    def _delete_quietly(self, sandbox_id: str) -> None:
        """Best effort on an error path: cleanup's reconciliation catches what this misses."""
        with contextlib.suppress(SandboxError):
            self.delete(sandbox_id)

    def _sandbox(self, sandbox_id: str) -> Sandbox:
        """The sandbox ``sandbox_id``; Daytona must answer that one: the SDK addresses the
        toolbox by the id in the answer, not by the one asked for."""
        sandbox = self._call(
            f"lookup of sandbox {sandbox_id}",
            lambda: self._client.get(sandbox_id, request_timeout=self._options.request_timeout),
        )
        if sandbox.id != sandbox_id:
            raise SandboxError(
                f"Daytona answered a lookup of sandbox {shown(sandbox_id)} with sandbox "
                f"{shown(str(sandbox.id))}; refused (check DAYTONA_API_URL points at Daytona)"
            )
        return sandbox

    def _path(self, relpath: str) -> str:
        parts = Path(relpath).parts
        if not relpath or Path(relpath).is_absolute() or ".." in parts:
            raise SandboxError(f"path {relpath!r} must be relative, inside the sandbox, no '..'")
        return f"{self._options.workdir}/{relpath}"

    def upload(self, sandbox_id: str, relpath: str, data: bytes) -> None:
        remote = self._path(relpath)
        sandbox = self._sandbox(sandbox_id)
        self._call(
            f"upload of {relpath}",
            lambda: sandbox.fs.upload_file(data, remote, self._transfer_timeout),
        )

    def exec(self, sandbox_id: str, argv: list[str], timeout: float) -> ExecResult:
        """Run ``argv`` in the work folder; Daytona returns one merged output stream, given
        as both ``stdout`` and ``stderr`` so error messages can quote its tail."""
        opts = self._options
        if argv and argv[0] == "python":
            argv = [opts.python, "-S", "-B", *argv[1:]]
        sandbox = self._sandbox(sandbox_id)
        isolated = bool(sandbox.network_block_all)
        note = None if isolated else "Daytona reports network_block_all off for this sandbox"
        start = time.monotonic()
        try:
            response = sandbox.process.exec(
                shlex.join(argv),
                cwd=opts.workdir,
                env={"PYTHONPATH": opts.workdir, "PYTHONDONTWRITEBYTECODE": "1"},
                timeout=max(1, math.ceil(timeout)),
            )
        except DaytonaTimeoutError:
            return ExecResult(
                exit_code=-9,
                stdout="",
                stderr=f"killed after {timeout:.1f} s",
                timed_out=True,
                network_isolated=isolated,
                note=note,
                confinement="daytona",
                seconds=time.monotonic() - start,
            )
        except DaytonaError as exc:
            raise _wrap("exec", exc, self._options.api_key) from None
        output = _bounded(response.result or "")
        return ExecResult(
            exit_code=response.exit_code if response.exit_code is not None else -1,
            stdout=output,
            stderr=output,
            timed_out=False,
            network_isolated=isolated,
            note=note,
            confinement="daytona",
            seconds=time.monotonic() - start,
        )

    def download(self, sandbox_id: str, relpath: str) -> bytes:
        remote = self._path(relpath)
        sandbox = self._sandbox(sandbox_id)
        data = self._call(
            f"download of {relpath}",
            lambda: sandbox.fs.download_file(remote, self._transfer_timeout),
        )
        if data is None:
            raise SandboxError(f"Daytona returned no content for {relpath}")
        return bytes(data)

    def delete(self, sandbox_id: str) -> None:
        """Ask Daytona to delete the sandbox, then wait up to ``delete_wait`` seconds until
        it is gone, so that cleanup's next listing tells the truth. Idempotent: a sandbox
        Daytona no longer knows is deleted already. One that stays (never deletes) is
        left for cleanup to report."""
        opts = self._options
        try:
            sandbox = self._client.get(sandbox_id, request_timeout=opts.request_timeout)
            self._client.delete(sandbox, timeout=opts.request_timeout, wait=False)
            deadline = time.monotonic() + opts.delete_wait
            while time.monotonic() < deadline:
                state = self._client.get(sandbox_id, request_timeout=opts.request_timeout).state
                if str(getattr(state, "value", state)) == "destroyed":
                    return
                time.sleep(0.25)
        except DaytonaNotFoundError:
            return
        except DaytonaError as exc:
            raise _wrap(f"delete of sandbox {sandbox_id}", exc, self._options.api_key) from None

    def list(self, labels: dict[str, str]) -> list[str]:
        """Sandboxes in the account with every label (and ForkLab's own), not destroyed."""
        query = ListSandboxesQuery(labels={**labels, MANAGED_LABEL[0]: MANAGED_LABEL[1]})
        return self._call(
            "sandbox list",
            lambda: [
                str(s.id)
                for s in self._client.list(query, request_timeout=self._options.request_timeout)
                if str(getattr(s.state, "value", s.state)) != "destroyed"
            ],
        )
