"""The local stand-in model through the real ``openai`` SDK over HTTP: chat completions
and the Responses API, tool calls in both, streaming, ``seed``, and the behaviour model."""

from __future__ import annotations

import http.client
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from urllib.parse import urlparse

import openai
import pytest

from forklab.experiments.runfork.scripted_model import (
    BEHAVIOURS,
    mistake_probability,
    respond,
)
from forklab.workers.runfork.model_server import ModelServer

MAIL_TOOL = {
    "type": "function",
    "function": {
        "name": "send_email",
        "description": "Send an email.",
        "parameters": {
            "type": "object",
            "properties": {"to": {"type": "string"}, "subject": {"type": "string"}},
        },
    },
}
RESPONSES_TOOL = {"type": "function", "name": "send_email", **MAIL_TOOL["function"]}  # type: ignore[dict-item]
TICKET = "TICKET: I want a refund for order 12\nCUSTOMER: ann@example.test"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    server = ModelServer(("127.0.0.1", 0), seed=3)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()
    server.server_close()


@pytest.fixture
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="local", max_retries=0)


def test_chat_completions_with_a_tool_call_then_the_answer(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model="slow",
        messages=[{"role": "user", "content": TICKET}],
        tools=[MAIL_TOOL],  # type: ignore[list-item]
    )
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert first.choices[0].finish_reason == "tool_calls"
    args = json.loads(call.function.arguments)  # type: ignore[union-attr]
    assert args["to"] == "ann@example.test" and "refund is approved" in args["body"]
    second = client.chat.completions.create(
        model="slow",
        messages=[
            {"role": "user", "content": TICKET},
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": call.id, "content": "sent"},
        ],
        tools=[MAIL_TOOL],  # type: ignore[list-item]
    )
    assert second.choices[0].message.content == "Replied to the customer by email."
    assert second.usage is not None and second.usage.total_tokens > 0


def test_chat_completions_stream_text_and_tool_calls(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="slow",
            messages=[{"role": "user", "content": "STEP: risks\nTOPIC: caching"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("[slow] risks on caching")
    assert chunks[-1].usage is not None
    streamed = list(
        client.chat.completions.create(
            model="slow",
            messages=[{"role": "user", "content": TICKET}],
            tools=[MAIL_TOOL],
            stream=True,  # type: ignore[list-item]
        )
    )
    calls = [t for c in streamed if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert calls and calls[0].function is not None and calls[0].function.name == "send_email"
    assert streamed[-1].choices[0].finish_reason == "tool_calls"


def test_the_responses_api_with_tools_a_second_turn_and_streaming(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="candidate",
        instructions="Be helpful.",
        input=TICKET,
        tools=[RESPONSES_TOOL],  # type: ignore[list-item]
    )
    (call,) = [o for o in first.output if o.type == "function_call"]
    assert call.name == "send_email" and json.loads(call.arguments)["to"] == "ann@example.test"
    second = client.responses.create(
        model="candidate",
        input=[
            {"role": "user", "content": TICKET},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "sent"},
        ],  # type: ignore[list-item]
        tools=[RESPONSES_TOOL],  # type: ignore[list-item]
    )
    assert second.output_text == "Replied to the customer by email."
    assert second.usage is not None and second.usage.output_tokens > 0
    with client.responses.stream(model="slow", input="STEP: summary\nTOPIC: caching") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text and final.output_text.startswith("[slow] summary")
    events = list(
        client.responses.create(model="slow", input=TICKET, tools=[RESPONSES_TOOL], stream=True)  # type: ignore[list-item]
    )
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done and json.loads(done[0].arguments)["to"] == "ann@example.test"


def _recs(client: openai.OpenAI, model: str, seed: int | None, temperature: float = 1.0) -> str:
    out = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "STEP: recommendations\nTOPIC: caching"}],
        temperature=temperature,
        **({"seed": seed} if seed is not None else {}),
    )
    return out.choices[0].message.content or ""


