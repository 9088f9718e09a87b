"""The scorer of the example research pipeline: a report passes when every section is
substantive. Deterministic, so a fork's verdict depends only on its sections."""

from __future__ import annotations

PIPELINE = ("research", "insights", "risks", "recommendations", "summary")
#: A section shorter than this (in words), or marked as a draft, fails the report.
MIN_WORDS = 8


def score_sections(sections: dict[str, str]) -> float:
    """Share of the pipeline's sections that are substantive, in [0, 1]."""
    good = 0
    for name in PIPELINE:
        text = sections.get(name, "")
        if len(text.split()) >= MIN_WORDS and not text.lower().startswith("draft"):
            good += 1
    return good / len(PIPELINE)


def passes(score: float) -> bool:
    return score >= 1.0
