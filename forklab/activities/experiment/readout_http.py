"""A bound on how much a readout model's server can make the worker read.

The ``openai`` client reads a whole answer into memory before it parses it, and the
readout's only bound was its timeout: a server that sent an endless answer made the
worker read 4.4 GiB in 11 s (it would have gone on to the timeout). A readout is at most
a few KiB (``forklab.experiments.experiment.readout.schema``), so an answer past
``MAX_ANSWER_BYTES`` is cut off and the deterministic readout shown.

httpx2 (the openai client's HTTP stack) is imported on use, as the SDK is
(``forklab.activities.experiment.readout``): this module is imported inside Temporal's workflow
sandbox.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx2

#: The most a model's answer (the whole HTTP body) may hold.
MAX_ANSWER_BYTES = 1024 * 1024


class AnswerTooLargeError(Exception):
    """The model's server sent more than the readout can hold."""


def bounded_http_client(timeout: float, limit: int = MAX_ANSWER_BYTES) -> httpx2.AsyncClient:
    """An httpx2 client whose response bodies stop at ``limit`` bytes."""
    import httpx2

    class _Capped(httpx2.AsyncByteStream):
        def __init__(self, inner: httpx2.AsyncByteStream) -> None:
            self._inner = inner

        async def __aiter__(self) -> AsyncIterator[bytes]:
            seen = 0
            async for chunk in self._inner:
                seen += len(chunk)
                if seen > limit:
                    raise AnswerTooLargeError(f"the model's answer was longer than {limit} bytes")
                yield chunk

        async def aclose(self) -> None:
            await self._inner.aclose()

    class _Transport(httpx2.AsyncBaseTransport):
        def __init__(self) -> None:
            self._inner = httpx2.AsyncHTTPTransport()

        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            got = await self._inner.handle_async_request(request)
            assert isinstance(got.stream, httpx2.AsyncByteStream)
            return httpx2.Response(
                got.status_code,
                headers=got.headers,
                stream=_Capped(got.stream),
                extensions=got.extensions,
                request=request,
            )

        async def aclose(self) -> None:
            await self._inner.aclose()

    return httpx2.AsyncClient(transport=_Transport(), timeout=timeout)
