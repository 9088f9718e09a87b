"""The bounded readout: the real ``openai`` client against a local OpenAI-compatible server
with crafted answers. A faithful readout is shown; one that invents a world, changes a
number, flips a verdict or asks for compute is rejected for the deterministic one; an
outage, a timeout or garbage never holds the report up."""

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
from forklab.experiments.experiment.readout.check import check_readout, world_counts
from forklab.experiments.experiment.readout.fallback import deterministic_readout
from forklab.experiments.experiment.readout.packet import (
    EvidencePacket,
    evidence_packet,
    hypothesis_supported,
)
from forklab.experiments.experiment.readout.render import readout_markdown
from forklab.experiments.experiment.readout.schema import (
    ModelReadout,
    ReadoutSource,
    ReadoutVerdict,
    ShownReadout,
)
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
    """A readout a careful model could write: other words, only the packet's facts."""
    world = {w.name: w for w in packet.worlds}
    verdict = {v.world: v.verdict for v in packet.verdicts}
    pair = {c.world: c for c in packet.comparisons}
    b, base = pair["broadcast"], world["baseline"]
    summary = (
        f"Across {len(packet.worlds)} worlds the baseline failed {base.failures} of "
        f"{base.episodes} episodes; broadcast rescued {b.rescue} of them and harmed {b.harm}."
    )
    findings = [
        {
            "world": name,
            "verdict": verdict[name],
            "statement": f"Failure rate {world[name].failure_rate * 100:.1f}%, "
            f"net {pair[name].net} against the baseline.",
        }
        for name in ("broadcast", "latency", "placebo")
    ]
    return ModelReadout.model_validate({"summary": summary, "findings": findings})


def config(server: FakeOpenAI, timeout: float = 20.0) -> ReadoutConfig:
    return ReadoutConfig(
        base_url=server.base_url, api_key="test", model="crafted", timeout_seconds=timeout
    )


def test_deterministic_readout_passes_its_own_check(packet: EvidencePacket) -> None:
    readout = deterministic_readout(packet)
    assert check_readout(readout, packet) == []
    assert {f.world for f in readout.findings} == {v.world for v in packet.verdicts}


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
    summary = deterministic_readout(packet).summary
    assert f"Valid experiment: all {len(validity)} validity checks passed." in summary
    assert "Hypothesis not supported: effect_direction failed" in summary
    assert "checks failed" not in summary

    supported = _with_checks(packet, effect_direction=True)
    summary = deterministic_readout(supported).summary
    assert "Hypothesis supported: every world moved as pre-registered." in summary

    invalid = _with_checks(packet, placebo_fidelity=False)
    summary = deterministic_readout(invalid).summary
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
    assert result.readout == faithful(packet)
    sent = server.requests[0]["body"]
    assert sent["model"] == "crafted"
    assert sent["response_format"]["type"] == "json_schema"
    # the packet, and nothing else, is what the model sees
    assert json.loads(sent["messages"][1]["content"]) == packet.model_dump(mode="json")


async def test_ninth_world_is_rejected(server: FakeOpenAI, packet: EvidencePacket) -> None:
    readout = faithful(packet)
    extra = readout.findings[0].model_copy(update={"world": "broadcast-retry"})
    invented = readout.model_copy(update={"findings": [*readout.findings, extra]})
    result = await ask(server, invented, packet)
    assert result.source is ReadoutSource.deterministic
    assert any("broadcast-retry" in p for p in result.problems), result.problems
    assert result.readout == deterministic_readout(packet)


async def test_nine_worlds_in_words_is_rejected(server: FakeOpenAI, packet: EvidencePacket) -> None:
    readout = faithful(packet)
    summary = readout.summary.replace(f"Across {len(packet.worlds)} worlds", "Across 9 worlds")
    assert 9 not in world_counts(packet)
    assert summary != readout.summary
    result = await ask(server, readout.model_copy(update={"summary": summary}), packet)
    assert result.source is ReadoutSource.deterministic
    assert any("speaks of 9 worlds" in p for p in result.problems), result.problems


