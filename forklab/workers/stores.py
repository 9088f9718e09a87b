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

from forklab.activities.stores.artifacts import ArtifactStore, LocalArtifactStore
from forklab.activities.stores.effect_ledger import EffectLedger, SqliteEffectLedger
from forklab.activities.stores.ledger import Ledger, LedgerError, SqliteLedger
from forklab.activities.stores.outages import StoreUnavailableError
from forklab.workers.config import ENV, ConfigError, Settings
from forklab.workers.extras import Extra, require_extra
from forklab.workers.runfork.agent_config import AgentSettings

# The S3 and PostgreSQL clients (boto3, psycopg) are imported only when a setting names a
# shared store: they take longer to import than an operator command takes to run.
if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from forklab.activities.stores.postgres import PostgresDatabase


def s3_client(endpoint: str) -> S3Client:
    """A client for ``endpoint`` (empty: AWS); module-level so a partial of it pickles.
    One request's own retries; longer outages are ridden out by
    ``forklab.activities.stores.outages``."""
    import boto3
    from botocore.config import Config

    config = Config(
        retries={"mode": "standard", "max_attempts": 2},
        connect_timeout=5,
        read_timeout=60,
        s3={"addressing_style": "path"},
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint or None, config=config)


def artifact_store(settings: Settings) -> ArtifactStore:
    if not settings.shared_artifacts:
        return LocalArtifactStore(settings.artifacts_dir)
    require_extra(Extra.s3, f"{ENV['artifacts']}=s3://…")
    from forklab.activities.stores.artifacts_s3 import S3ArtifactStore

    bucket, _, prefix = settings.artifacts.removeprefix("s3://").partition("/")
    factory = partial(s3_client, settings.s3_endpoint)
    return S3ArtifactStore(factory, bucket, prefix, settings.store_retry_seconds)


def shared_database(settings: Settings) -> PostgresDatabase | None:
    """The PostgreSQL database of ``FORKLAB_LEDGER``, for every store that shares it
    (the experiment ledger, the effect ledger); None when the ledger is a local file."""
    if not settings.shared_ledger:
        return None
    require_extra(Extra.postgres, f"{ENV['ledger']}=postgresql://…")
    from forklab.activities.stores.postgres import PostgresDatabase

    return PostgresDatabase(settings.ledger, settings.store_retry_seconds)


def ledger(settings: Settings) -> Ledger:
    db = shared_database(settings)
    if db is None:
        return SqliteLedger(settings.ledger_path)
    from forklab.activities.stores.ledger_postgres import PostgresLedger

    return PostgresLedger(db)


def effect_ledger(agent: AgentSettings) -> EffectLedger:
    if not agent.effects_database:
        return SqliteEffectLedger(agent.effect_ledger_path)
    require_extra(Extra.postgres, f"{ENV['ledger']}=postgresql://…")
    from forklab.activities.stores.effect_ledger_postgres import PostgresEffectLedger
    from forklab.activities.stores.postgres import PostgresDatabase

    return PostgresEffectLedger(PostgresDatabase(agent.effects_database, agent.store_retry_seconds))


def check_stores(settings: Settings) -> None:
    """At worker start: fail with the fix when a shared store is misconfigured, instead of
    failing every activity later. The shared stores' clients are imported only when a
    setting names them (and then say which extra to install when missing)."""
    store = artifact_store(settings)
    if settings.shared_artifacts:
        from botocore.exceptions import BotoCoreError, ClientError

        from forklab.activities.stores.artifacts_s3 import S3ArtifactStore

        assert isinstance(store, S3ArtifactStore)
        try:
            store.check_bucket()
        except (ClientError, BotoCoreError, StoreUnavailableError) as exc:
            raise ConfigError(
                f"artifact store {store.location} ({ENV['artifacts']}) cannot be used: {exc}; "
                f"create the bucket, check {ENV['s3_endpoint']} and the AWS credentials"
            ) from None
    records = ledger(settings)
    failures: tuple[type[Exception], ...] = (StoreUnavailableError, LedgerError)
    if settings.shared_ledger:
        import psycopg

        from forklab.activities.stores.postgres import SchemaError

        failures += (psycopg.Error, SchemaError)
    try:
        records.experiment("forklab-start-up-check")  # creates or migrates the schema
    except failures as exc:
        raise ConfigError(
            f"ledger {records.location} ({ENV['ledger']}) cannot be used: {exc}"
        ) from None
