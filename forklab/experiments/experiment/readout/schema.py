"""The structured answer a model must give (``response_format``), bounded in size, and the
readout the report shows.

A model answers with *claims* only: for each judged world, the direction its failure rate
moved against the baseline, its verdict, and the packet figures it means to cite (with the
values it read). It writes no prose: every sentence the report shows is written by
``forklab.experiments.experiment.readout.write`` from checked claims and the packet's own
values, so no wording (a synonym, a paraphrase, a number in words, markup) can carry a
claim the check did not see. There is no field for asking anything either.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class ReadoutVerdict(StrEnum):
    supported = "supported"
    refuted = "refuted"
    inconclusive = "inconclusive"
    invalid = "invalid"


class ReadoutDirection(StrEnum):
    """Which way a world's *failure rate* moved against the baseline, as its interval
    says: wholly below zero change, wholly above, or crossing it."""

    lowered = "lowered"
    raised = "raised"
    no_clear_change = "no_clear_change"


class FigureName(StrEnum):
    """The packet figures a claim may cite: the world's own, and its comparison with the
    baseline (``difference`` is of the success rate, as in the packet)."""

    failure_rate = "failure_rate"
    failures = "failures"
    episodes = "episodes"
    rescue = "rescue"
    harm = "harm"
    net = "net"
    difference = "difference"
    ci_low = "ci_low"
    ci_high = "ci_high"
    holm_p = "holm_p"


class Figure(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: FigureName
    value: float = Field(
        strict=True, allow_inf_nan=False, description="The value exactly as in the packet."
    )


class Claim(BaseModel):
    model_config = ConfigDict(extra="forbid")

    world: str = Field(max_length=80, description="A judged world's name exactly as in the packet.")
    direction: ReadoutDirection = Field(description="Its failure rate against the baseline.")
    verdict: ReadoutVerdict = Field(description="That world's verdict exactly as in the packet.")
    figures: list[Figure] = Field(max_length=len(FigureName), description="The figures to cite.")


class ModelReadout(BaseModel):
    """One claim per judged world, in the order the readout should give them."""

    model_config = ConfigDict(extra="forbid")

    claims: list[Claim] = Field(max_length=32)


class Finding(BaseModel):
    """One world's sentence of the shown readout (written by ForkLab, never by a model)."""

    model_config = ConfigDict(extra="forbid")

    world: str
    verdict: ReadoutVerdict
    statement: str


class WrittenReadout(BaseModel):
    """The readout's prose: a summary, one finding per claim, caveats."""

    model_config = ConfigDict(extra="forbid")

    summary: str
    findings: list[Finding]
    caveats: list[str] = Field(default_factory=list)


class ReadoutSource(StrEnum):
    model = "model"
    deterministic = "deterministic"


class ShownReadout(BaseModel):
    """The readout the report shows, where its claims came from and why those."""

    model_config = ConfigDict(extra="forbid")

    source: ReadoutSource
    why: str
    model: str | None = None
    readout: WrittenReadout
    problems: list[str] = Field(default_factory=list)
