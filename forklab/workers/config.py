"""ForkLab's connection and folder settings: flags first, then ``FORKLAB_*``, then defaults.

This module and the CLI are the only places that read the environment; everything else
receives a ``Settings`` (or the clients built from it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from forklab.activities.experiment.approval_keys import ALLOW_UNAPPROVED
from forklab.activities.sandbox.jail import ALLOW_UNCONFINED


class ConfigError(ValueError):
    """A setting that cannot be used; the message names it and says how to fix it."""


#: Field → environment variable.
ENV = {
    "address": "FORKLAB_ADDRESS",
    "namespace": "FORKLAB_NAMESPACE",
    "task_queue": "FORKLAB_TASK_QUEUE",
    "home": "FORKLAB_HOME",
    "ui_port": "FORKLAB_UI_PORT",
    "http_port": "FORKLAB_HTTP_PORT",
    "metrics_port": "FORKLAB_METRICS_PORT",
    "max_sandboxes": "FORKLAB_MAX_SANDBOXES",
    "allow_unapproved": ALLOW_UNAPPROVED,
    "allow_unconfined_workloads": ALLOW_UNCONFINED,
    "artifacts": "FORKLAB_ARTIFACTS",
    "ledger": "FORKLAB_LEDGER",
    "s3_endpoint": "FORKLAB_S3_ENDPOINT",
    "store_retry_seconds": "FORKLAB_STORE_RETRY_SECONDS",
    "collect_seconds": "FORKLAB_COLLECT_SECONDS",
    "deployment": "FORKLAB_DEPLOYMENT",
    "build_id": "FORKLAB_BUILD_ID",
    "promote": "FORKLAB_PROMOTE",
}
#: Settings an error names by their variable only: the shared stores have no flag (they are a
#: deployment's, not a command's), and ``--no-promote`` cannot carry a bad value.
ENV_ONLY = frozenset(
    {"artifacts", "ledger", "s3_endpoint", "store_retry_seconds", "collect_seconds", "promote"}
)
#: Worker deployment names and build ids: letters, digits, ``_``, ``-`` (build ids also
#: ``.`` and ``+``, as in ``1.4.0+abc``); Temporal joins the two into one version string.
_VERSION_NAMES = {
    "deployment": (
        re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}"),
        "use up to 100 letters, digits, _ and -, e.g. forklab",
    ),
    "build_id": (
        re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}"),
        "use up to 100 letters, digits, _ - . and +, e.g. 1.4.0",
    ),
}


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str = Field(default="localhost:7233", description="Temporal frontend host:port.")
    namespace: str = "default"
    task_queue: str = "forklab"
    home: Path = Field(default=Path("~/.forklab"), description="Where ForkLab keeps its files.")
    ui_port: int = Field(default=8233, ge=1, le=65535, description="The dev server's Web UI.")
    http_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="The dev server's HTTP API; unset: the address's port + 10.",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="The dev server's /metrics; unset: the address's port + 11.",
    )
    max_sandboxes: int = Field(default=8, ge=1, description="Sandboxes one worker runs at once.")
    allow_unapproved: bool = Field(
        default=False,
        description="Worker policy: may a spec's approval.required: false skip approval?",
    )
    allow_unconfined_workloads: bool = Field(
        default=False,
        description="Worker policy: without a working bubblewrap, may workload code run as "
        "a process that can read and write whatever the worker can? (default: the "
        "experiment fails before approval)",
    )
    artifacts: str = Field(
        default="",
        description="Artifact store: s3://bucket/prefix (shared), or a folder; "
        "empty: <home>/artifacts.",
    )
    ledger: str = Field(
        default="",
        description="Ledger: postgresql://user@host/db (shared), or a SQLite file; "
        "empty: <home>/ledger.sqlite.",
    )
    s3_endpoint: str = Field(
        default="",
        description="S3 endpoint URL for MinIO, R2 and the like (credentials: the AWS "
        "variables); empty: AWS S3.",
    )
    store_retry_seconds: float = Field(
        default=60.0,
        gt=0,
        le=600,
        description="How long one activity waits out an object store or PostgreSQL outage "
        "(the wait is not charged to an experiment's compute budget).",
    )
    collect_seconds: float = Field(
        default=600.0,
        ge=0,
        le=86_400,
        description="How often a worker drops the pins of runs that ended and collects the "
        "workspace layers nothing needs, while it runs (0: only at each run's cleanup).",
    )

    deployment: str = Field(
        default="",
        description="Worker deployment name: pin each experiment to the build it started "
        "on (docs/deployment.md, Rolling upgrades); empty: unversioned workers.",
    )
    build_id: str = Field(
        default="", description="This worker's build id; empty: a digest of ForkLab's code."
    )
    promote: bool = Field(
        default=True,
        description="May a versioned worker make its build current when it is the newest?",
    )

    @field_validator("deployment", "build_id")
    @classmethod
    def _version_name(cls, value: str, info: ValidationInfo) -> str:
        pattern, rule = _VERSION_NAMES[str(info.field_name)]
        if value and not pattern.fullmatch(value):
            raise ValueError(rule)
        return value

    @field_validator("artifacts")
    @classmethod
    def _artifacts(cls, value: str) -> str:
        if value.startswith("s3://") and not value.removeprefix("s3://").split("/")[0]:
            raise ValueError("s3:// needs a bucket name: s3://bucket/prefix")
        if "://" in value and not value.startswith("s3://"):
            raise ValueError("use s3://bucket/prefix or a folder path")
        return value

    @field_validator("ledger")
    @classmethod
    def _ledger(cls, value: str) -> str:
        if "://" in value and not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("use postgresql://user@host:port/database or a SQLite file path")
        return value

    @field_validator("s3_endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("use an http:// or https:// URL, e.g. http://minio:9000")
        return value

    @classmethod
    def load(
        cls, flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
    ) -> Settings:
        """Settings from ``flags`` (None values ignored), then ``env``, then the defaults."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for field, var in ENV.items():
            if env.get(var):
                values[field] = env[var]
        values.update({k: v for k, v in (flags or {}).items() if v is not None})
        try:
            settings = cls.model_validate(values)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = str(err["loc"][0])
            where = (
                ENV[field]
                if field in ENV_ONLY
                else f"flag --{field.replace('_', '-')} or {ENV[field]}"
            )
            raise ConfigError(
                f"setting {field} ({where}) is invalid: {err['msg']}; fix its value"
            ) from None
        host, _, port = settings.address.rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ConfigError(
                f"setting address ({ENV['address']}) is {settings.address!r}; use host:port, "
                "the port from 1 to 65535"
            )
        if settings.build_id and not settings.deployment:
            raise ConfigError(
                f"setting build_id (flag --build-id or {ENV['build_id']}) needs a deployment "
                f"name (flag --deployment or {ENV['deployment']}); set one or drop the build id"
            )
        return settings.model_copy(update={"home": settings.home.expanduser().resolve()})

    @property
    def host(self) -> str:
        return self.address.rpartition(":")[0]

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    @property
    def dev_http_port(self) -> int:
        """The port of the dev server's HTTP API: pinned, never a random free one."""
        return self.http_port or _beside(self.port, 10)

    @property
    def dev_metrics_port(self) -> int:
        """The port of the dev server's ``/metrics``: pinned, never a random free one."""
        return self.metrics_port or _beside(self.port, 11)

    @property
    def ui_url(self) -> str:
        host = "localhost" if self.host in ("0.0.0.0", "127.0.0.1") else self.host
        return f"http://{host}:{self.ui_port}"

    def experiment_url(self, workflow_id: str) -> str:
        return f"{self.ui_url}/namespaces/{self.namespace}/workflows/{workflow_id}"

    # --- folders under home ------------------------------------------------------------
    @property
    def sandboxes_dir(self) -> Path:
        return self.home / "sandboxes"

    @property
    def artifacts_dir(self) -> Path:
        """The local artifact folder; there is none when the store is in S3 (a folder
        named after the ``s3://`` URL would silently take the objects)."""
        if self.shared_artifacts:
            raise ConfigError(
                f"FORKLAB_ARTIFACTS is the S3 store {self.artifacts}; there is no local "
                "artifact folder (use forklab.workers.stores.artifact_store)"
            )
        return Path(self.artifacts).expanduser() if self.artifacts else self.home / "artifacts"

    @property
    def shared_artifacts(self) -> bool:
        return self.artifacts.startswith("s3://")

    @property
    def reports_dir(self) -> Path:
        """``forklab report`` writes each experiment's report files in a folder here."""
        return self.home / "reports"

    @property
    def ledger_path(self) -> Path:
        """The SQLite ledger file (when the ledger is not in PostgreSQL)."""
        return Path(self.ledger).expanduser() if self.ledger else self.home / "ledger.sqlite"

    @property
    def shared_ledger(self) -> bool:
        return self.ledger.startswith(("postgresql://", "postgres://"))

    @property
    def temporal_db(self) -> Path:
        return self.home / "temporal.db"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def run_dir(self) -> Path:
        """Pidfiles of the server and worker that ``forklab up`` started."""
        return self.home / "run"


def _beside(port: int, offset: int) -> int:
    """``port + offset``, or below ``port`` when that would pass 65535."""
    return port + offset if port + offset <= 65535 else port - offset


def sources(
    flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Where ``Settings.load(flags, env)`` took each setting from: ``flag``, ``env``
    (naming the variable) or ``default`` (``forklab config``)."""
    env = os.environ if env is None else env
    given = {k for k, v in (flags or {}).items() if v is not None}
    return {
        field: "flag" if field in given else f"env {var}" if env.get(var) else "default"
        for field, var in ENV.items()
    }
