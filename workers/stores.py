"""The state stores a worker or the CLI uses, chosen by settings.

=====================  =========================================  ==========================
setting                value                                      store
=====================  =========================================  ==========================
FORKLAB_ARTIFACTS      empty (default) or a folder                ``LocalArtifactStore``
FORKLAB_ARTIFACTS      ``s3://bucket/prefix``                     ``S3ArtifactStore``
FORKLAB_LEDGER         empty (default) or a SQLite file           ``SqliteLedger``
FORKLAB_LEDGER         ``postgresql://user:pw@host:port/db``      ``PostgresLedger``
(agent runs)           FORKLAB_LEDGER empty or a SQLite file      ``SqliteEffectLedger``
(agent runs)           FORKLAB_LEDGER ``postgresql://…``          ``PostgresEffectLedger``
=====================  =========================================  ==========================

The effect ledger of forked agent runs follows the experiment ledger: in its PostgreSQL
database when there is one (its own tables), else ``<home>/effects.sqlite``.

The S3 client takes its endpoint from ``FORKLAB_S3_ENDPOINT`` (MinIO, R2, …; empty for
AWS) and its credentials and region from boto3's standard chain (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``~/.aws``, instance roles).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import boto3
import psycopg
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from activities.artifacts import ArtifactStore, LocalArtifactStore
from activities.artifacts_s3 import S3ArtifactStore
from activities.effect_ledger import EffectLedger, SqliteEffectLedger
from activities.effect_ledger_postgres import PostgresEffectLedger
from activities.ledger import Ledger, LedgerError, SqliteLedger
from activities.ledger_postgres import PostgresLedger
from activities.outages import StoreUnavailableError
from activities.postgres import PostgresDatabase, SchemaError
from workers.agent_config import AgentSettings
from workers.config import ENV, ConfigError, Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

#: One request's own retries; longer outages are ridden out by ``activities.outages``.
_S3_CONFIG = Config(
    retries={"mode": "standard", "max_attempts": 2},
    connect_timeout=5,
    read_timeout=60,
    s3={"addressing_style": "path"},
)


def s3_client(endpoint: str) -> S3Client:
    """A client for ``endpoint`` (empty: AWS); module-level so a partial of it pickles."""
    return boto3.session.Session().client("s3", endpoint_url=endpoint or None, config=_S3_CONFIG)


def artifact_store(settings: Settings) -> ArtifactStore:
    if not settings.shared_artifacts:
        return LocalArtifactStore(settings.artifacts_dir)
    bucket, _, prefix = settings.artifacts.removeprefix("s3://").partition("/")
    factory = partial(s3_client, settings.s3_endpoint)
    return S3ArtifactStore(factory, bucket, prefix, settings.store_retry_seconds)


def shared_database(settings: Settings) -> PostgresDatabase | None:
    """The PostgreSQL database of ``FORKLAB_LEDGER``, for every store that shares it
    (the experiment ledger, the effect ledger); None when the ledger is a local file."""
    if not settings.shared_ledger:
        return None
    return PostgresDatabase(settings.ledger, settings.store_retry_seconds)


def ledger(settings: Settings) -> Ledger:
    db = shared_database(settings)
    return SqliteLedger(settings.ledger_path) if db is None else PostgresLedger(db)


def effect_ledger(agent: AgentSettings) -> EffectLedger:
    if not agent.effects_database:
        return SqliteEffectLedger(agent.effect_ledger_path)
    return PostgresEffectLedger(PostgresDatabase(agent.effects_database, agent.store_retry_seconds))


def check_stores(settings: Settings) -> None:
    """At worker start: fail with the fix when a shared store is misconfigured, instead of
    failing every activity later."""
    store = artifact_store(settings)
    if isinstance(store, S3ArtifactStore):
        try:
            store.check_bucket()
        except (ClientError, BotoCoreError, StoreUnavailableError) as exc:
            raise ConfigError(
                f"artifact store {store.location} ({ENV['artifacts']}) cannot be used: {exc}; "
                f"create the bucket, check {ENV['s3_endpoint']} and the AWS credentials"
            ) from None
    records = ledger(settings)
    try:
        records.experiment("forklab-start-up-check")  # creates or migrates the schema
    except (StoreUnavailableError, psycopg.Error, SchemaError, LedgerError) as exc:
        raise ConfigError(
            f"ledger {records.location} ({ENV['ledger']}) cannot be used: {exc}"
        ) from None
