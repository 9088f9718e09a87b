"""The flagship demo's story (issue 36, point 2): the headline counts the predictions,
the one-screen summary holds a verdict and interval per world and the validity and noise
line, the shipped specs' hypothesis texts name every world they predict, and the readout
reads as sentences. The demo itself, run for real, is in tests/test_workflow_cli.py."""

from __future__ import annotations

import re

import pytest
import yaml

from forklab.cli.experiment.rehearsal import rehearse
from forklab.cli.experiment.specfile import load_spec
from forklab.experiments.experiment.analysis.verdicts import (
    Verdict,
    hypothesis_headline,
    predictions_text,
)
from forklab.experiments.experiment.readout.fallback import deterministic_readout
from forklab.experiments.experiment.readout.packet import evidence_packet
from forklab.experiments.experiment.readout.write import written_readout
from forklab.experiments.experiment.report.model import Report
from forklab.experiments.experiment.report.render_summary import summary_lines
from forklab.experiments.experiment.results import InfraUsage
from forklab.experiments.experiment.workspace_report import edit_diff, human_size
from tests.helpers import ROOT

SPECS = sorted((ROOT / "forklab" / "workloads").glob("*.yaml")) + sorted(
    (ROOT / "examples").glob("*.yaml")
)
S, INC, R = Verdict.supported, Verdict.inconclusive, Verdict.refuted


def test_the_headline_counts_predictions_and_names_the_misses() -> None:
    seven = [("jitter", INC), ("broadcast", S), ("queue-memory", INC), ("latency", S)]
    seven += [("broadcast-jitter", S), ("restart", S), ("placebo", S)]
    assert predictions_text(seven) == (
        "5 of 7 predictions supported; jitter and queue-memory inconclusive"
    )
    assert hypothesis_headline(True, seven) == (
        "Hypothesis partly supported: 5 of 7 predictions supported; jitter and queue-memory "
        "inconclusive."
    )
    mixed = [("a", R), ("b", INC), ("c", INC), ("d", INC)]
    assert hypothesis_headline(True, mixed) == (
        "Hypothesis not supported: 0 of 4 predictions supported; a refuted; b, c and d "
        "inconclusive."
    )
    assert hypothesis_headline(True, [("a", S)]) == (
        "Hypothesis supported: 1 of 1 prediction supported."
    )
    assert hypothesis_headline(False, seven) == "Hypothesis not judged: the experiment is invalid."


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_each_shipped_hypothesis_text_names_every_world_it_predicts(path: object) -> None:
    """The text a reader reads and the ``expected`` the verdicts judge must be the same
    hypothesis: every world with an expectation is named in the text."""
    spec = yaml.safe_load(path.read_text())  # type: ignore[attr-defined]
    text = spec["hypothesis"]["text"].lower()
    missing = [
        world
        for world in spec["hypothesis"]["expected"]
        if not re.search(rf"(?<![\w-]){re.escape(world.lower())}", text)
    ]
    assert not missing, f"{path}: the hypothesis text does not name {missing}"


@pytest.fixture(scope="module")
def cascade() -> Report:
    """The demo's experiment (retry-cascade, 160 episodes) on the twin, which the durable
    run reproduces bit for bit, with the durable run's infrastructure figures."""
    spec = load_spec(ROOT / "forklab" / "workloads" / "retry-cascade.yaml")
    report = rehearse(spec, processes=1)
    infra = InfraUsage(
        world_seconds_budget=300,
        world_seconds_spent=7.53814,
        max_concurrent_sandboxes=4,
        peak_concurrent_sandboxes=1,
    )
    return report.model_copy(update={"infra": infra})


def test_the_summary_tells_the_story_in_a_screen(cascade: Report) -> None:
    lines = summary_lines(cascade)
    assert len(lines) <= 20, "\n".join(lines)
    text = "\n".join(lines)
    assert lines[1] == (
        "Hypothesis partly supported: 5 of 7 predictions supported; jitter and queue-memory "
        "inconclusive."
    )
    assert lines[2] == (
        "Valid: 8 of 8 validity checks passed. Noise: placebo differed from baseline in 0 of "
        "160 episodes."
    )
    for v in cascade.verdicts:
        c = next(c for c in cascade.comparisons if c.world == v.world)
        row = next(line for line in lines if line.split()[:1] == [v.world])
        assert row.split()[1:3] == [v.expected.value, v.verdict.value], row
        assert f"{c.difference:+.3f} [{c.ci_low:+.3f}, {c.ci_high:+.3f}]" in row
        assert f"{c.rescue}/{c.harm}" in row
    assert "Guard for restart: apply restart only when upstream is healthy; the rule" in text
    assert "Spent 7.5 of 300 world-seconds, at most 1 of 4 sandboxes at once; 0 left" in text


def test_the_summary_says_when_there_is_no_noise_floor_and_when_it_is_invalid(
    cascade: Report,
) -> None:
    no_placebo = cascade.model_copy(
        update={"worlds": [w for w in cascade.worlds if w.name != "placebo"]}
    )
    assert "Noise: no placebo world, so no measured noise floor." in summary_lines(no_placebo)[2]
    checks = [
        c.model_copy(update={"passed": False}) if c.name == "placebo_fidelity" else c
        for c in cascade.checks
    ]
    invalid = cascade.model_copy(update={"checks": checks, "valid": False})
    lines = summary_lines(invalid)
    assert lines[1] == "Hypothesis not judged: the experiment is invalid."
    assert lines[2].startswith("Invalid: placebo_fidelity failed (1 of 8 validity checks)")


def test_the_readout_caveats_read_as_sentences(cascade: Report) -> None:
    packet = evidence_packet(cascade)
    caveats = written_readout(deterministic_readout(packet), packet).caveats
    assert caveats == [
        "Spent 7.5 of 300 world-seconds, at most 1 sandbox at once.",
        "Guard for restart: apply restart only when upstream is healthy. On 160 held-out "
        "episodes its net is +6, against +23 when restart is always applied.",
    ]


def test_workspace_sizes_and_edits_read_as_a_person_reads_them() -> None:
    assert [human_size(n) for n in (0, 812, 1024, 73_728, 50 << 20, 3 << 30)] == [
        "0 B",
        "812 B",
        "1.0 KiB",
        "72.0 KiB",
        "50.0 MiB",
        "3.0 GiB",
    ]
    before = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
    after = before.replace("a - b", "a + b")
    assert edit_diff("calc/arith.py", before, after) == [
        "--- a/calc/arith.py",
        "+++ b/calc/arith.py",
        "@@ -1,3 +1,3 @@",
        " def add(a, b):",
        "-    return a - b",
        "+    return a + b",
        " ",
    ]
