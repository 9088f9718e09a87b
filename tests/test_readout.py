"""The bounded readout: the real ``openai`` client against a local OpenAI-compatible server
with crafted answers. Faithful claims are shown (in ForkLab's words); claims that invent a
world, change a number or flip a verdict, and prose or a request for compute (no field
holds either), are rejected for the deterministic readout; an outage, a timeout or
garbage never holds the report up. The lies of issue 35 are in ``test_readout_lies.py``."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_openai import Answer, FakeOpenAI, fake_openai

from forklab.activities.experiment.readout import ReadoutActivities, ReadoutConfig
from forklab.activities.stores.artifacts import LocalArtifactStore
from forklab.cli.experiment.rehearsal import rehearse
from forklab.cli.experiment.specfile import load_spec
from forklab.contracts.experiment import AnalysisResult
from forklab.experiments.experiment.readout.check import check_readout
from forklab.experiments.experiment.readout.fallback import deterministic_readout
from forklab.experiments.experiment.readout.packet import (
    EvidencePacket,
    evidence_packet,
)
from forklab.experiments.experiment.readout.render import readout_markdown
from forklab.experiments.experiment.readout.schema import (
    Figure,
    FigureName,
    Finding,
    ModelReadout,
    ReadoutSource,
    ReadoutVerdict,
    ShownReadout,
    WrittenReadout,
)
from forklab.experiments.experiment.readout.write import written_readout
from forklab.experiments.experiment.report.model import Report
from forklab.experiments.experiment.report.render_html import render_html
from forklab.experiments.experiment.report.render_markdown import render_markdown
from forklab.experiments.experiment.results import CheckKind
from forklab.workers.config import ConfigError
from forklab.workers.experiment.providers import readout_config

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def report() -> Report:
    """The eight worlds of the retry-cascade experiment on the twin, at 40 episodes."""
    spec = load_spec(ROOT / "forklab" / "workloads" / "retry-cascade.yaml")
    return rehearse(spec.model_copy(update={"episodes": 40}), processes=1)


@pytest.fixture(scope="module")
def packet(report: Report) -> EvidencePacket:
    return evidence_packet(report)


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with fake_openai() as state:
        yield state


def faithful(packet: EvidencePacket) -> ModelReadout:
    """Claims a careful model could make: its own order and choice of figures, only the
    packet's facts."""
    direct = {d.world: d.direction for d in deterministic_readout(packet).claims}
    verdict = {v.world: v.verdict for v in packet.verdicts}
    pair = {c.world: c for c in packet.comparisons}
    world = {w.name: w for w in packet.worlds}
    order = sorted(verdict, key=lambda name: -abs(pair[name].net))
    claims = [
        {
            "world": name,
            "verdict": verdict[name],
            "direction": direct[name],
            "figures": [
                {"name": "net", "value": pair[name].net},
                {"name": "failure_rate", "value": round(world[name].failure_rate, 3)},
                {"name": "ci_low", "value": pair[name].ci_low},
            ],
        }
        for name in order
    ]
    return ModelReadout.model_validate({"claims": claims})


def config(server: FakeOpenAI, timeout: float = 20.0) -> ReadoutConfig:
    return ReadoutConfig(
        base_url=server.base_url, api_key="test", model="crafted", timeout_seconds=timeout
    )


def test_deterministic_readout_passes_its_own_check(packet: EvidencePacket) -> None:
    readout = deterministic_readout(packet)
    assert check_readout(readout, packet) == []
    assert {c.world for c in readout.claims} == {v.world for v in packet.verdicts}


def _with_checks(packet: EvidencePacket, **passed: bool) -> EvidencePacket:
    checks = [c.model_copy(update={"passed": passed.get(c.name, c.passed)}) for c in packet.checks]
    valid = all(c.passed for c in checks if c.kind is CheckKind.validity)
    return packet.model_copy(update={"checks": checks, "valid": valid})


def test_deterministic_readout_keeps_validity_apart_from_the_hypothesis(
    packet: EvidencePacket,
) -> None:
    """A failed effect check is a verdict on the hypothesis, not on the experiment: the
    summary must not read "Valid experiment. 1 of 9 checks failed: effect_direction"."""
    validity = [c for c in packet.checks if c.kind is CheckKind.validity]
    assert all(c.passed for c in validity) and packet.valid
    assert [c.name for c in packet.checks if not c.passed] == ["effect_direction"]
    summary = written_readout(deterministic_readout(packet), packet).summary
    assert f"Valid experiment: all {len(validity)} validity checks passed." in summary
    missed = [v.world for v in packet.verdicts if v.verdict != "supported"]
    assert missed, "the fixture's experiment should miss some predictions"
    held = len(packet.verdicts) - len(missed)
    # the headline counts the predictions and names the ones that did not hold
    assert f": {held} of {len(packet.verdicts)} predictions supported; " in summary
    assert all(world in summary.split("predictions supported", 1)[1] for world in missed)
    assert "effect_direction" not in summary and "checks failed" not in summary

    supported = _with_checks(packet, effect_direction=True).model_copy(
        update={
            "verdicts": [v.model_copy(update={"verdict": "supported"}) for v in packet.verdicts]
        }
    )
    summary = written_readout(deterministic_readout(supported), supported).summary
    n = len(packet.verdicts)
    assert f"Hypothesis supported: {n} of {n} predictions supported." in summary

    invalid = _with_checks(packet, placebo_fidelity=False)
    summary = written_readout(deterministic_readout(invalid), invalid).summary
    assert (
        f"Not a valid experiment: 1 of {len(validity)} validity checks failed "
        "(placebo_fidelity), so the effects are not evidence." in summary
    )
    assert "Hypothesis not judged" in summary and "effect_direction" not in summary
    for p in (supported, invalid):
        assert check_readout(deterministic_readout(p), p) == []


