"""Validity checks: named, pass/fail, each with a reason a person can act on."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from forklab.experiments.experiment.chunks import FINGERPRINT_EVERY, FINGERPRINTS_IN_FULL
from forklab.experiments.experiment.columnar import Bools, StrColumn, bools
from forklab.experiments.experiment.outcomes import ExperimentOutcomes
from forklab.experiments.experiment.results import Check, InfraUsage, WorldStatus
from forklab.experiments.experiment.spec import Direction, ExperimentSpec, Role
from forklab.runtime.crn import UNCHECKED

#: A world that ran: every episode (completed), or the waves its sequential design let it.
_RAN = (WorldStatus.completed, WorldStatus.stopped)


def completion(
    spec: ExperimentSpec, out: ExperimentOutcomes, design_stops: dict[str, int] | None = None
) -> Check:
    """Every world ran every episode, or, under a sequential design, exactly the episodes
    the design gave it: ``design_stops`` maps each world the design stopped to the
    episodes it stopped at (recomputed from the data, so a world cut short for any other
    reason, or run past its stop, fails here)."""
    n = len(out.episodes)
    stops = design_stops or {}
    base = spec.baseline.name
    short = []
    for w in out.worlds:
        if w.status is WorldStatus.stopped and w.name not in stops:
            short.append(f"{w.name} (stopped after {len(w.outcomes)} episodes, not by its design)")
            continue
        want = stops.get(w.name, n) if w.status is WorldStatus.stopped else n
        if w.status not in _RAN or len(w.outcomes) != want:
            error = ": " + w.error if w.error else ""
            short.append(f"{w.name} ({w.status.value}{error}; {len(w.outcomes)}/{want})")
    run = stops.get(base, spec.episodes) if out.world(base).status is WorldStatus.stopped else None
    if n != (run or spec.episodes):
        short.insert(0, f"{n} of {spec.episodes} episodes were run")
    if short:
        return Check(name="completion", passed=False, reason="incomplete: " + "; ".join(short))
    stopped = [w for w in out.worlds if w.status is WorldStatus.stopped]
    if stopped:
        return Check(
            name="completion",
            passed=True,
            reason="every world ran what its sequential design asked: "
            + ", ".join(f"{w.name} {len(w.outcomes)}" for w in out.worlds)
            + f" of {spec.episodes} episodes",
        )
    return Check(
        name="completion",
        passed=True,
        reason=f"all {len(out.worlds)} worlds completed all {n} episodes",
    )


def _completed(out: ExperimentOutcomes) -> list[str]:
    return [w.name for w in out.worlds if w.status in _RAN]


def common_checkpoints(out: ExperimentOutcomes) -> Check:
    bad = [
        w.name
        for w in out.worlds
        if w.status in _RAN and w.inherited != out.checkpoints[: len(w.inherited)]
    ]
    if bad:
        return Check(
            name="common_checkpoints",
            passed=False,
            reason=f"worlds did not inherit the recorded checkpoints: {', '.join(bad)}",
        )
    boundary_miss = int(np.count_nonzero(np.asarray(out.requested) != np.asarray(out.resolved)))
    if boundary_miss:
        return Check(
            name="common_checkpoints",
            passed=False,
            reason=f"{boundary_miss} episodes resolved a boundary other than the requested one",
        )
    return Check(
        name="common_checkpoints",
        passed=True,
        reason=f"every world forked from the same {len(out.checkpoints)} checkpoint digests "
        "at the requested boundary",
    )


def common_random_numbers(out: ExperimentOutcomes) -> Check:
    names = _completed(out)
    if not names:
        return Check(name="common_random_numbers", passed=False, reason="no world completed")
    ref = out.world(names[0]).shocks
    # a world a sequential design stopped is compared on the episodes it ran
    bad = [
        n
        for n in names[1:]
        if (m := min(len(ref), len(out.world(n).shocks))) and out.world(n).shocks[:m] != ref[:m]
    ]
    if bad:
        return Check(
            name="common_random_numbers",
            passed=False,
            reason=f"shock fingerprints differ from {names[0]} in: {', '.join(bad)}",
        )
    n = len(ref)
    checked = n - _unchecked(ref)
    scope = (
        ""
        if checked == n
        else f" in the {checked:,} of {n:,} episodes fingerprinted (a {checked / n:.1%} sample: "
        f"the local twin fingerprints every {FINGERPRINT_EVERY}th episode of a run over "
        f"{FINGERPRINTS_IN_FULL:,}; the other episodes are not compared)"
    )
    return Check(
        name="common_random_numbers",
        passed=True,
        reason=f"per-episode shock fingerprints identical across {len(names)} worlds{scope}",
    )


def _unchecked(shocks: StrColumn | Sequence[str]) -> int:
    """Episodes whose worlds kept no record of their draws (``UNCHECKED``)."""
    if isinstance(shocks, StrColumn):
        if UNCHECKED not in shocks.values:
            return 0
        return int(np.count_nonzero(shocks.codes == shocks.values.index(UNCHECKED)))
    return sum(1 for s in shocks if s == UNCHECKED)


def placebo_fidelity(spec: ExperimentSpec, out: ExperimentOutcomes) -> Check | None:
    placebos = [w.name for w in spec.worlds if w.role is Role.placebo]
    if not placebos:
        return None
    base = out.world(spec.baseline.name)
    if base.status not in _RAN:
        return Check(name="placebo_fidelity", passed=False, reason="the baseline did not complete")
    diffs = []
    for name in placebos:
        world = out.world(name)
        if world.status not in _RAN:
            diffs.append(f"{name} did not complete")
            continue
        m = len(world.outcomes)
        if world.status is WorldStatus.completed and m != len(base.outcomes):
            diffs.append(f"{name} ran {m} of {len(base.outcomes)} episodes")
            continue
        # a placebo a sequential design stopped, stopped at its first difference
        n = int(np.count_nonzero(bools(world.outcomes) != bools(base.outcomes)[:m]))
        if n:
            diffs.append(f"{name} differs from the baseline in {n} episodes")
    if diffs:
        return Check(name="placebo_fidelity", passed=False, reason="; ".join(diffs))
    return Check(
        name="placebo_fidelity",
        passed=True,
        reason=f"{', '.join(placebos)} reproduced the baseline episode for episode",
    )


def failure_rate(outcomes: Sequence[bool] | Bools) -> float:
    n = len(outcomes)
    return (n - int(np.count_nonzero(bools(outcomes)))) / n if n else 0.0


def positive_control(spec: ExperimentSpec, out: ExperimentOutcomes) -> Check | None:
    controls = [w.name for w in spec.worlds if w.role is Role.positive_control]
    if not controls:
        return None
    base = out.world(spec.baseline.name)
    if base.status not in _RAN:
        return Check(name="positive_control", passed=False, reason="the baseline did not complete")
    problems: list[str] = []
    seen: list[str] = []
    for name in controls:
        expected = spec.hypothesis.expected.get(name, Direction.increase)
        if out.world(name).status not in _RAN:
            problems.append(f"{name} did not complete")
            continue
        outcomes = out.world(name).outcomes
        rate = failure_rate(outcomes)
        # over the episodes the control ran (all, unless a sequential design stopped it)
        base_rate = failure_rate(bools(base.outcomes)[: len(outcomes)])
        ok = rate > base_rate if expected is Direction.increase else rate < base_rate
        if expected is Direction.none:
            ok = rate == base_rate
        text = (
            f"{name} failure rate {rate:.1%} vs baseline {base_rate:.1%} "
            f"(expected {expected.value})"
        )
        (seen if ok else problems).append(text)
    if problems:
        return Check(name="positive_control", passed=False, reason="; ".join(problems))
    return Check(name="positive_control", passed=True, reason="; ".join(seen))


def workload_identity(out: ExperimentOutcomes, code_digest: str) -> Check:
    """Every world ran the very workload code the plan was fingerprinted with."""
    bad = [
        f"{w.name} ({w.code_digest[:12] or 'none'})"
        for w in out.worlds
        if w.status in _RAN and w.code_digest != code_digest
    ]
    if bad:
        return Check(
            name="workload_identity",
            passed=False,
            reason=f"code digest differs from the plan's {code_digest[:12]} in: {', '.join(bad)}",
        )
    return Check(
        name="workload_identity",
        passed=True,
        reason=f"every world ran workload code {code_digest[:12]}",
    )


def common_snapshot(out: ExperimentOutcomes) -> Check:
    """Every world started from the same (named) snapshot: the provenance they share."""
    snapshots = {w.snapshot for w in out.worlds if w.status in _RAN}
    if len(snapshots) != 1 or "" in snapshots:
        shown = ", ".join(sorted(s or "(none)" for s in snapshots)) or "(no world completed)"
        return Check(
            name="common_snapshot",
            passed=False,
            reason=f"worlds must start from one recorded snapshot; found: {shown}",
        )
    return Check(
        name="common_snapshot",
        passed=True,
        reason=f"every world started from snapshot {next(iter(snapshots))[:24]}",
    )


def infrastructure_fit(infra: InfraUsage | None) -> Check:
    """Budget and concurrency respected, and nothing left running afterwards."""
    if infra is None:
        return Check(name="infrastructure_fit", passed=True, reason="not applicable (local twin)")
    problems = []
    if infra.world_seconds_spent > infra.world_seconds_budget:
        problems.append(
            f"spent {infra.world_seconds_spent:.1f} of a {infra.world_seconds_budget:.1f} "
            "world-second budget"
        )
    if infra.peak_concurrent_sandboxes > infra.max_concurrent_sandboxes:
        problems.append(
            f"peak {infra.peak_concurrent_sandboxes} sandboxes above the limit of "
            f"{infra.max_concurrent_sandboxes}"
        )
    if infra.sandboxes_left:
        problems.append(f"{infra.sandboxes_left} sandboxes left after cleanup")
    if problems:
        return Check(name="infrastructure_fit", passed=False, reason="; ".join(problems))
    skipped = f"; {infra.skipped_batches} batches skipped" if infra.skipped_batches else ""
    return Check(
        name="infrastructure_fit",
        passed=True,
        reason=f"spent {infra.world_seconds_spent:.1f} of {infra.world_seconds_budget:.1f} "
        f"world-seconds, peak {infra.peak_concurrent_sandboxes} of "
        f"{infra.max_concurrent_sandboxes} sandboxes, 0 left{skipped}",
    )


def validity_checks(
    spec: ExperimentSpec,
    out: ExperimentOutcomes,
    code_digest: str,
    infra: InfraUsage | None,
    design_stops: dict[str, int] | None = None,
) -> list[Check]:
    """Every validity check; one failure makes the experiment invalid, whatever the effects.
    ``design_stops``: see ``completion``."""
    found = [
        completion(spec, out, design_stops),
        common_checkpoints(out),
        common_random_numbers(out),
        placebo_fidelity(spec, out),
        positive_control(spec, out),
        workload_identity(out, code_digest),
        common_snapshot(out),
        infrastructure_fit(infra),
    ]
    return [c for c in found if c is not None]
