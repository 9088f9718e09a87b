"""Guard policies: intervene only where the slices say the intervention pays.

Learning (on the spec's episodes, the training set): every single feature, and every
interaction the spec requests, partitions the episodes into slices. Within one
partition the rule picks the slices that maximise rescues subject to the harm cap:

- ``harm_cap: null`` (default): any slice whose harms do not exceed its rescues;
- ``harm_cap: k``: the subset whose harms add up to at most ``k`` (an exact knapsack
  over the slices), so ``harm_cap: 0`` admits only slices with no harm at all.

The partition with the most rescues wins (ties: fewer harms, then fewer interventions,
since each one costs, then one feature before an interaction, then fewer clauses). The
rule is the runner's JSON, so the guarded world runs exactly what was learned.

Validation (on held-out episodes: fresh seeds after the training ones, capped by
default): the baseline and the treatment, and the ``guarded`` world, which intervenes
only where the rule fires, derived from those two and the pre-decision features
(docs/analysis.md says why that is exact and why held-out episodes rather than
cross-fitting). The twin runs the two worlds itself; the durable path passes a
``HeldOutRunner`` that runs them in a sandbox, so no workload code runs beside the
analysis, and derives the guarded world from its answer the same way.
The rule *validates* only when its held-out net is at least that of both simple policies,
always intervening and never intervening (net 0); otherwise the report says it did not,
in words and in the verdict table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel

from forklab.experiments.experiment.analysis.held_out_plan import (
    guard_world,
    held_out_request,
    holdout_size,
)
from forklab.experiments.experiment.analysis.pairs import paired_table
from forklab.experiments.experiment.analysis.slices import Clause, SliceEffect, feature_text
from forklab.experiments.experiment.columnar import (
    Bools,
    ColumnBatch,
    FeatureRows,
    as_features,
    bools,
)
from forklab.experiments.experiment.spec import ExperimentSpec, World
from forklab.runtime.file_format import WorldPlan
from forklab.runtime.runner import rule_fires
from forklab.runtime.workload import Feature

#: Runs ``worlds`` over ``episodes`` of a spec: every world's columns and the features.
HeldOutRunner = Callable[[ExperimentSpec, Sequence[int], Sequence[WorldPlan]], ColumnBatch]


class GuardCounts(BaseModel):
    episodes: int
    intervened: int
    rescue: int
    harm: int
    net: int


class GuardEvaluation(BaseModel):
    """Pairs against the baseline on a range of episodes: ``before`` with the treatment
    always applied, ``after`` with it applied only where the rule fires."""

    first_episode: int
    last_episode: int
    before: GuardCounts
    after: GuardCounts


class GuardPolicy(BaseModel):
    world: str
    intervention: str
    harm_cap: int | None
    basis: str
    rule: dict[str, list[Clause]]
    words: str
    training: GuardEvaluation
    held_out: GuardEvaluation
    validated: bool
    validation: str


def held_out_validation(ev: GuardEvaluation) -> tuple[bool, str]:
    """Did the rule beat both simple policies on held-out episodes? And the sentence."""
    guarded, always = ev.after.net, ev.before.net
    span = f"held-out episodes {ev.first_episode}..{ev.last_episode}"
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


def _best_subset(slices: Sequence[SliceEffect], harm_cap: int | None) -> list[SliceEffect]:
    useful = [s for s in slices if s.rescue > 0]
    if harm_cap is None:
        return [s for s in useful if s.harm <= s.rescue]
    cap = min(harm_cap, sum(s.harm for s in useful))
    # best[h] = (rescues, chosen indices) using at most h harms.
    best: list[tuple[int, tuple[int, ...]]] = [(0, ())] * (cap + 1)
    for i, s in enumerate(useful):
        for h in range(cap, s.harm - 1, -1):
            prev_rescue, prev_set = best[h - s.harm]
            if prev_rescue + s.rescue > best[h][0]:
                best[h] = (prev_rescue + s.rescue, (*prev_set, i))
    return [useful[i] for i in sorted(best[cap][1])]


def _merge_ranges(chosen: list[SliceEffect]) -> list[Clause]:
    """Adjacent chosen bins of one numeric feature become one range clause."""
    clauses: list[Clause] = []
    for s in chosen:
        clause = {k: dict(v) for k, v in s.clause.items()}
        if clauses and len(clause) == 1 and len(clauses[-1]) == 1:
            (name, m), (pname, pm) = next(iter(clause.items())), next(iter(clauses[-1].items()))
            ranges = not {"eq", "not_in"} & (m.keys() | pm.keys())
            if name == pname and ranges and pm.get("lt") == m.get("ge"):
                merged = {k: v for k, v in pm.items() if k == "ge"}
                merged.update({k: v for k, v in m.items() if k == "lt"})
                clauses[-1] = {name: merged}
                continue
        clauses.append(clause)
    return clauses


def learn_rule(
    partitions: Sequence[Sequence[SliceEffect]], harm_cap: int | None
) -> tuple[str, list[Clause], list[SliceEffect]]:
    """(basis, clauses, chosen slices) of the best rule over all partitions."""
    best: tuple[Any, ...] | None = None
    for slices in partitions:
        if not slices:
            continue
        chosen = _best_subset(slices, harm_cap)
        if not chosen:
            continue
        clauses = (
            [{}] if len(chosen) == len(slices) else _merge_ranges(chosen)
        )  # every slice chosen: the rule always fires, unseen values included
        basis = slices[0].feature
        rescue, harm = sum(s.rescue for s in chosen), sum(s.harm for s in chosen)
        fired = sum(s.n for s in chosen)
        key = (rescue, -harm, -fired, -len(slices[0].clause), -len(clauses), basis)
        if best is None or key > best[0]:
            best = (key, basis, clauses, chosen)
    if best is None:
        return "", [], []
    return best[1], best[2], best[3]


def _matcher_words(feature: str, matcher: dict[str, Any]) -> str:
    if "eq" in matcher:
        return f"{feature} is {feature_text(matcher['eq'])}"
    if "not_in" in matcher:
        return f"{feature} is none of {', '.join(map(feature_text, matcher['not_in']))}"
    lo, hi = matcher.get("ge"), matcher.get("lt")
    if lo is not None and hi is not None:
        return f"{lo:g} ≤ {feature} < {hi:g}"
    if lo is not None:
        return f"{feature} ≥ {lo:g}"
    if hi is not None:
        return f"{feature} < {hi:g}"
    return f"{feature} has any value"


def rule_words(intervention: str, clauses: list[Clause], harm_cap: int | None) -> str:
    if not clauses:
        cap = "no more harms than rescues" if harm_cap is None else f"at most {harm_cap} harms"
        return f"never apply {intervention}: no slice rescued any run with {cap}"
    if clauses == [{}]:
        return f"always apply {intervention}: every slice pays"
    parts = [" and ".join(_matcher_words(f, m) for f, m in c.items()) for c in clauses]
    return f"apply {intervention} only when " + " or ".join(parts)


def _counts(
    reference: Sequence[bool] | Bools, world: Sequence[bool] | Bools, fired: Sequence[bool] | Bools
) -> GuardCounts:
    c = paired_table(reference, world)
    return GuardCounts(
        episodes=len(reference),
        intervened=int(np.count_nonzero(bools(fired))),
        rescue=c.rescue,
        harm=c.harm,
        net=c.net,
    )


def guarded_outcomes(
    rule: dict[str, Any],
    features: FeatureRows | Sequence[dict[str, Feature]],
    reference: Sequence[bool] | Bools,
    treated: Sequence[bool] | Bools,
    intervened: Sequence[bool] | Bools,
) -> tuple[Bools, Bools]:
    """The guarded world, derived: (outcomes, intervened) of applying the treatment only
    where ``rule`` fires on the features recorded at the boundary.

    Exact, not an estimate: a world is a pure function of its checkpoint, its
    intervention and the episode's common random numbers (the workload contract), and the
    runner's guarded world decides on the same boundary features. Where the rule fires it
    *is* the treatment world of that episode; elsewhere it is the baseline world. The rule
    is asked once per distinct features row, with the runner's own ``rule_fires``.
    """
    table = as_features(features)
    on_row = np.fromiter(
        (rule_fires(rule, f) for f in table.rows), dtype=np.bool_, count=len(table.rows)
    )
    fires = on_row[table.codes]
    return np.where(fires, bools(treated), bools(reference)), fires & bools(intervened)


def validate_guard(
    spec: ExperimentSpec,
    treatment: World,
    rule: dict[str, Any],
    holdout: int,
    held_out: HeldOutRunner,
) -> GuardEvaluation:
    """Baseline and treatment on ``holdout`` fresh episodes after the spec's, and the
    guarded world derived from them (``guarded_outcomes``), run by ``held_out`` (a
    sandbox, or the twin)."""
    episodes, plans = held_out_request(spec, treatment, holdout)
    batch = held_out(spec, episodes, plans)
    base = batch["worlds"][spec.baseline.name]["outcomes"]
    before = batch["worlds"][treatment.name]
    after, fired = guarded_outcomes(
        rule, batch["features"], base, before["outcomes"], before["intervened"]
    )
    return GuardEvaluation(
        first_episode=episodes.start,
        last_episode=episodes.stop - 1,
        before=_counts(base, before["outcomes"], before["intervened"]),
        after=_counts(base, after, fired),
    )


def guard_policy(
    spec: ExperimentSpec,
    partitions: Sequence[Sequence[SliceEffect]],
    reference: Sequence[bool] | Bools,
    treated: Sequence[bool] | Bools,
    intervened: Sequence[bool] | Bools,
    held_out: HeldOutRunner,
) -> GuardPolicy | None:
    """Learn the guard from ``partitions`` (the gated world's slices against the baseline
    on the training episodes, whose outcomes are ``reference`` and ``treated``) and
    validate it on held-out episodes."""
    world = guard_world(spec)
    if world is None or world.intervention is None:
        return None
    cap = spec.analysis.guard.harm_cap
    basis, clauses, chosen = learn_rule(partitions, cap)
    rule: dict[str, list[Clause]] = {"any": clauses}
    holdout = holdout_size(spec)
    training = GuardEvaluation(
        first_episode=0,
        last_episode=spec.episodes - 1,
        before=_counts(reference, treated, intervened),
        after=GuardCounts(
            episodes=len(reference),
            intervened=sum(s.n for s in chosen),
            rescue=sum(s.rescue for s in chosen),
            harm=sum(s.harm for s in chosen),
            net=sum(s.net for s in chosen),
        ),
    )
    evaluation = validate_guard(spec, world, rule, holdout, held_out)
    validated, validation = held_out_validation(evaluation)
    return GuardPolicy(
        world=world.name,
        intervention=world.intervention.name,
        harm_cap=cap,
        basis=basis or "(none)",
        rule=rule,
        words=rule_words(world.intervention.name, clauses, cap),
        training=training,
        held_out=evaluation,
        validated=validated,
        validation=validation,
    )
