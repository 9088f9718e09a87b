"""Bounds on what a Daytona server can make the worker hold or wait for.

The ``daytona`` SDK's generated clients (control plane and toolbox) read every response
body whole, with no limit, and most calls send no client timeout: a server that answers a
never-ending body made the worker read it for ever (5.7 GiB in 22 s, growing), and one
that never answers held the calling thread for ever. This module wraps each client's REST
object (on the one ``Daytona`` instance the backend owns, not globally): a request without
a timeout gets the backend's, and a body is read in chunks up to a size and a deadline.

It also judges the sandbox ids Daytona hands back. The SDK joins an id unquoted into the
toolbox's URL path, so an id such as ``../../sandbox/<other>`` sent ForkLab's next request,
with its API key, to another route; an id with a line break or an escape sequence would be
carried into errors, progress and the evidence log.
"""

from __future__ import annotations

import re
import time
from typing import Any

import urllib3
from daytona import DaytonaError
from daytona.common.errors import DaytonaConnectionError

#: The most any one Daytona answer (JSON) may hold; a command's output is cut to 64 KiB.
MAX_BODY_BYTES = 16 * 1024 * 1024
_CHUNK = 64 * 1024
#: What a Daytona sandbox id looks like (Daytona issues UUIDs): one plain token.
_PLAIN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def shown(text: str, limit: int = 80) -> str:
    """``text`` as a bounded, escaped literal: safe in an error, a log line or a terminal."""
    quoted = ascii(text)
    return quoted if len(quoted) <= limit else f"{quoted[:limit]}…"


def plain_sandbox_id(sandbox_id: object) -> str | None:
    """``sandbox_id`` if it is a plain token (no ``/``, ``..`` alone, controls); else None."""
    if not isinstance(sandbox_id, str) or not _PLAIN_ID.fullmatch(sandbox_id):
        return None
    return None if set(sandbox_id) == {"."} else sandbox_id


def _read_bounded(response: Any, limit: int, seconds: float) -> bytes:
    """Read a urllib3 response body in chunks; refuse past ``limit`` bytes or ``seconds``."""
    deadline = time.monotonic() + seconds
    data = bytearray()
    while chunk := response.read(_CHUNK):
        data += chunk
        if len(data) > limit:
            response.close()
            raise DaytonaError(
                f"Daytona's answer was longer than {limit // (1024 * 1024)} MiB; refused "
                "(check DAYTONA_API_URL points at Daytona)"
            )
        if time.monotonic() > deadline:
            response.close()
            raise DaytonaError(
                f"Daytona's answer was still arriving after {seconds:g} s; refused (check "
                "DAYTONA_API_URL points at Daytona)"
            )
    return bytes(data)


class _BoundedRest:
    """A generated client's REST object whose requests time out and whose bodies are
    bounded; everything else is the wrapped object's."""

    def __init__(self, inner: Any, timeout: float, limit: int) -> None:
        self._inner = inner
        self._timeout = timeout
        self._limit = limit

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def request(self, *args: Any, _request_timeout: Any = None, **kwargs: Any) -> Any:
        timeout = self._timeout if _request_timeout is None else _request_timeout
        try:
            answer = self._inner.request(*args, _request_timeout=timeout, **kwargs)
        except urllib3.exceptions.HTTPError as exc:  # a timeout or a dropped connection
            raise DaytonaConnectionError(f"Daytona did not answer ({type(exc).__name__})") from None
        answer.data = _read_bounded(answer.response, self._limit, self._timeout)
        return answer


def bound_client(client: Any, timeout: float, limit: int = MAX_BODY_BYTES) -> None:
    """Wrap the REST objects of a ``Daytona`` client's control-plane and toolbox clients.

    They are the SDK's private attributes (it offers no hook for a body limit): a release
    without them is refused here, in one sentence, rather than run unbounded."""
    try:
        apis = [client._api_client, client._toolbox_api_client]
        for api in apis:
            api.rest_client  # noqa: B018  (checked before anything is wrapped)
    except AttributeError:
        raise DaytonaError(
            "this daytona SDK release has no REST clients for ForkLab to bound (its "
            "internals changed); install an earlier release"
        ) from None
    for api in apis:
        if not isinstance(api.rest_client, _BoundedRest):
            api.rest_client = _BoundedRest(api.rest_client, timeout, limit)
