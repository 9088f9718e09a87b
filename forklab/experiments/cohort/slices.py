"""Slices and the guard policy of an experiment over a cohort, as for workloads: the runs
grouped by their pre-decision features (what ``cohort.features`` read at the fork point),
each world's rescues and harms by majority within every group, and a rule "apply the
world only where ..." learned on some runs and validated on the others.

A run's pair is (the baseline's majority outcome, the world's majority outcome) over its
k forks. Slicing and learning are the workload analysis's own functions
(``forklab.experiments.experiment.analysis.slices`` and ``.guard``), so a cohort rule is
the same JSON rule, read the same way. Held-out runs stand in for the workloads' fresh
episodes: a share ``cohort.holdout_share`` of the plan's runs, picked by a hash of the
experiment's seed and each workflow id alone (fixed before any fork runs, whatever the
outcomes), never used to learn the rule. The guarded world on a held-out run is derived
exactly: where the rule fires on the run's features it *is* the world's forks of that
run, elsewhere the baseline's (the features were read before the decision).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np

from forklab.experiments.cohort.guard_policy import CohortGuard, RunCounts
from forklab.experiments.cohort.spec import CohortExperimentSpec, ForkWorld
from forklab.experiments.experiment.analysis.guard import (
    guarded_outcomes,
    learn_rule,
    rule_words,
)
from forklab.experiments.experiment.analysis.pairs import paired_table
from forklab.experiments.experiment.analysis.slices import (
    Clause,
    SliceEffect,
    dimensions,
    slice_effects,
)
from forklab.experiments.experiment.spec import Role
from forklab.runtime.workload import Feature

Features = Mapping[str, Feature]


def held_out_runs(seed: int, workflow_ids: Sequence[str], share: float) -> set[int]:
    """The indexes of the held-out runs: the ``round(share × n)`` runs (at least one of two
    or more) whose sha256 of (seed, workflow id) is smallest: a function of the spec and
    the plan alone."""
    n = len(workflow_ids)
    count = min(n - 1, max(1, round(share * n))) if n >= 2 else 0
    ranked = sorted(
        range(n),
        key=lambda i: hashlib.sha256(f"{seed}:{workflow_ids[i]}".encode()).hexdigest(),
    )
    return set(ranked[:count])


def _counts(base: np.ndarray, world: np.ndarray, fired: np.ndarray) -> RunCounts:
    table = paired_table(base, world)
    return RunCounts(
        runs=len(base),
        intervened=int(np.count_nonzero(fired)),
        rescue=table.rescue,
        harm=table.harm,
        net=table.net,
    )


def world_slices(
    features: Sequence[Features], base: np.ndarray, world: np.ndarray, bins: int
) -> list[SliceEffect]:
    """The world's rescues and harms (by majority) within each slice of each feature."""
    if not features or not any(features):
        return []
    out: list[SliceEffect] = []
    for dim in dimensions(features, bins).values():
        out += slice_effects(base, world, features, [dim])
    return out


def guard_world(spec: CohortExperimentSpec) -> ForkWorld | None:
    """The world the guard gates: the spec's choice, else the first treatment."""
    name = spec.analysis.guard.world
    return next(
        (w for w in spec.worlds if w.role is Role.treatment and (name is None or w.name == name)),
        None,
    )


def cohort_guard(
    spec: CohortExperimentSpec,
    world: ForkWorld,
    features: Sequence[Features],
    base: np.ndarray,
    treated: np.ndarray,
    held_out: set[int],
) -> CohortGuard:
    """Learn the rule on the runs not ``held_out`` (indexes into the compared runs) and
    validate it on those that are."""
    train = [i for i in range(len(features)) if i not in held_out]
    test = sorted(held_out)
    f_train = [features[i] for i in train]
    b_train, w_train = base[train], treated[train]
    cap = spec.analysis.guard.harm_cap
    partitions = (
        [
            slice_effects(b_train, w_train, f_train, [dim])
            for dim in dimensions(f_train, spec.analysis.quantile_bins).values()
        ]
        if train
        else []
    )
    basis, clauses, chosen = learn_rule(partitions, cap)
    rule: dict[str, list[Clause]] = {"any": clauses}
    always = np.ones(len(train), dtype=bool)
    f_test = [features[i] for i in test]
    b_test, w_test = base[test], treated[test]
    after, fired = guarded_outcomes(
        rule, [dict(f) for f in f_test], b_test, w_test, np.ones(len(test), dtype=bool)
    )
    held_before = _counts(b_test, w_test, np.ones(len(test), dtype=bool))
    held_after = _counts(b_test, after, fired)
    validated, validation = _validation(held_before.net, held_after.net, len(test))
    return CohortGuard(
        world=world.name,
        harm_cap=cap,
        basis=basis or "(none)",
        rule=rule,
        words=rule_words(world.name, clauses, cap),
        training_before=_counts(b_train, w_train, always),
        training_after=RunCounts(
            runs=len(train),
            intervened=sum(s.n for s in chosen),
            rescue=sum(s.rescue for s in chosen),
            harm=sum(s.harm for s in chosen),
            net=sum(s.net for s in chosen),
        ),
        held_out_before=held_before,
        held_out_after=held_after,
        validated=validated,
        validation=validation,
    )


def _validation(always: int, guarded: int, runs: int) -> tuple[bool, str]:
    """Did the rule do at least as well as always and never applying the world on the
    held-out runs? And the sentence."""
    if runs == 0:
        return False, "the rule did not validate: no held-out run has every outcome"
    span = f"the {runs} held-out runs"
    worse = [f"always applying it ({always:+d})"] if guarded < always else []
    worse += ["never applying it (+0)"] if guarded < 0 else []
    if worse:
        return False, (
            f"the rule did not validate: on {span} its net {guarded:+d} is below "
            + " and ".join(worse)
        )
    return True, (
        f"the rule validated: on {span} its net {guarded:+d} is at least that of always "
        f"applying it ({always:+d}) and of never applying it (+0)"
    )