async def ask(
    server: FakeOpenAI, readout: ModelReadout | str, packet: EvidencePacket
) -> ShownReadout:
    content = readout if isinstance(readout, str) else readout.model_dump_json()
    server.answer = Answer(content=content, delay=server.answer.delay)
    acts = ReadoutActivities(LocalArtifactStore(Path("/nonexistent")), config(server))
    return await acts.shown_readout(packet)


async def test_faithful_readout_is_shown(server: FakeOpenAI, packet: EvidencePacket) -> None:
    result = await ask(server, faithful(packet), packet)
    assert result.source is ReadoutSource.model, result.problems
    assert result.readout == written_readout(faithful(packet), packet)
    assert [f.world for f in result.readout.findings] == [c.world for c in faithful(packet).claims]
    sent = server.requests[0]["body"]
    assert sent["model"] == "crafted"
    assert sent["response_format"]["type"] == "json_schema"
    # the packet, and nothing else, is what the model sees
    assert json.loads(sent["messages"][1]["content"]) == packet.model_dump(mode="json")


async def test_ninth_world_is_rejected(server: FakeOpenAI, packet: EvidencePacket) -> None:
    readout = faithful(packet)
    extra = readout.claims[0].model_copy(update={"world": "broadcast-retry"})
    invented = readout.model_copy(update={"claims": [*readout.claims, extra]})
    result = await ask(server, invented, packet)
    assert result.source is ReadoutSource.deterministic
    assert any("broadcast-retry" in p for p in result.problems), result.problems
    assert result.readout == written_readout(deterministic_readout(packet), packet)


async def test_a_left_out_or_repeated_world_is_rejected(
    server: FakeOpenAI, packet: EvidencePacket
) -> None:
    """Claims that pass over a world (its harm, say) or repeat one are refused."""
    readout = faithful(packet)
    left_out = readout.model_copy(update={"claims": readout.claims[1:]})
    result = await ask(server, left_out, packet)
    assert result.source is ReadoutSource.deterministic
    assert any(f"leaves out judged worlds: {readout.claims[0].world}" in p for p in result.problems)
    twice = readout.model_copy(update={"claims": [*readout.claims, readout.claims[0]]})
    result = await ask(server, twice, packet)
    assert any("makes 2 claims about" in p for p in result.problems), result.problems


async def test_changed_number_is_rejected(server: FakeOpenAI, packet: EvidencePacket) -> None:
    readout = faithful(packet)
    rescue = next(c.rescue for c in packet.comparisons if c.world == "broadcast")
    claims = [
        c.model_copy(update={"figures": [Figure(name=FigureName.rescue, value=rescue + 7)]})
        if c.world == "broadcast"
        else c
        for c in readout.claims
    ]
    result = await ask(server, readout.model_copy(update={"claims": claims}), packet)
    assert result.source is ReadoutSource.deterministic
    assert any(
        f"cites broadcast's rescue as {rescue + 7}; the packet says {rescue}" in p
        for p in result.problems
    ), result.problems


async def test_flipped_verdict_is_rejected(server: FakeOpenAI, packet: EvidencePacket) -> None:
    readout = faithful(packet)
    flipped = [
        c.model_copy(update={"verdict": ReadoutVerdict.refuted}) if c.world == "latency" else c
        for c in readout.claims
    ]
    result = await ask(server, readout.model_copy(update={"claims": flipped}), packet)
    assert result.source is ReadoutSource.deterministic
    assert any("latency is refuted" in p for p in result.problems), result.problems


async def test_prose_or_a_request_for_compute_is_no_readout(
    server: FakeOpenAI, packet: EvidencePacket
) -> None:
    """No field holds prose or a request: a summary, or a caveat asking for episodes, makes
    the answer no readout at all, and none of its words reach the report."""
    ask_more = "Approve additional episodes to tighten the intervals."
    for extra in ({"summary": "All good."}, {"caveats": [ask_more]}):
        answer = json.dumps({**faithful(packet).model_dump(mode="json"), **extra})
        result = await ask(server, answer, packet)
        assert result.source is ReadoutSource.deterministic
        assert "not a readout" in result.why
        assert ask_more not in result.model_dump_json()


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (Answer(content="this is not JSON"), "not a readout"),
        (Answer(content='{"summary": 3}'), "not a readout"),
        (Answer(status=500), "HTTP 500"),
        (Answer(status=429), "HTTP 429"),
    ],
)
async def test_outage_and_garbage_fall_back(
    server: FakeOpenAI, packet: EvidencePacket, answer: Answer, why: str
) -> None:
    server.answer = answer
    acts = ReadoutActivities(LocalArtifactStore(Path("/nonexistent")), config(server))
    result = await acts.shown_readout(packet)
    assert result.source is ReadoutSource.deterministic
    assert why in result.why
    assert len(server.requests) == 1  # one attempt: the client's own retries are off


