"""``forklab plan`` end to end: statistics, slices, checks, verdicts, power and guard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import ROOT, plan_json, run_cli

RECOVERY = ROOT / "forklab" / "workloads" / "recovery-counter.yaml"
RETRY = ROOT / "forklab" / "workloads" / "retry-cascade.yaml"


def test_recovery_counter_plan_shows_the_analysis(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "plan", str(RECOVERY))
    assert code == 0, err
    for text in (
        "McNemar p",
        "Holm p",
        "95% CI",
        "[-0.108, +0.055]",  # refresh vs baseline: −8 of 300, interval crosses zero
        "slices: refresh vs baseline",
        "obs_repeated  true   145      75     0  +75",
        "[PASS] placebo" if "placebo" in out else "[PASS] completion",
        "[PASS] workload_identity",
        "[PASS] common_snapshot",
        "[PASS] infrastructure_fit: not applicable (local twin)",
        "refresh: INCONCLUSIVE",
        "null-refresh: SUPPORTED",
        "apply refresh only when obs_repeated is true",
        '{"any": [{"obs_repeated": {"eq": true}}]}',
        "held-out episodes 300..599:",
    ):
        assert text in out, text


def test_recovery_counter_guard_removes_held_out_harms(capsys: pytest.CaptureFixture[str]) -> None:
    report = plan_json(capsys, RECOVERY)
    guard = report["guard"]
    assert guard["rule"] == {"any": [{"obs_repeated": {"eq": True}}]}
    held = guard["held_out"]
    assert (held["first_episode"], held["last_episode"]) == (300, 599)
    assert held["before"]["harm"] > 0  # refreshing everywhere harms fresh episodes too
    assert held["after"]["harm"] == 0
    assert held["after"]["rescue"] == held["before"]["rescue"] > 0
    assert guard["training"]["after"] == {
        "episodes": 300,
        "intervened": 145,
        "rescue": 75,
        "harm": 0,
        "net": 75,
    }


def test_json_keeps_the_engine_fields_and_adds_the_analysis(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = plan_json(capsys, RECOVERY)
    assert {"id", "fingerprint"} <= report["experiment"].keys()
    assert {"name", "role", "episodes", "failures", "failure_rate"} <= report["worlds"][0].keys()
    comp = report["comparisons"][0]
    assert {"world", "vs", "rescue", "harm", "unchanged", "net", "slices"} <= comp.keys()
    assert comp["slices"] == [
        {"feature": "obs_repeated", "value": False, "rescue": 0, "harm": 83, "unchanged": 72},
        {"feature": "obs_repeated", "value": True, "rescue": 75, "harm": 0, "unchanged": 70},
    ]
    assert {"mcnemar_p", "holm_p", "ci_low", "ci_high", "slice_effects"} <= comp.keys()
    assert {"outcomes_digest", "checks", "valid", "verdicts", "power", "guard", "evidence"} <= (
        report.keys()
    )
    names = [c["name"] for c in report["checks"]]
    assert "effect_direction" in names
    assert report["valid"] is True


def test_underpowered_spec_is_warned_with_the_needed_episodes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    small = tmp_path / "small.yaml"
    small.write_text(RECOVERY.read_text().replace("episodes: 300", "episodes: 10"))
    code, out, err = run_cli(capsys, "plan", str(small))
    assert code == 0, err
    warnings = [line for line in out.splitlines() if "WARNING" in line]
    null_refresh = [w for w in warnings if "null-refresh" in w]
    assert null_refresh, out
    assert "underpowered with 10 episodes" in null_refresh[0]
    report = plan_json(capsys, small)
    row = next(r for r in report["power"]["rows"] if r["world"] == "null-refresh")
    assert row["underpowered"] is True and row["needed"] > 10
    assert f"needs {row['needed']} episodes" in null_refresh[0]
    # the full-size spec detects the same effect: no warning for null-refresh there
    full = plan_json(capsys, RECOVERY)
    assert not [w for w in full["power"]["warnings"] if w.startswith("null-refresh")]


def test_plan_out_writes_three_reports(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    code, _, err = run_cli(capsys, "plan", str(RECOVERY), "--out", str(folder))
    assert code == 0, err
    assert sorted(p.name for p in folder.iterdir()) == ["report.html", "report.json", "report.md"]
    assert json.loads((folder / "report.json").read_text())["experiment"]["id"] == (
        "recovery-counter"
    )
    md = (folder / "report.md").read_text()
    assert "## Guard policy for `refresh`" in md and "| refresh | treatment | decrease |" in md
    assert "<svg" in (folder / "report.html").read_text()


def test_plan_out_to_an_unwritable_place_fails_cleanly(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code, _, err = run_cli(capsys, "plan", str(RECOVERY), "--out", str(blocker / "sub"))
    assert code == 1
    assert "cannot write the report" in err and "--out" in err
    assert "Traceback" not in err


def test_interaction_with_an_unknown_feature_names_the_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(RECOVERY.read_text() + "  interactions: [[obs_repeated, nope]]\n")
    code, _, err = run_cli(capsys, "plan", str(bad))
    assert code == 2
    assert "analysis.interactions[0]" in err and "'nope'" in err and "obs_repeated" in err


def test_retry_cascade_verdicts_with_placebo_and_positive_control(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = plan_json(capsys, RETRY)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["placebo_fidelity"]["passed"], checks["placebo_fidelity"]["reason"]
    assert checks["positive_control"]["passed"], checks["positive_control"]["reason"]
    assert report["valid"] is True
    verdicts = {v["world"]: v for v in report["verdicts"]}
    worlds = [w["name"] for w in report["worlds"] if w["role"] != "baseline"]
    assert sorted(verdicts) == sorted(worlds)
    assert verdicts["placebo"]["verdict"] == "supported"  # identical episode for episode
    assert verdicts["latency"]["verdict"] == "supported"  # the positive control hurts
    assert verdicts["broadcast"]["verdict"] == "supported"
    for v in verdicts.values():
        assert v["verdict"] in {"supported", "refuted", "inconclusive"}
    code, out, err = run_cli(capsys, "plan", str(RETRY))
    assert code == 0, err
    assert "placebo: SUPPORTED" in out and "latency: SUPPORTED" in out


@pytest.mark.parametrize(
    ("analysis", "message"),
    [
        (
            "  guard: {world: baseline}\n",
            "field analysis.guard.world: the guard gates an intervention; "
            "name a non-baseline world",
        ),
        (
            "  interactions: [[obs_repeated, obs_repeated]]\n",
            "field analysis.interactions: the pair (obs_repeated, obs_repeated) must name two "
            "different features",
        ),
    ],
)
def test_bad_analysis_settings_exit_2_naming_the_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, analysis: str, message: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(RECOVERY.read_text() + analysis)
    code, out, err = run_cli(capsys, "plan", str(bad))
    assert (code, out) == (2, "")
    assert message in err and "Traceback" not in err
