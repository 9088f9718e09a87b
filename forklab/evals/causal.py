"""The causal suite: the analysis on crafted outcome tables → the right verdicts.

Each case is a small table of per-episode successes (True) and failures per world,
written to show one way an experiment can mislead: a placebo that drifts, a positive
control that moves the wrong way, an effect too small for the episodes, an effect that
is opposite in two slices (Simpson-style: none overall, large within each).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forklab.activities.experiment.twin import twin_held_out
from forklab.evals.suite import Case, SuiteResult, run_suite
from forklab.experiments.experiment.analysis.build import build_report
from forklab.experiments.experiment.outcomes import ExperimentOutcomes, WorldOutcomes
from forklab.experiments.experiment.report.model import Report
from forklab.experiments.experiment.spec import ExperimentSpec

Policy = Callable[[ExperimentSpec, ExperimentOutcomes], Report]
N = 40


def analysis(spec: ExperimentSpec, out: ExperimentOutcomes) -> Report:
    return build_report(spec, out, "crafted", held_out=twin_held_out(1))


def _fails(*ranges: tuple[int, int]) -> list[bool]:
    """N episodes, failing (False) in the given half-open ranges."""
    return [not any(a <= i < b for a, b in ranges) for i in range(N)]


def _spec(worlds: dict[str, str]) -> dict[str, Any]:
    """A spec over the built-in counter workload (the guard validates on its twin)."""
    return {
        "id": "crafted",
        "hypothesis": {"text": "crafted table"},
        "seed": 0,
        "episodes": N,
        "workload": {"name": "counter-recovery", "params": {}},
        "worlds": [{"name": "baseline", "role": "baseline"}]
        + [
            {"name": name, "role": role, "intervention": {"name": "refresh"}}
            for name, role in worlds.items()
        ],
        "budget": {"max_world_seconds": 60, "max_concurrent_sandboxes": 1},
        "analysis": {"guard": {"holdout_episodes": 4}},
    }


def _case(
    name: str,
    roles: dict[str, str],
    tables: dict[str, list[bool]],
    expected: dict[str, Any],
    zones: bool = False,
) -> Case:
    # the counter workload's own feature, so the guard can validate on its twin
    features = [{"obs_repeated": i < N // 2} if zones else {} for i in range(N)]
    return Case(
        name=name,
        input={"spec": _spec(roles), "tables": tables, "features": features},
        expected=expected,
    )


BASE = _fails((0, 12))  # 12 of 40 fail
CASES = [
    _case(
        "a clear win and a faithful placebo",
        {"treatment": "treatment", "placebo": "placebo"},
        {"baseline": BASE, "treatment": _fails(), "placebo": BASE},
        {"valid": True, "verdicts": {"treatment": "supported", "placebo": "supported"}},
    ),
    _case(
        "placebo drift invalidates every verdict",
        {"treatment": "treatment", "placebo": "placebo"},
        {"baseline": BASE, "treatment": _fails(), "placebo": _fails((3, 15))},
        {"valid": False, "verdicts": {"treatment": "invalid", "placebo": "invalid"}},
    ),
    _case(
        "a positive control that cuts failures invalidates every verdict",
        {"treatment": "treatment", "latency": "positive_control"},
        {"baseline": BASE, "treatment": _fails(), "latency": _fails((0, 2))},
        {"valid": False, "verdicts": {"treatment": "invalid", "latency": "invalid"}},
    ),
    _case(
        "too few discordant pairs: inconclusive, not supported",
        {"treatment": "treatment", "latency": "positive_control"},
        {"baseline": BASE, "treatment": _fails((3, 12), (20, 21)), "latency": _fails((0, 20))},
        {"valid": True, "verdicts": {"treatment": "inconclusive", "latency": "supported"}},
    ),
    _case(
        "a treatment that makes things worse is refuted",
        {"treatment": "treatment"},
        {"baseline": BASE, "treatment": _fails((0, 30))},
        {"valid": True, "verdicts": {"treatment": "refuted"}},
    ),
    _case(
        "Simpson-style: opposite effects in two slices cancel overall",
        {"treatment": "treatment"},
        {
            "baseline": _fails((0, 10)),  # 10 fail where the observation repeated, none elsewhere
            "treatment": _fails((20, 30)),  # rescues those 10, harms 10 in the other slice
        },
        {
            "valid": True,
            "verdicts": {"treatment": "inconclusive"},
            "slices": {"obs_repeated=False": -10, "obs_repeated=True": 10},
        },
        zones=True,
    ),
]


def run(policy: Policy = analysis, send: bool = False) -> SuiteResult:
    def task(inp: dict[str, Any]) -> dict[str, Any]:
        spec = ExperimentSpec.model_validate(inp["spec"])
        episodes = list(range(N))
        checkpoints = [f"cp-{i}" for i in episodes]
        out = ExperimentOutcomes(
            episodes=episodes,
            requested=episodes,
            resolved=episodes,
            checkpoints=checkpoints,
            features=inp["features"],
            worlds=[
                WorldOutcomes(
                    name=name,
                    outcomes=table,
                    intervened=[name != "baseline"] * N,
                    shocks=[""] * N,
                    inherited=checkpoints,
                    code_digest="crafted",
                    snapshot="crafted",
                )
                for name, table in inp["tables"].items()
            ],
        )
        report = policy(spec, out)
        result: dict[str, Any] = {
            "valid": report.valid,
            "verdicts": {v.world: v.verdict.value for v in report.verdicts},
        }
        slices = {
            f"{s.feature}={s.value}": s.net
            for c in report.comparisons
            if c.world == "treatment" and c.vs == "baseline"
            for s in c.slice_effects
        }
        if slices:  # key order matters to ExactMatch, which compares serialised values
            result["slices"] = dict(sorted(slices.items()))
        return result

    return run_suite("causal", CASES, task, send)
