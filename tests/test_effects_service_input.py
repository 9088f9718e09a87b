"""The local payments and mail service reads request bodies with the shared strict reader
(issue 35, point 7): a ``NaN``/``Infinity``/``1e999`` amount, nesting past the bound, a
body that is not JSON or a bad ``Content-Length`` is a 400 and applies nothing; before,
``{"amount": NaN}`` was charged and a bad ``Content-Length`` ended the handler in a
traceback with no answer."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator

import pytest

from forklab.workers.runfork.effects_service import EffectsService


@pytest.fixture
def service() -> Iterator[EffectsService]:
    server = EffectsService(("127.0.0.1", 0))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _post(server: EffectsService, body: bytes, length: str | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=5)
    conn.putrequest("POST", "/payments/charge")
    conn.putheader("Content-Length", length if length is not None else str(len(body)))
    conn.putheader("Idempotency-Key", "k-1")
    conn.endheaders()
    if length is None:
        conn.send(body)
    response = conn.getresponse()
    answer = response.status, response.read().decode()
    conn.close()
    return answer


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"amount": NaN, "customer": "c1"}', "NaN is not a finite number"),
        (b'{"amount": -Infinity}', "-Infinity is not a finite number"),
        (b'{"amount": 1e999}', "1e999 is not a finite number"),
        (b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested"),
        (b"{oops", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
    ],
)
def test_a_hostile_body_is_a_400_and_charges_nothing(
    service: EffectsService, body: bytes, says: str
) -> None:
    status, text = _post(service, body)
    assert status == 400 and says in json.loads(text)["error"], text
    assert service.log == []


def test_a_bad_content_length_is_a_400_not_a_dropped_connection(service: EffectsService) -> None:
    for length in ("lots", "-5"):
        status, text = _post(service, b"", length=length)
        assert status == 400 and "Content-Length" in text
    assert service.log == []
    ok, text = _post(service, b'{"amount": 12.5, "customer": "c1"}')
    assert ok == 200 and json.loads(text)["applied_now"] is True
