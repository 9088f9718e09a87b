"""The report of an experiment over a cohort: per world, rescues / harms / unchanged (the
majority and the rate views), the A/A noise floor, each world's verdict against it, the
cost per rescue, and the ``forklab diff`` command of every rescued and harmed run's fork
pair. Pure: the outcomes come in as a matrix, the text goes out as a string.

A fork whose outcome is missing (it could not be started or read) is never counted as a
failure: a run with a missing fork in any world leaves the comparison, and the report
says how many forks and runs that took.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from pydantic import BaseModel, Field

from forklab.experiments.cohort.guard_policy import CohortGuard
from forklab.experiments.cohort.matrix import MISSING, SUCCESS, UNSPENT, WorldCosts
from forklab.experiments.cohort.noise import NoiseFloor, WorldJudgement, judge_worlds
from forklab.experiments.cohort.sequential import DesignPath, cohort_design, design_paths, expected
from forklab.experiments.cohort.slices import (
    Features,
    cohort_guard,
    guard_world,
    held_out_runs,
    world_slices,
)
from forklab.experiments.cohort.spec import CohortExperimentSpec
from forklab.experiments.cohort.votes import as_voted, saved_forks
from forklab.experiments.experiment.analysis.slices import SliceEffect, feature_text
from forklab.experiments.experiment.spec import Role


class WorldSummary(BaseModel):
    world: str
    role: Role
    description: str
    judgement: WorldJudgement
    #: run indexes (into the cohort plan's runs) rescued / harmed by majority
    rescued: list[int]
    harmed: list[int]
    cost_per_rescue_tokens: float | None
    cost_per_rescue_seconds: float | None


class CohortSummary(BaseModel):
    runs: int
    compared_runs: list[int]
    missing_forks: int
    #: forks not run because their run's majority was decided (``stop_when_decided``)
    saved_forks: int = 0
    floor: NoiseFloor
    worlds: list[WorldSummary]
    #: per world, its rescues and harms within each slice of the pre-decision features
    #: (over the compared runs; none without ``cohort.features``)
    slices: dict[str, list[SliceEffect]] = Field(default_factory=dict)
    guard: CohortGuard | None = None
    #: with ``analysis.sequential``: each world's path, verdict valid for the design and
    #: unspent budget; the forks the design left unspent in every world
    design: list[DesignPath] = Field(default_factory=list)
    unspent_forks: int = 0
    #: runs some world did not run (its design stopped it) and no fork of which is missing
    unspent_runs: int = 0


def summarise(
    spec: CohortExperimentSpec,
    outcomes: Mapping[str, Sequence[str]],
    costs: Mapping[str, WorldCosts],
    features: Sequence[Features] = (),
    workflow_ids: Sequence[str] = (),
) -> CohortSummary:
    """``outcomes[world][run]`` is one character per fork; every world lists every run.
    ``features[run]`` are the run's pre-decision features and ``workflow_ids[run]`` its
    id (the held-out runs of the guard are picked by it); without features, no slices and
    no guard."""
    names = [w.name for w in spec.worlds]
    runs = len(outcomes[spec.baseline.name])
    complete = [
        i
        for i in range(runs)
        if all(
            MISSING not in outcomes[name][i] and UNSPENT not in outcomes[name][i] for name in names
        )
    ]
    missing = sum(row.count(MISSING) for name in names for row in outcomes[name])
    if not complete:
        raise ValueError(
            "no run of the cohort has an outcome for every fork of every world; "
            "nothing can be compared"
        )

    k = spec.cohort.forks_per_world
    voted = spec.cohort.stop_when_decided

    def matrix(name: str, raw: bool = False) -> np.ndarray:
        rows = [outcomes[name][i] for i in complete]
        if voted and not raw:
            rows = [as_voted(row, k) for row in rows]
        return np.array([[c == SUCCESS for c in row] for row in rows])

    base = matrix(spec.baseline.name)
    others = [w for w in spec.worlds if w.role is not Role.baseline]
    floor_from = matrix(spec.baseline.name, raw=True) if voted else None
    if spec.analysis.sequential is not None:
        # a design stops worlds, not the baseline's forks: the floor reads every run the
        # baseline ran, more than every world ran
        ran = [r for r in outcomes[spec.baseline.name] if MISSING not in r and UNSPENT not in r]
        floor_from = np.array([[c == SUCCESS for c in row] for row in ran])
    floor, judged = judge_worlds(
        base,
        {w.name: (w.role, expected(spec, w), matrix(w.name)) for w in others},
        alpha=spec.analysis.alpha,
        floor_from=floor_from,
    )
    design = cohort_design(spec, runs)
    paths = [] if design is None else design_paths(spec, design, outcomes, costs)
    if paths:
        judged = _by_design(judged, paths)
    base_major = base.sum(axis=1) * 2 > k
    summaries: list[WorldSummary] = []
    for world, judgement in zip(others, judged, strict=True):
        major = matrix(world.name).sum(axis=1) * 2 > k
        rescued = [complete[j] for j in range(len(complete)) if major[j] and not base_major[j]]
        harmed = [complete[j] for j in range(len(complete)) if base_major[j] and not major[j]]
        cost = costs.get(world.name, WorldCosts())
        summaries.append(
            WorldSummary(
                world=world.name,
                role=world.role,
                description=world.describe(),
                judgement=judgement,
                rescued=rescued,
                harmed=harmed,
                cost_per_rescue_tokens=cost.tokens / len(rescued) if rescued else None,
                cost_per_rescue_seconds=cost.seconds / len(rescued) if rescued else None,
            )
        )
    slices: dict[str, list[SliceEffect]] = {}
    guard = None
    if features and any(features):
        rows = [features[i] for i in complete]
        bins = spec.analysis.quantile_bins
        for world in others:
            slices[world.name] = world_slices(
                rows, base_major, matrix(world.name).sum(axis=1) * 2 > k, bins
            )
        gated = guard_world(spec)
        if gated is not None:
            held = held_out_runs(spec.seed, workflow_ids, spec.cohort.holdout_share)
            guard = cohort_guard(
                spec,
                gated,
                rows,
                base_major,
                matrix(gated.name).sum(axis=1) * 2 > k,
                {j for j, i in enumerate(complete) if i in held},
            )
    return CohortSummary(
        runs=runs,
        compared_runs=complete,
        missing_forks=missing,
        saved_forks=sum(saved_forks(list(outcomes[name])) for name in names),
        floor=floor,
        worlds=summaries,
        slices=slices,
        guard=guard,
        design=paths,
        unspent_forks=sum(row.count(UNSPENT) for name in names for row in outcomes[name]),
        unspent_runs=sum(
            1
            for i in range(runs)
            if any(UNSPENT in outcomes[n][i] for n in names)
            and not any(MISSING in outcomes[n][i] for n in names)
        ),
    )


def _by_design(judged: list[WorldJudgement], paths: list[DesignPath]) -> list[WorldJudgement]:
    """With a sequential design the verdicts are the design's (its stage-wise p, Holm
    across the worlds, its repeated interval), never a fixed test on the runs the design
    chose to run; the fixed comparison stays as the descriptive view."""
    by_world = {p.path.world: p for p in paths}
    out = []
    for j in judged:
        p = by_world.get(j.world)
        if p is None:  # a world that never reached a look (every run missing)
            out.append(j)
            continue
        update = {
            "verdict": p.verdict,
            "as_expected": p.as_expected,
            "holm_p": p.path.holm_p,
            "text": p.text,
        }
        out.append(j.model_copy(update=update))
    return out


def _cost(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:,.1f} {unit}"


def render_markdown(
    spec: CohortExperimentSpec,
    summary: CohortSummary,
    workflow_ids: Sequence[str],
    diff_command: Mapping[str, Mapping[int, str]],
) -> str:
    """The report as Markdown. ``workflow_ids[i]`` is run i's; ``diff_command[world][i]``
    the ``forklab diff`` command of run i's fork pair in that world."""
    floor = summary.floor
    k = spec.cohort.forks_per_world
    lines = [
        f"# {spec.id}: an experiment over {summary.runs} recorded runs",
        "",
        f"Hypothesis: {spec.hypothesis.text}",
        "",
        f"Each run forked at `{spec.cohort.fork_at.text}` into {len(spec.worlds)} worlds, "
        f"{k} forks per world; outcome by `{spec.cohort.outcome}`.",
        "",
        f"**Noise floor** (A/A flip rate of two baseline forks of a run): "
        f"{floor.flip_rate:.1%} [{floor.ci_low:.1%}, {floor.ci_high:.1%}] over "
        f"{floor.runs} runs.",
    ]
    if summary.saved_forks:
        lines += [
            "",
            f"{summary.saved_forks} forks were not run: their run's majority in their world "
            "was decided by the forks before them (the baseline runs every fork; the rate "
            "test reads every world's forks as voted).",
        ]
    if summary.missing_forks:
        left = summary.runs - len(summary.compared_runs) - summary.unspent_runs
        lines += [
            "",
            f"{summary.missing_forks} forks have no outcome; the {left} runs they belong to "
            "are left out of every comparison (never counted as failures).",
        ]
    lines += ["", "## Worlds", ""]
    lines += [f"- {w.describe()}" for w in spec.worlds]
    lines += _design_lines(spec, summary)
    lines += [
        "",
        "## Rescues and harms (majority of the k forks; rate: mean success-rate change)",
        "",
        *(
            [
                f"On the {len(summary.compared_runs)} runs every world ran, as a description; "
                "the verdicts are the sequential design's (above).",
                "",
            ]
            if summary.design
            else []
        ),
        "| world | role | rescued | harmed | unchanged | rate change | Holm p | verdict "
        "| as expected | tokens / rescue | seconds / rescue |",
        "|---|---|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    for w in summary.worlds:
        c = w.judgement.comparison
        lines.append(
            f"| {w.world} | {w.role.value} | {c.rescues} | {c.harms} | {c.unchanged} "
            f"| {c.rate_difference:+.1%} | {w.judgement.holm_p:.3g} "
            f"| {w.judgement.verdict.value.replace('_', ' ')} "
            f"| {'yes' if w.judgement.as_expected else 'no'} "
            f"| {_cost(w.cost_per_rescue_tokens, 'tokens')} "
            f"| {_cost(w.cost_per_rescue_seconds, 's')} |"
        )
    lines += ["", "## Verdicts against the noise floor", ""]
    lines += [f"- {w.judgement.text}" for w in summary.worlds]
    lines += _slice_lines(summary)
    for w in summary.worlds:
        if not (w.rescued or w.harmed):
            continue
        lines += ["", f"## {w.world}: the runs it changed", ""]
        for label, runs in (("rescued", w.rescued), ("harmed", w.harmed)):
            for i in runs:
                lines.append(f"- {label} {workflow_ids[i]}: `{diff_command[w.world][i]}`")
    return "\n".join(lines) + "\n"


def _design_lines(spec: CohortExperimentSpec, summary: CohortSummary) -> list[str]:
    """The sequential design: its waves, then each world's path (looks: runs, rescues and
    harms by majority, statistic, boundary, decision) and what its stop left unspent."""
    seq = spec.analysis.sequential
    if seq is None or not summary.design:
        return []
    lines = [
        "",
        "## Sequential design",
        "",
        f"{seq.method.value}, {seq.spending.value} α-spending, {seq.looks} looks, "
        f"α {spec.analysis.alpha}, futility below conditional power {seq.futility}; runs "
        f"in a seeded order (seed {spec.seed}), compared by the majority of their "
        f"{spec.cohort.forks_per_world} forks. {summary.unspent_forks} forks were not run: "
        "the design stopped their world before their run's wave (the baseline stops once "
        "every other world has).",
        "",
        "| world | look | runs | rescued | harmed | statistic | boundary | decision |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for d in summary.design:
        lines += [
            f"| {d.path.world} | {look.look} | {look.episodes} | {look.rescue} | {look.harm} "
            f"| {look.statistic:+.3f} | ±{look.boundary:.3f} | {look.decision.value} |"
            for look in d.path.looks
        ]
    lines += [
        "",
        "| world | stopped | runs | unspent forks | unspent tokens (est.) "
        "| unspent seconds (est.) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {d.path.world} | {d.path.stopped.value} | {d.path.episodes} | {d.unspent_forks} "
        f"| {d.unspent_tokens:,.0f} | {d.unspent_seconds:,.1f} |"
        for d in summary.design
    ]
    return lines


def _slice_lines(summary: CohortSummary) -> list[str]:
    """The slices by the pre-decision features, and the guard policy with its held-out
    validation."""
    if not summary.slices:
        return []
    lines = [
        "",
        "## Slices by the pre-decision features (majority of the k forks)",
        "",
        "| world | feature | value | runs | rescued | harmed | unchanged | rate change |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for world, slices in summary.slices.items():
        lines += [
            f"| {world} | {s.feature} | {feature_text(s.value)} | {s.n} | {s.rescue} "
            f"| {s.harm} | {s.unchanged} | {s.difference:+.1%} "
            f"[{s.ci_low:+.1%}, {s.ci_high:+.1%}] |"
            for s in slices
        ]
    g = summary.guard
    if g is not None:
        lines += [
            "",
            f"## Guard policy for {g.world}",
            "",
            f"Rule (learned on {g.training_before.runs} runs, basis {g.basis}): {g.words}.",
            "",
            "| runs | policy | runs applied | rescued | harmed | net |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for label, before, after in (
            ("training", g.training_before, g.training_after),
            ("held out", g.held_out_before, g.held_out_after),
        ):
            for policy, c in (("always", before), ("guarded", after)):
                lines.append(
                    f"| {label} ({c.runs}) | {policy} | {c.intervened} | {c.rescue} "
                    f"| {c.harm} | {c.net:+d} |"
                )
        lines += ["", f"Held-out validation: {g.validation}."]
    return lines
