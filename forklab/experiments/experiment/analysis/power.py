"""Power in the plan: how many episodes the pre-registered effects need.

The rehearsal runs the very episodes the experiment will run, so its discordance rates
(harms / n and rescues / n against the baseline) are the planning estimates. From them
the exact McNemar test's sample size at the spec's α and power says how many episodes
would detect an effect of that size; a spec with fewer is underpowered, and the plan
says so with the number it would need.
"""

from __future__ import annotations

from pydantic import BaseModel

from forklab.experiments.experiment.spec import Direction
from forklab.experiments.experiment.stats import mcnemar_sample_size


class PowerRow(BaseModel):
    world: str
    vs: str
    expected: Direction
    harm_rate: float
    rescue_rate: float
    episodes: int
    needed: int | None
    underpowered: bool
    against_expected: bool
    note: str


class PowerAnalysis(BaseModel):
    alpha: float
    power: float
    rows: list[PowerRow]
    warnings: list[str]


def power_row(
    world: str,
    vs: str,
    expected: Direction,
    harm: int,
    rescue: int,
    episodes: int,
    alpha: float,
    power: float,
) -> PowerRow:
    p10, p01 = harm / episodes, rescue / episodes
    needed = mcnemar_sample_size(p10, p01, alpha, power)
    against = (expected is Direction.decrease and rescue < harm) or (
        expected is Direction.increase and harm < rescue
    )
    if needed is None:
        note = "the rehearsal shows no net effect (rescues = harms): no sample size detects it"
        under = True
    else:
        under = needed > episodes
        size = f"{needed} episodes detect a net effect of {rescue - harm:+d} per {episodes}"
        note = f"underpowered: {size}" if under else f"powered: {size}"
    if against:
        note += f"; the rehearsal points against the pre-registered {expected.value}"
    return PowerRow(
        world=world,
        vs=vs,
        expected=expected,
        harm_rate=round(p10, 6),
        rescue_rate=round(p01, 6),
        episodes=episodes,
        needed=needed,
        underpowered=under,
        against_expected=against,
        note=note,
    )


def power_warnings(rows: list[PowerRow], alpha: float, power: float) -> list[str]:
    out = []
    for r in rows:
        if not r.underpowered:
            continue
        if r.needed is None:
            out.append(
                f"{r.world}: the rehearsal shows no difference from {r.vs}; the expected "
                f"{r.expected.value} cannot be detected at any number of episodes"
            )
        elif r.against_expected:
            out.append(
                f"{r.world}: the rehearsal points against the pre-registered "
                f"{r.expected.value}; an effect of its size needs {r.needed} episodes to show "
                f"at α = {alpha:g} with power {power:g} (the spec has {r.episodes})"
            )
        else:
            out.append(
                f"{r.world}: underpowered with {r.episodes} episodes; detecting its rehearsed "
                f"effect at α = {alpha:g} with power {power:g} needs {r.needed} episodes "
                "(set 'episodes' to at least that)"
            )
    return out
