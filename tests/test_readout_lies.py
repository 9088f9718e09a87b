"""The readout lies of issue 35, each sent by a local OpenAI-compatible server to the real
``openai`` client: a world that does not exist, latency (the positive control, which
raised failures) said to have lowered them, "ninety-nine percent" and "four hundred
episodes", and markup meant for report.md. Each ends in the deterministic readout, and
none of its words reaches the report.

Before: prose was checked for world names in findings or backticks, exact verdict words
and digits only, so all of these stood in the report as "checked against the evidence
packet", and report.md carried the model's raw HTML."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai import Answer, FakeOpenAI, fake_openai

from forklab.activities.experiment.readout import ReadoutActivities, ReadoutConfig
from forklab.activities.stores.artifacts import LocalArtifactStore
from forklab.cli.experiment.rehearsal import rehearse
from forklab.cli.experiment.specfile import load_spec
from forklab.contracts.experiment import AnalysisResult
from forklab.experiments.experiment.readout.check import baseline_pair
from forklab.experiments.experiment.readout.fallback import deterministic_readout
from forklab.experiments.experiment.readout.packet import EvidencePacket, evidence_packet
from forklab.experiments.experiment.readout.schema import ReadoutSource, ShownReadout
from forklab.experiments.experiment.report.model import Report
from forklab.experiments.experiment.report.render_html import render_html
from forklab.experiments.experiment.report.render_markdown import render_markdown

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def report() -> Report:
    """200 episodes: enough for latency's interval to lie wholly on the harmful side."""
    spec = load_spec(ROOT / "forklab" / "workloads" / "retry-cascade.yaml")
    return rehearse(spec.model_copy(update={"episodes": 200}), processes=1)


@pytest.fixture(scope="module")
def packet(report: Report) -> EvidencePacket:
    return evidence_packet(report)


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with fake_openai() as state:
        yield state


def claims(packet: EvidencePacket) -> list[dict[str, Any]]:
    """The faithful claims, as JSON, to be bent one way per test."""
    return list(deterministic_readout(packet).model_dump(mode="json")["claims"])


def bent(packet: EvidencePacket, world: str, **change: Any) -> str:
    out = [{**c, **change} if c["world"] == world else c for c in claims(packet)]
    return json.dumps({"claims": out})


async def shown(server: FakeOpenAI, packet: EvidencePacket, content: str) -> ShownReadout:
    server.answer = Answer(content=content)
    config = ReadoutConfig(base_url=server.base_url, api_key="k", model="liar", timeout_seconds=20)
    acts = ReadoutActivities(LocalArtifactStore(Path("/nonexistent")), config)
    return await acts.shown_readout(packet)


async def test_faithful_claims_are_shown(server: FakeOpenAI, packet: EvidencePacket) -> None:
    """The control: the same claims unbent are the model's readout (so the refusals below
    are the check's doing, not the server's)."""
    result = await shown(server, packet, json.dumps({"claims": claims(packet)}))
    assert result.source is ReadoutSource.model, result.problems


async def test_a_world_the_packet_does_not_hold_is_refused(
    server: FakeOpenAI, packet: EvidencePacket
) -> None:
    lie = "The teleport world eliminated the retry storm entirely."
    prose = await shown(server, packet, json.dumps({"claims": claims(packet), "summary": lie}))
    assert prose.source is ReadoutSource.deterministic and "not a readout" in prose.why
    assert "teleport" not in prose.model_dump_json()
    for name in ("teleport", "the teleport world", "Latency", "latency world", "baseline"):
        extra = {**claims(packet)[0], "world": name}
        answer = json.dumps({"claims": [*claims(packet), extra]})
        result = await shown(server, packet, answer)
        assert result.source is ReadoutSource.deterministic, name
        assert any(
            f"names world {name!r}, which the packet does not hold" in p
            or f"makes a claim about {name}, which the packet does not judge" in p
            for p in result.problems
        ), result.problems


