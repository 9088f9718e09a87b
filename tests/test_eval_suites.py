"""The three ``braintrust.Eval`` suites run locally (no key, nothing sent), pass on
ForkLab's policies, and fail on deliberately broken ones."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from fake_braintrust import API_KEY, fake_braintrust
from helpers import run_cli

from forklab.evals import acquisition, capacity, causal
from forklab.experiments.experiment.analysis.guard import learn_rule
from forklab.experiments.experiment.analysis.power import PowerRow, power_row
from forklab.experiments.experiment.analysis.slices import Clause, SliceEffect
from forklab.experiments.experiment.analysis.verdicts import Verdict
from forklab.experiments.experiment.capacity import (
    Refusal,
    RefusalKind,
    RegionQuota,
    SnapshotFacts,
    capacity_refusals,
)
from forklab.experiments.experiment.outcomes import ExperimentOutcomes
from forklab.experiments.experiment.report.model import Report
from forklab.experiments.experiment.spec import Direction, ExperimentSpec


def test_causal_suite_passes_and_catches_a_policy_that_ignores_validity() -> None:
    assert causal.run().failed == []

    def ignores_validity(spec: ExperimentSpec, out: ExperimentOutcomes) -> Report:
        report = causal.analysis(spec, out)
        verdicts = [
            v.model_copy(update={"verdict": Verdict.supported})
            if v.verdict is Verdict.invalid
            else v
            for v in report.verdicts
        ]
        return report.model_copy(update={"valid": True, "verdicts": verdicts})

    broken = causal.run(ignores_validity)
    assert broken.failed == [
        "placebo drift invalidates every verdict",
        "a positive control that cuts failures invalidates every verdict",
    ]


def test_causal_suite_catches_a_policy_that_trusts_any_net_rescue() -> None:
    def sign_only(spec: ExperimentSpec, out: ExperimentOutcomes) -> Report:
        report = causal.analysis(spec, out)
        net = {c.world: c.net for c in report.comparisons}
        verdicts = [
            v.model_copy(update={"verdict": Verdict.supported})
            if v.verdict is Verdict.inconclusive and net.get(v.world, 0) > 0
            else v
            for v in report.verdicts
        ]
        return report.model_copy(update={"verdicts": verdicts})

    assert "too few discordant pairs: inconclusive, not supported" in causal.run(sign_only).failed


def test_capacity_suite_passes_and_catches_broken_refusals() -> None:
    assert capacity.run().failed == []

    def ignores_region(
        snap: SnapshotFacts, quotas: list[RegionQuota], target: str, peak: int
    ) -> list[Refusal]:
        refusals = capacity_refusals(snap, quotas, target, peak)
        return [r for r in refusals if r.kind is not RefusalKind.region]

    def one_sandbox_only(
        snap: SnapshotFacts, quotas: list[RegionQuota], target: str, peak: int
    ) -> list[Refusal]:
        return capacity_refusals(snap, quotas, target, 1)  # forgets × peak concurrency

    assert capacity.run(ignores_region).failed == [
        "snapshot in another region",
        "wrong region and stale",
    ]
    assert capacity.run(one_sandbox_only).failed == [
        "disk × peak exceeds quota",
        "cpu × peak exceeds quota",
        "memory × peak exceeds quota",
    ]


def test_acquisition_suite_passes_and_catches_broken_policies() -> None:
    assert acquisition.run().failed == []

    def ignores_harm_cap(
        partitions: Sequence[Sequence[SliceEffect]], harm_cap: int | None
    ) -> tuple[str, list[Clause], list[SliceEffect]]:
        return learn_rule(partitions, None)

    def always_powered(
        world: str,
        vs: str,
        expected: Direction,
        harm: int,
        rescue: int,
        episodes: int,
        alpha: float,
        power: float,
    ) -> PowerRow:
        row = power_row(world, vs, expected, harm, rescue, episodes, alpha, power)
        return row.model_copy(update={"underpowered": False})

    assert acquisition.run(guard=ignores_harm_cap).failed == [
        "harm cap 0: only harmless slices",
        "the feature with more rescues wins",
    ]
    assert len(acquisition.run(power=always_powered).failed) == 3


def test_forklab_evals_uploads_with_a_key_and_only_then(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real SDK against the local Braintrust-speaking server: with a key each suite is
    an experiment whose rows carry every case and its score; with ``--local``, or without
    a key, nothing reaches the server."""
    with fake_braintrust() as fake:
        monkeypatch.setenv("BRAINTRUST_APP_URL", fake.url)
        monkeypatch.delenv("BRAINTRUST_API_KEY", raising=False)
        code, out, err = run_cli(capsys, "evals")
        assert code == 0 and "ran locally, nothing sent" in out
        # one line per suite and the last; the SDK's progress bars and summaries are not
        # shown (they drew with carriage returns, escaped as \u000d on the way out)
        assert len(out.strip().splitlines()) == 4 and not err.strip(), (out, err)
        code, _, err = run_cli(capsys, "evals", "--send")
        assert code == 2 and "--send needs BRAINTRUST_API_KEY" in err
        monkeypatch.setenv("BRAINTRUST_API_KEY", API_KEY)
        code, out, _ = run_cli(capsys, "evals", "--local")
        assert code == 0 and "ran locally, nothing sent" in out
        code, out, err = run_cli(capsys, "evals", "--local", "--json")
        assert code == 0 and err == "ran locally, nothing sent\n"
        assert [(r["suite"], r["passed"], r["uploaded"]) for r in json.loads(out)] == [
            ("causal", True, False),
            ("capacity", True, False),
            ("acquisition", True, False),
        ]
        assert fake.experiments == {} and fake.rows == {}

        code, out, _ = run_cli(capsys, "evals")
        assert code == 0 and "uploaded to Braintrust project forklab-evals" in out
        assert sorted(e["name"] for e in fake.experiments.values()) == [
            "acquisition",
            "capacity",
            "causal",
        ]
        suites = {"causal": causal.CASES, "capacity": capacity.CASES}
        suites["acquisition"] = acquisition.CASES
        for suite, cases in suites.items():
            rows = fake.spans(suite)
            roots = {r["span_id"]: r["metadata"]["case"] for r in rows if not r.get("span_parents")}
            assert sorted(roots.values()) == sorted(c.name for c in cases), suite
            scored = {
                roots[r["span_parents"][0]]: r["scores"]["ExactMatch"]
                for r in rows
                if r.get("span_attributes", {}).get("name") == "ExactMatch"
            }
            assert scored == {c.name: 1 for c in cases}, suite