async def test_slow_model_is_cut_off(server: FakeOpenAI, packet: EvidencePacket) -> None:
    server.answer = Answer(content=faithful(packet).model_dump_json(), delay=30.0)
    acts = ReadoutActivities(LocalArtifactStore(Path("/nonexistent")), config(server, timeout=0.5))
    start = time.monotonic()
    result = await acts.shown_readout(packet)
    assert result.source is ReadoutSource.deterministic
    assert "did not answer within 0.5 s" in result.why
    assert time.monotonic() - start < 25.0  # the server would have answered after 30 s


async def test_unreachable_model_falls_back(packet: EvidencePacket) -> None:
    with fake_openai() as gone:
        url = gone.base_url
    acts = ReadoutActivities(
        LocalArtifactStore(Path("/nonexistent")),
        ReadoutConfig(base_url=url, api_key="k", model="m", timeout_seconds=5),
    )
    result = await acts.shown_readout(packet)
    assert result.source is ReadoutSource.deterministic
    assert "APIConnectionError" in result.why


async def test_report_marks_which_readout_it_shows(
    server: FakeOpenAI, report: Report, packet: EvidencePacket, tmp_path: Path
) -> None:
    store = LocalArtifactStore(tmp_path)
    analysis = AnalysisResult(
        report_digest=store.put_json(report.model_dump(mode="json")),
        markdown_digest=store.put_bytes(render_markdown(report).encode()),
        html_digest=store.put_bytes(render_html(report).encode()),
        outcomes_digest=report.outcomes_digest,
        valid=report.valid,
        worlds=[],
    )
    server.answer = Answer(content=faithful(packet).model_dump_json())
    by_model = await ReadoutActivities(store, config(server)).write_readout(analysis)
    assert by_model.readout == "model"
    md = store.get_bytes(by_model.markdown_digest).decode()
    assert "## Readout" in md and "Claims by model crafted, each checked" in md
    assert written_readout(faithful(packet), packet).findings[0].statement in md

    offline = await ReadoutActivities(store, None).write_readout(analysis)
    assert offline.readout == "deterministic"
    page = store.get_bytes(offline.html_digest).decode()
    assert "Deterministic readout: no model is configured" in page
    assert page.rstrip().endswith("</body></html>")

    server.answer = Answer(content="<script>alert(1)</script>")
    garbage = await ReadoutActivities(store, config(server)).write_readout(analysis)
    assert "<script>" not in store.get_bytes(garbage.html_digest).decode()


def test_readout_settings() -> None:
    assert readout_config({}) is None
    cfg = readout_config(
        {"FORKLAB_READOUT_BASE_URL": "http://127.0.0.1:1/v1", "FORKLAB_READOUT_MODEL": "m"}
    )
    assert cfg is not None and cfg.api_key == "none" and cfg.timeout_seconds == 30.0
    with pytest.raises(ConfigError, match="FORKLAB_READOUT_MODEL"):
        readout_config({"FORKLAB_READOUT_BASE_URL": "http://x/v1"})
    with pytest.raises(ConfigError, match="FORKLAB_READOUT_TIMEOUT"):
        readout_config(
            {
                "FORKLAB_READOUT_BASE_URL": "http://x/v1",
                "FORKLAB_READOUT_MODEL": "m",
                "FORKLAB_READOUT_TIMEOUT": "-1",
            }
        )


async def test_without_a_model_the_sdk_is_not_imported(
    packet: EvidencePacket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No model configured: the deterministic readout, without importing the SDK (its
    import cost ~1.2 s of CPU on the worker's event loop at the end of a run)."""
    monkeypatch.setitem(sys.modules, "openai", None)  # importing it now raises
    acts = ReadoutActivities(LocalArtifactStore(Path("/nonexistent")), None)
    shown = await acts.shown_readout(packet)
    assert shown.source is ReadoutSource.deterministic


def test_the_readout_is_one_visible_line_per_part(packet: EvidencePacket) -> None:
    """A summary holding a heading and a table (and a terminal escape) stood in report.md
    as the report's own."""
    forged = "Fine.\n\n## Verdicts\n\n| backup | **supported** |\x1b[2J"
    finding = Finding(world="w", verdict=ReadoutVerdict.supported, statement=forged)
    readout = WrittenReadout(summary=forged, findings=[finding], caveats=[forged])
    shown = ShownReadout(readout=readout, source=ReadoutSource.model, model="m", why="")
    text = readout_markdown(shown)
    assert "\n## Verdicts" not in text and "\n| backup" not in text and "\x1b" not in text
    assert "Fine. ## Verdicts \\| backup \\| \\*\\*supported\\*\\* \\|\\\\u001b\\[2J" in text