async def test_latency_lowering_failures_is_refused(
    server: FakeOpenAI, packet: EvidencePacket
) -> None:
    pair = baseline_pair(packet, "latency")
    assert pair is not None and pair.ci_high < 0  # the positive control raised failures
    result = await shown(server, packet, bent(packet, "latency", direction="lowered"))
    assert result.source is ReadoutSource.deterministic
    assert (
        "says latency lowered the failure rate; the packet's interval says raised"
        in result.problems
    )
    unclear = await shown(server, packet, bent(packet, "latency", direction="no_clear_change"))
    assert unclear.source is ReadoutSource.deterministic


@pytest.mark.parametrize(
    ("figure", "why"),
    [
        ({"name": "difference", "value": 0.99}, "cites broadcast's difference as 0.99"),
        ({"name": "rescue", "value": 400}, "cites broadcast's rescue as 400"),
        ({"name": "episodes", "value": 400}, "cites broadcast's episodes as 400"),
        ({"name": "failure_rate", "value": 0.01}, "cites broadcast's failure_rate as 0.01"),
        ({"name": "difference", "value": "ninety-nine percent"}, "not a readout"),
        ({"name": "rescue", "value": "four hundred"}, "not a readout"),
        ({"name": "rescue", "value": "400"}, "not a readout"),
        ({"name": "percent_cut", "value": 99}, "not a readout"),
    ],
)
async def test_numbers_in_digits_or_words_that_the_packet_does_not_hold_are_refused(
    server: FakeOpenAI, packet: EvidencePacket, figure: dict[str, Any], why: str
) -> None:
    result = await shown(server, packet, bent(packet, "broadcast", figures=[figure]))
    assert result.source is ReadoutSource.deterministic
    assert why in result.why or any(p.startswith(why) for p in result.problems), result


async def test_a_number_written_as_nan_or_infinity_is_refused(
    server: FakeOpenAI, packet: EvidencePacket
) -> None:
    for raw in ("NaN", "Infinity"):
        answer = bent(packet, "broadcast", figures=[{"name": "net", "value": 0}])
        answer = answer.replace('"value": 0}', f'"value": {raw}}}', 1)
        result = await shown(server, packet, answer)
        assert result.source is ReadoutSource.deterministic and "not a readout" in result.why


async def test_markup_never_reaches_the_report(
    server: FakeOpenAI, report: Report, packet: EvidencePacket, tmp_path: Path
) -> None:
    """Refused claims are quoted in the report's reasons: as text, never as markup."""
    store = LocalArtifactStore(tmp_path)
    analysis = AnalysisResult(
        report_digest=store.put_json(report.model_dump(mode="json")),
        markdown_digest=store.put_bytes(render_markdown(report).encode()),
        html_digest=store.put_bytes(render_html(report).encode()),
        outcomes_digest=report.outcomes_digest,
        valid=report.valid,
        worlds=[],
    )
    for name in ("<script>alert(1)</script>", "[x](javascript:alert(1))", "<img src=x>"):
        extra = {**claims(packet)[0], "world": name}
        server.answer = Answer(content=json.dumps({"claims": [*claims(packet), extra]}))
        config = ReadoutConfig(base_url=server.base_url, api_key="k", model="liar")
        done = await ReadoutActivities(store, config).write_readout(analysis)
        assert done.readout == "deterministic"
        md = store.get_bytes(done.markdown_digest).decode()
        page = store.get_bytes(done.html_digest).decode()
        readout_md = md[md.index("## Readout") :]
        assert "names world" in readout_md  # the reason is shown ...
        for markup in ("<script", "<img"):  # ... as text
            assert markup not in readout_md and markup not in page
        # a link needs an unescaped "](": Markdown reads "\\]" as a bracket, no link
        assert not re.search(r"(?<!\\)\]\(javascript:", readout_md)
        assert not re.search(r"href\s*=\s*\S*javascript:", page)  # text in HTML, no link