async def test_changed_number_is_rejected(server: FakeOpenAI, packet: EvidencePacket) -> None:
    readout = faithful(packet)
    rescue = next(c.rescue for c in packet.comparisons if c.world == "broadcast")
    summary = readout.summary.replace(f"rescued {rescue}", f"rescued {rescue + 7}")
    assert summary != readout.summary
    result = await ask(server, readout.model_copy(update={"summary": summary}), packet)
    assert result.source is ReadoutSource.deterministic
    assert any(f"states {rescue + 7}" in p for p in result.problems), result.problems


async def test_flipped_verdict_is_rejected(server: FakeOpenAI, packet: EvidencePacket) -> None:
    readout = faithful(packet)
    flipped = [
        f.model_copy(update={"verdict": ReadoutVerdict.refuted}) if f.world == "latency" else f
        for f in readout.findings
    ]
    result = await ask(server, readout.model_copy(update={"findings": flipped}), packet)
    assert result.source is ReadoutSource.deterministic
    assert any("latency is refuted" in p for p in result.problems), result.problems


async def test_flipped_verdict_in_words_is_rejected(
    server: FakeOpenAI, packet: EvidencePacket
) -> None:
    readout = faithful(packet)
    caveat = "The latency world is refuted."
    assert next(v.verdict for v in packet.verdicts if v.world == "latency") != "refuted"
    result = await ask(server, readout.model_copy(update={"caveats": [caveat]}), packet)
    assert result.source is ReadoutSource.deterministic
    assert any("calls latency refuted" in p for p in result.problems), result.problems


async def test_asking_for_compute_is_rejected(server: FakeOpenAI, packet: EvidencePacket) -> None:
    readout = faithful(packet)
    caveat = "Approve additional episodes to tighten the intervals."
    result = await ask(server, readout.model_copy(update={"caveats": [caveat]}), packet)
    assert result.source is ReadoutSource.deterministic
    assert any("asks for compute" in p for p in result.problems), result.problems


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
    assert "## Readout" in md and "Written by model `crafted`" in md
    assert faithful(packet).summary in md

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


def test_a_verdict_word_must_belong_to_the_world_or_the_hypothesis_it_judges(
    packet: EvidencePacket,
) -> None:
    """A sentence "It is supported." after one naming a world passed for that world's
    verdict (the check compared verdict words only with a world named in the same one)."""
    verdict = {v.world: v.verdict for v in packet.verdicts}
    wrong = next(w for w in ("supported", "inconclusive", "refuted") if w != verdict["latency"])
    unattached = f"The latency world was measured against baseline. It is {wrong}."
    readout = faithful(packet).model_copy(update={"summary": unattached})
    assert any(
        "without naming the one world it judges" in p for p in check_readout(readout, packet)
    )
    pair = f"Both latency and broadcast are {wrong}."
    both = faithful(packet).model_copy(update={"summary": pair})
    if {verdict["latency"], verdict["broadcast"]} != {wrong}:
        problems = check_readout(both, packet)
        assert any(p.startswith("calls broadcast, latency ") for p in problems), problems
    supported = hypothesis_supported(packet)
    assert supported is not None
    true = "The hypothesis is supported." if supported else "The hypothesis is not supported."
    false = "The hypothesis is not supported." if supported else "The hypothesis is supported."
    assert check_readout(faithful(packet).model_copy(update={"summary": true}), packet) == []
    lie = check_readout(faithful(packet).model_copy(update={"summary": false}), packet)
    assert any("judges the hypothesis" in p for p in lie), lie
    assert packet.valid
    invalid = faithful(packet).model_copy(update={"summary": "The experiment is invalid."})
    assert check_readout(invalid, packet) == ["calls the experiment invalid; the packet's is valid"]


def test_the_readout_is_one_visible_line_per_part(packet: EvidencePacket) -> None:
    """A summary holding a heading and a table (and a terminal escape) stood in report.md
    as the report's own."""
    forged = "Fine.\n\n## Verdicts\n\n| backup | **supported** |\x1b[2J"
    readout = faithful(packet).model_copy(update={"summary": forged, "caveats": [forged]})
    shown = ShownReadout(readout=readout, source=ReadoutSource.model, model="m", why="")
    text = readout_markdown(shown)
    assert "\n## Verdicts" not in text and "\n| backup" not in text and "\x1b" not in text
    assert "Fine. ## Verdicts | backup | **supported** |\\u001b[2J" in text
