"""The sequential design's section in words, shared by the text and Markdown renderings:
the design as signed, each world's path and where it stopped, and the compute saved."""

from __future__ import annotations

from forklab.experiments.experiment.sequential import SequentialReport, WorldPath
from forklab.experiments.experiment.waves import Decision

_WHY = {
    Decision.efficacy: "stopped for efficacy",
    Decision.futility: "stopped for futility",
    Decision.check_decided: "stopped: its check is decided (first discordant pair)",
    Decision.completed: "ran every episode (no boundary crossed)",
    Decision.continue_: "still running",
}


def design_line(s: SequentialReport) -> str:
    d = s.design
    futility = f"futility below {d.futility:g} conditional power" if d.futility else "no futility"
    return (
        f"{d.method.value}, {d.spending.value} spending, {len(d.wave_ends)} looks at episodes "
        f"{', '.join(str(e) for e in d.wave_ends)}, α {d.alpha:g}, {futility}"
    )


def path_line(p: WorldPath) -> str:
    last = p.looks[-1]
    steps = " → ".join(f"{lk.statistic:+.2f}/{lk.boundary:.2f}" for lk in p.looks)
    return (
        f"{p.world}: {p.verdict.value.upper()}, {_WHY[p.stopped]} at look {last.look} "
        f"({p.episodes} episodes, "
        f"rescue {last.rescue}, harm {last.harm}); Z/boundary {steps}; p {p.p_value:.3g} "
        f"(Holm {p.holm_p:.3g}), "
        f"repeated CI [{p.ci_low:+.3f}, {p.ci_high:+.3f}]; {p.unspent_episodes} episodes unspent"
    )


def saving_line(s: SequentialReport) -> str:
    expected = ""
    if s.expected_saved_fraction is not None:
        expected = (
            f"; expected over experiments like this one: {s.expected_saved_fraction:.1%} "
            f"saved (90% of them {s.expected_saved_low:.1%} to {s.expected_saved_high:.1%})"
        )
    return (
        f"compute: {s.sequential_world_episodes} of {s.fixed_world_episodes} world-episodes "
        f"on these episodes ({s.saved_fraction:.1%} saved, {s.unspent_world_episodes} "
        f"unspent){expected}; the baseline runs {s.baseline_episodes} episodes, as long as "
        "any world runs"
    )


def sequential_lines(s: SequentialReport) -> list[str]:
    return [design_line(s), *(path_line(p) for p in s.worlds), saving_line(s)]
