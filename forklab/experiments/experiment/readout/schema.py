"""The structured answer a model must give (``response_format``), bounded in size.

There is no field for asking anything: a readout can only describe the packet."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class ReadoutVerdict(StrEnum):
    supported = "supported"
    refuted = "refuted"
    inconclusive = "inconclusive"
    invalid = "invalid"


class Finding(BaseModel):
    model_config = ConfigDict(extra="forbid")

    world: str = Field(max_length=80, description="A world name exactly as in the packet.")
    verdict: ReadoutVerdict = Field(description="That world's verdict exactly as in the packet.")
    statement: str = Field(max_length=400, description="One sentence; numbers from the packet.")


class ModelReadout(BaseModel):
    model_config = ConfigDict(extra="forbid")

    summary: str = Field(max_length=1200, description="Three sentences at most.")
    findings: list[Finding] = Field(max_length=16)
    caveats: list[str] = Field(default_factory=list, max_length=6)


class ReadoutSource(StrEnum):
    model = "model"
    deterministic = "deterministic"


class ShownReadout(BaseModel):
    """The readout the report shows, where it came from and why that one."""

    model_config = ConfigDict(extra="forbid")

    source: ReadoutSource
    why: str
    model: str | None = None
    readout: ModelReadout
    problems: list[str] = Field(default_factory=list)
