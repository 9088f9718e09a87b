"""A hostile readout model server against the real ``openai`` client: an answer of
enormous size, a tool call, the wrong types. Each ends in the deterministic readout,
bounded in memory and time."""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_openai import Answer, FakeOpenAI, fake_openai

from forklab.activities.experiment.readout import ReadoutActivities, ReadoutConfig
from forklab.activities.stores.artifacts import LocalArtifactStore
from forklab.cli.experiment.rehearsal import rehearse
from forklab.cli.experiment.specfile import load_spec
from forklab.experiments.experiment.readout.packet import EvidencePacket, evidence_packet
from forklab.experiments.experiment.readout.schema import ReadoutSource, ShownReadout

ROOT = Path(__file__).resolve().parent.parent
SECRET = "sk-readout-secret"


@pytest.fixture(scope="module")
def packet() -> EvidencePacket:
    spec = load_spec(ROOT / "forklab" / "workloads" / "retry-cascade.yaml")
    return evidence_packet(rehearse(spec.model_copy(update={"episodes": 10}), processes=1))


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with fake_openai() as state:
        yield state


async def _shown(server: FakeOpenAI, packet: EvidencePacket, answer: Answer) -> ShownReadout:
    server.answer = answer
    config = ReadoutConfig(
        base_url=server.base_url, api_key=SECRET, model="hostile", timeout_seconds=20
    )
    return await ReadoutActivities(LocalArtifactStore(Path("/nonexistent")), config).shown_readout(
        packet
    )


def _peak_mib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


async def test_an_endless_answer_is_cut_off_at_a_bound(
    server: FakeOpenAI, packet: EvidencePacket
) -> None:
    """Before: the client read the whole body (4.4 GiB in 11 s of a 2 GB answer)."""
    before, start = _peak_mib(), time.monotonic()
    shown = await _shown(server, packet, Answer(flood_bytes=400 * 1024 * 1024))
    assert shown.source is ReadoutSource.deterministic
    assert shown.why == "the model's answer was longer than 1048576 bytes"
    assert _peak_mib() - before < 100 and time.monotonic() - start < 10


@pytest.mark.parametrize(
    ("message", "why"),
    [
        (
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "start_run", "arguments": '{"episodes": 1e9}'},
                    }
                ],
            },
            "the model gave no readout (refusal or empty answer)",
        ),
        ({"role": "assistant", "content": 42}, "the model's answer is not a readout"),
        ({"role": "assistant", "content": '{"summary": ["x"]}'}, "not a readout"),
    ],
)
async def test_a_tool_call_or_wrong_types_end_in_the_deterministic_readout(
    server: FakeOpenAI, packet: EvidencePacket, message: dict[str, object], why: str
) -> None:
    shown = await _shown(server, packet, Answer(message=message))
    assert shown.source is ReadoutSource.deterministic and why in shown.why
    assert SECRET not in shown.model_dump_json()