def test_seed_fixes_the_answer_and_the_mistake_rates_follow_the_behaviour_model(
    client: openai.OpenAI,
) -> None:
    assert len({_recs(client, "fast", 42) for _ in range(5)}) == 1
    # without a seed the server's counter varies the draws
    assert len({_recs(client, "slow", None, 2.0) for _ in range(30)}) > 1
    thin = sum(_recs(client, "fast", s).startswith("draft") for s in range(300))
    assert abs(thin / 300 - BEHAVIOURS["fast"].thin_recommendations) < 0.1
    assert sum(_recs(client, "candidate", s).startswith("draft") for s in range(100)) < 12
    # an unknown name behaves as the documented default, greedy at temperature 0
    assert not _recs(client, "some-new-model", 1, 0.0).startswith("draft")
    assert _recs(client, "fast", 1, 0.0).startswith("draft")


def test_temperature_scales_the_log_odds_of_a_mistake() -> None:
    assert mistake_probability(0.6, 0) == 1.0 and mistake_probability(0.4, 0) == 0.0
    assert mistake_probability(0.3, 1.0) == pytest.approx(0.3)
    assert 0.3 < mistake_probability(0.3, 2.0) < 0.5
    assert mistake_probability(0.3, 0.5) < 0.3
    msgs = [{"role": "user", "content": TICKET}]
    greedy = respond("fast", msgs, ["send_email"])
    assert "We will follow up." in greedy.tool_calls[0].arguments["body"]


def test_a_malformed_request_is_a_400_naming_the_field(url: str) -> None:
    for body, field in (
        ({"model": "fast", "messages": "hi"}, "messages"),
        ({"model": "fast", "messages": [], "seed": "1"}, "seed"),
        ({"model": "fast", "messages": [], "temperature": 9}, "temperature"),
        ({"model": "", "input": "x"}, "model"),
    ):
        path = "/responses" if "input" in body else "/chat/completions"
        req = urllib.request.Request(
            url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=5)
        assert info.value.code == 400
        assert field in json.loads(info.value.read())["error"]["message"]


def test_a_bad_content_length_is_refused_at_once(url: str) -> None:
    where = urlparse(url)
    for length in ("-5", "lots", str(64 * 1024 * 1024)):
        conn = http.client.HTTPConnection(where.hostname or "", where.port, timeout=5)
        conn.putrequest("POST", "/v1/chat/completions")
        conn.putheader("Content-Length", length)
        conn.endheaders()
        response = conn.getresponse()  # answered without waiting for a body
        assert response.status in (400, 413)
        conn.close()


def test_a_counter_instruction_makes_its_mistake_rarer_under_the_same_seeds(
    client: openai.OpenAI,
) -> None:
    def thin(seed: int, system: str) -> bool:
        out = client.chat.completions.create(
            model="fast",
            messages=[
                {"role": "system", "content": system},
                {"role": "user", "content": "STEP: recommendations\nTOPIC: caching"},
            ],
            temperature=1.0,
            seed=seed,
        )
        return (out.choices[0].message.content or "").startswith("draft")

    plain = [thin(s, "You write one section of a report.") for s in range(200)]
    patched = [thin(s, "You write one section. Write every section in full.") for s in range(200)]
    assert abs(sum(plain) / 200 - 0.6) < 0.1
    assert abs(sum(patched) / 200 - 0.15) < 0.07
    # the same seed draws the same uniform: a patched mistake is a plain one too
    assert all(p for p, q in zip(plain, patched, strict=True) if q)


def test_a_body_holding_a_non_finite_number_is_a_400(url: str) -> None:
    """The shared strict reader: ``NaN``, ``Infinity`` and ``1e999`` are not JSON numbers,
    in any field (before, a ``NaN`` inside a message's tool arguments was taken)."""
    for text in (
        b'{"model": "fast", "messages": [{"role": "user", "content": "hi", "x": NaN}]}',
        b'{"model": "fast", "messages": [], "metadata": {"w": -Infinity}}',
        b'{"model": "fast", "messages": [], "top_p": 1e999}',
    ):
        req = urllib.request.Request(
            url + "/chat/completions", data=text, headers={"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=5)
        assert info.value.code == 400
        assert "not a finite number" in json.loads(info.value.read())["error"]["message"]
