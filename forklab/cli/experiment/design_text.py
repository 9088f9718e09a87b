"""A cohort's sequential design in words, as ``forklab plan`` and ``forklab cohort status``
show it to the approver (no numpy: ``forklab cohort status`` starts fast)."""

from __future__ import annotations

from forklab.contracts.cohort import PlannedDesign


def design_text(d: PlannedDesign) -> list[str]:
    """The design in two lines: its waves and boundaries, and the expected saving."""
    bounds = ", ".join(f"±{c:.3f}" for c in d.bounds)
    return [
        f"sequential design (signed with the spec): {d.spending.value} spending, looks after "
        f"runs {', '.join(map(str, d.wave_ends))} (seeded order); boundaries {bounds}",
        f"expected compute saved: {d.saved_if_inert:.0%} of the forks "
        f"[{d.saved_if_inert_low:.0%}, {d.saved_if_inert_high:.0%}] if every world is inert, "
        f"{d.saved_if_effect:.0%} [{d.saved_if_effect_low:.0%}, {d.saved_if_effect_high:.0%}] "
        "if every world moves as expected by the effect the design is powered for",
    ]
