"""Can the provider's account hold the plan? The judgement, apart from the API calls.

Seed 000's live run paid for each of these: a snapshot in another region than the
account's runners, a stale snapshot, and a disk quota the planned concurrency exceeded.
A plan is refused before approval for any of them, with one sentence per reason.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class SnapshotFacts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    name: str
    state: str
    regions: list[str]
    cpu: float
    memory_gib: float
    disk_gib: float


class RegionQuota(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    region: str
    cpu_total: float
    cpu_used: float
    memory_total_gib: float
    memory_used_gib: float
    disk_total_gib: float
    disk_used_gib: float


class RefusalKind(StrEnum):
    stale = "stale"
    region = "region"
    no_quota = "no_quota"
    disk = "disk"
    cpu = "cpu"
    memory = "memory"


class Refusal(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: RefusalKind
    reason: str


def capacity_refusals(
    snapshot: SnapshotFacts, quotas: list[RegionQuota], target: str, peak_sandboxes: int
) -> list[Refusal]:
    """Why ``peak_sandboxes`` sandboxes from ``snapshot`` cannot run in ``target``."""
    out = []
    if snapshot.state != "active":
        out.append(
            Refusal(
                kind=RefusalKind.stale,
                reason=f"snapshot {snapshot.name} ({snapshot.id}) is {snapshot.state}, not "
                "active: it is stale or still building; rebuild or activate it",
            )
        )
    if snapshot.regions and target not in snapshot.regions:
        out.append(
            Refusal(
                kind=RefusalKind.region,
                reason=f"snapshot {snapshot.name} is available in {', '.join(snapshot.regions)} "
                f"but the target region is {target}; use a snapshot built in {target} or "
                "change the target",
            )
        )
    quota = next((q for q in quotas if q.region == target), None)
    if quota is None:
        out.append(
            Refusal(kind=RefusalKind.no_quota, reason=f"the account has no quota in {target}")
        )
        return out
    for kind, per, total, used, unit in (
        (RefusalKind.disk, snapshot.disk_gib, quota.disk_total_gib, quota.disk_used_gib, "GiB"),
        (RefusalKind.cpu, snapshot.cpu, quota.cpu_total, quota.cpu_used, "vCPU"),
        (
            RefusalKind.memory,
            snapshot.memory_gib,
            quota.memory_total_gib,
            quota.memory_used_gib,
            "GiB",
        ),
    ):
        need, free = per * peak_sandboxes, total - used
        if need > free:
            what = "CPU" if kind is RefusalKind.cpu else kind.value
            out.append(
                Refusal(
                    kind=kind,
                    reason=f"snapshot {what} {per:g} {unit} × {peak_sandboxes} concurrent "
                    f"sandboxes = {need:g} {unit}, but region {target} has {free:g} of "
                    f"{total:g} {unit} free; lower budget.max_concurrent_sandboxes or free quota",
                )
            )
    return out
