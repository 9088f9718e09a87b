"""The capacity suite: snapshot, region and quota cases → the right refusals."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forklab.evals.suite import Case, SuiteResult, run_suite
from forklab.experiments.experiment.capacity import (
    Refusal,
    RegionQuota,
    SnapshotFacts,
    capacity_refusals,
)

Policy = Callable[[SnapshotFacts, list[RegionQuota], str, int], list[Refusal]]


def _snap(**change: Any) -> dict[str, Any]:
    base = {
        "id": "snap-1",
        "name": "forklab-runner",
        "state": "active",
        "regions": ["eu"],
        "cpu": 1,
        "memory_gib": 1,
        "disk_gib": 3,
    }
    return {**base, **change}


def _quota(**change: Any) -> dict[str, Any]:
    base = {
        "region": "eu",
        "cpu_total": 8,
        "cpu_used": 0,
        "memory_total_gib": 16,
        "memory_used_gib": 0,
        "disk_total_gib": 30,
        "disk_used_gib": 0,
    }
    return {**base, **change}


def _case(name: str, kinds: list[str], peak: int = 4, target: str = "eu", **parts: Any) -> Case:
    inp = {
        "snapshot": parts.get("snapshot", _snap()),
        "quotas": parts.get("quotas", [_quota()]),
        "target": target,
        "peak": peak,
    }
    return Case(name=name, input=inp, expected={"refusals": sorted(kinds)})


CASES = [
    _case("fits", []),
    _case("stale snapshot", ["stale"], snapshot=_snap(state="inactive")),
    _case("snapshot still building", ["stale"], snapshot=_snap(state="building")),
    _case("snapshot in another region", ["region"], snapshot=_snap(regions=["us"])),
    # seed 000: a 30 GiB quota fully used by one seed sandbox; even one more cannot start
    _case("disk quota exhausted", ["disk"], peak=1, quotas=[_quota(disk_used_gib=30)]),
    _case("disk × peak exceeds quota", ["disk"], peak=8, snapshot=_snap(disk_gib=5)),
    _case("cpu × peak exceeds quota", ["cpu"], peak=8, snapshot=_snap(cpu=2)),
    _case("memory × peak exceeds quota", ["memory"], peak=4, snapshot=_snap(memory_gib=8)),
    _case("no quota in the target region", ["no_quota"], target="us", snapshot=_snap(regions=[])),
    _case(
        "wrong region and stale",
        ["region", "stale"],
        snapshot=_snap(state="error", regions=["us"]),
    ),
    _case("exactly at the quota", [], peak=8, quotas=[_quota(disk_total_gib=24)]),
]


def run(policy: Policy = capacity_refusals, send: bool = False) -> SuiteResult:
    def task(inp: dict[str, Any]) -> dict[str, Any]:
        refusals = policy(
            SnapshotFacts.model_validate(inp["snapshot"]),
            [RegionQuota.model_validate(q) for q in inp["quotas"]],
            inp["target"],
            inp["peak"],
        )
        return {"refusals": sorted(r.kind.value for r in refusals)}

    return run_suite("capacity", CASES, task, send)
