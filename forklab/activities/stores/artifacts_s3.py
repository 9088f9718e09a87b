"""The artifact store in an S3-compatible bucket (AWS S3, MinIO, R2, …), shared by workers
on many hosts and by the ``forklab`` CLI.

A blob lives at ``<prefix>/<first two hex>/<remaining hex>``. An S3 PUT is atomic (a
reader sees the old object, the new one or none, never part of one) and the name is the
content's hash, so storing again is idempotent. A run's end mark is the empty object
``<prefix>/ended/<run name>``. The
client comes from a factory built in ``workers/`` (endpoint, credentials); this class only
moves bytes and rides out outages.
It pickles without its client (the analysis runs in a process pool) and builds a new one
on first use wherever it lands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from forklab.activities.stores.artifacts import ArtifactStore, check_digest
from forklab.activities.stores.outages import ride_out

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

#: Error codes an S3 service answers while it is overloaded or restarting.
_TRANSIENT_CODES = frozenset(
    {
        "500",
        "502",
        "503",
        "504",
        "InternalError",
        "ServiceUnavailable",
        "SlowDown",
        "RequestTimeout",
    }
)
_MISSING_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
_T = TypeVar("_T")


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def is_transient(exc: BaseException) -> bool:
    """Network faults (endpoint down, connection reset, timeouts) and 5xx answers."""
    if isinstance(exc, ClientError):
        return _code(exc) in _TRANSIENT_CODES
    return isinstance(exc, BotoCoreError)


class S3ArtifactStore(ArtifactStore):
    def __init__(
        self,
        client_factory: Callable[[], S3Client],
        bucket: str,
        prefix: str,
        retry_seconds: float = 60.0,
    ) -> None:
        self._client_factory = client_factory
        self._client_cache: S3Client | None = None
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._retry_seconds = retry_seconds

    @property
    def _client(self) -> S3Client:
        if self._client_cache is None:
            self._client_cache = self._client_factory()
        return self._client_cache

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client_cache": None}

    @property
    def location(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def key(self, digest: str) -> str:
        check_digest(digest)
        return self._named(f"{digest[:2]}/{digest[2:]}")

    def mark_key(self, name: str) -> str:
        """The key of a run's end mark."""
        return self._named(f"ended/{name}")

    def _named(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _ride_out(self, call: Callable[[], _T]) -> _T:
        return ride_out(call, is_transient, self._retry_seconds, f"object store {self.location}")

    def _read(self, digest: str) -> bytes | None:
        return self._get(self.key(digest))

    def _write(self, digest: str, data: bytes) -> None:
        self._put(self.key(digest), data)

    def _write_mark(self, name: str) -> None:
        self._put(self.mark_key(name), b"")

    def _has_mark(self, name: str) -> bool:
        return self._get(self.mark_key(name)) is not None

    def _get(self, key: str) -> bytes | None:
        def get() -> bytes | None:
            try:
                answer = self._client.get_object(Bucket=self.bucket, Key=key)
            except ClientError as exc:
                if _code(exc) in _MISSING_CODES:
                    return None
                raise
            return answer["Body"].read()

        return self._ride_out(get)

    def _put(self, key: str, data: bytes) -> None:
        def put() -> None:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=data)

        self._ride_out(put)

    def check_bucket(self) -> None:
        """Fail early, with the fix, when the bucket does not exist or is not ours to use."""

        def head() -> None:
            self._client.head_bucket(Bucket=self.bucket)

        self._ride_out(head)
