"""The spec of an experiment over recorded agent runs: a ``cohort:`` instead of a workload.

Its worlds are interventions on forks of each run at its fork point (model swap, an
intervention descriptor the workflow reads, a prompt patch, tool policies, an override of
the decisive step, injected faults). It reuses the workload spec's hypothesis, approval
and analysis blocks and the same reading rules: strict types, one sentence naming the
field for anything wrong (``forklab.experiments.experiment.spec``).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Self

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic import Strict as StrictMode

from forklab.experiments.cohort.faults import Fault, describe_fault
from forklab.experiments.cohort.fork_point import ForkPoint
from forklab.experiments.experiment.spec import (
    MAX_SEED,
    MAX_WORLD_SECONDS,
    MAX_WORLDS,
    Analysis,
    Approval,
    ExperimentSpec,
    Hypothesis,
    Intervention,
    Role,
    RoleName,
    SpecError,
    Strict,
    check_world_names,
    check_world_references,
    load_spec_mapping,
    parse_spec,
    validation_message,
)
from forklab.experiments.runfork.overrides import MAX_OVERRIDE_BYTES
from forklab.experiments.runfork.policy import DEFAULT_KEY, ToolPolicy
from forklab.runtime.canon import canonical_json, digest

MAX_COHORT = 100_000
MAX_FORKS_PER_WORLD = 99
MAX_FORKS = 10_000_000
MAX_QUERY = 2000
#: What a run of the experiment's chain may hand the next through continue-as-new: the
#: spec and the outcome matrix grow with the cohort, and Temporal refuses a payload over
#: its limit (2 MB by default), which fails the workflow task for ever, mid-experiment.
#: Room is left for what ``carried_bytes`` does not count exactly.
MAX_CARRIED_BYTES = 1_500_000
#: The carried state beside the spec, the matrix and the looks (the rehearsal's
#: reference, the approval, costs, counters, the jobs set aside): under 2 KB measured.
CARRIED_STATE_BYTES = 16_000
#: A world's look in the carried state (its counts, statistic, boundary and decision).
CARRIED_LOOK_BYTES = 400
_NAME = 64
_CALLABLE = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_Lax = StrictMode(False)
PolicyName = Annotated[ToolPolicy, _Lax]
ToolName = Annotated[
    str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_*][A-Za-z0-9_.:-]*$")
]
ForkPointText = Annotated[ForkPoint, _Lax]


def _plain(text: str, what: str) -> str:
    if _CONTROL.search(text):
        raise ValueError(f"{what} holds a control character (a newline, a NUL); write one line")
    return text


class TeamEpisodes(Strict):
    """Make each run of the cohort stand for its team: the episode is the whole team,
    found from the run (the *requested member*) by the message edges its histories record
    (``forklab team``), forked at the consistent cut for the run's fork point as
    ``forklab fork-team`` forks it, and scored on the team's result."""

    result_member: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z_][A-Za-z0-9_.:-]*$",
        description="The workflow type of the member whose result is the team's result "
        "(exactly one member of each team must have it); default the requested member.",
    )
    max_members: int = Field(
        default=20, ge=1, le=100, description="A team with more members is excluded."
    )


class Cohort(Strict):
    """The recorded runs that are the experiment's episodes, and where to fork each."""

    query: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_QUERY,
        description="A Temporal visibility query, e.g. WorkflowType='SupportAgent'.",
    )
    workflow_ids: list[Annotated[str, Field(min_length=1, max_length=1000)]] | None = Field(
        default=None, min_length=1, max_length=MAX_COHORT
    )
    limit: int = Field(default=1000, ge=1, le=MAX_COHORT)
    fork_at: ForkPointText
    fork_at_succeeded: ForkPointText | None = Field(
        default=None,
        description="The fork point of runs with no failed step, when fork_at needs one "
        "(failed, last_model_call_before_failure); without it such runs are excluded.",
    )
    forks_per_world: int = Field(default=3, ge=3, le=MAX_FORKS_PER_WORLD)
    stop_when_decided: bool = Field(
        default=False,
        description="Stop forking a run in a non-baseline world once the majority of its "
        "forks_per_world forks is decided (the baseline runs every fork: it measures the "
        "noise floor); the rate test then reads every world's votes.",
    )
    outcome: str = Field(
        pattern=_CALLABLE, max_length=200, description="'module:function' scoring a fork."
    )
    success_threshold: float = Field(
        default=0.5, gt=0, le=1, description="A score at or above this is a success."
    )
    features: str | None = Field(
        default=None,
        pattern=_CALLABLE,
        max_length=200,
        description="'module:function' over the inherited steps at the fork point.",
    )
    holdout_share: float = Field(
        default=0.3,
        ge=0.1,
        le=0.5,
        description="The share of the compared runs held out to validate the guard "
        "policy (learned on the others); chosen by the seed and the workflow ids alone.",
    )
    team: TeamEpisodes | None = Field(
        default=None,
        description="Fork each run's whole team, not the run alone (the query or ids name "
        "the requested members).",
    )

    @field_validator("query")
    @classmethod
    def _one_line_query(cls, query: str | None) -> str | None:
        return None if query is None else _plain(query, "the query")

    @field_validator("workflow_ids")
    @classmethod
    def _unique_ids(cls, ids: list[str] | None) -> list[str] | None:
        if ids is None:
            return None
        for wid in ids:
            _plain(wid, f"workflow id {wid[:40]!r}")
        seen: set[str] = set()
        dupes = sorted({w for w in ids if w in seen or seen.add(w)})  # type: ignore[func-returns-value]
        if dupes:
            raise ValueError(f"workflow ids must be unique; repeated: {', '.join(dupes[:5])}")
        return ids

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.query is None) == (self.workflow_ids is None):
            raise ValueError("name either a visibility 'query' or 'workflow_ids', not both")
        if self.workflow_ids is not None and len(self.workflow_ids) > self.limit:
            raise ValueError(
                f"lists {len(self.workflow_ids)} workflow ids, over its limit {self.limit}"
            )
        if self.forks_per_world % 2 == 0:
            raise ValueError("forks_per_world must be odd so a run's majority cannot tie")
        if self.fork_at_succeeded is not None and self.fork_at_succeeded.kind.value in (
            "failed",
            "last_model_call_before_failure",
        ):
            raise ValueError("fork_at_succeeded: a run without a failed step has no such point")
        return self


class PatchTarget(StrEnum):
    """Which instructions of the model calls from the fork point on a patch changes."""

    system = "system"
    tool_instructions = "tool_instructions"


class PatchMode(StrEnum):
    append = "append"
    prepend = "prepend"
    #: the whole instructions become ``text`` (``replace`` would shadow ``str.replace``)
    instead = "replace"


class PromptPatch(Strict):
    target: Annotated[PatchTarget, _Lax] = PatchTarget.system
    mode: Annotated[PatchMode, _Lax] = PatchMode.append
    text: str = Field(min_length=1, max_length=8000)
    #: for tool_instructions: the tools whose descriptions change (empty: all)
    tools: list[ToolName] = Field(default_factory=list, max_length=100)


class OverridePart(StrEnum):
    result = "result"
    input = "input"


class Override(Strict):
    """Replace the recorded result (or input) of the decisive step with ``value``: the
    run-fork half's ``--override-result`` (the fork inherits the decisive step with this
    result and continues after it) or ``--override-input`` (the decisive step runs live
    with this as its first argument)."""

    part: Annotated[OverridePart, _Lax] = OverridePart.result
    value: Any

    @field_validator("value")
    @classmethod
    def _small_json(cls, value: Any) -> Any:
        try:
            size = len(canonical_json(value).encode())
        except (TypeError, ValueError):
            raise ValueError("the value must be JSON (finite numbers, text keys)") from None
        if size > MAX_OVERRIDE_BYTES:
            raise ValueError(
                f"the value is {size} bytes of JSON; keep it under {MAX_OVERRIDE_BYTES} "
                "(it travels in the fork's memo)"
            )
        return value

    def describe(self) -> str:
        text = canonical_json(self.value)
        shown = text if len(text) <= 40 else text[:39] + "…"
        return f"override the decisive step's {self.part.value} with {shown}"


class ForkWorld(Strict):
    name: str = Field(min_length=1, max_length=_NAME, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    role: RoleName
    model: str | None = Field(default=None, min_length=1, max_length=200)
    intervention: Intervention | None = None
    prompt_patch: PromptPatch | None = None
    tool_policies: dict[ToolName, PolicyName] = Field(default_factory=dict, max_length=200)
    override: Override | None = None
    faults: list[Fault] = Field(default_factory=list, max_length=20)

    def changes(self) -> list[str]:
        """The kinds of change this world makes, in a fixed order."""
        named = {
            "model": self.model is not None,
            "intervention": self.intervention is not None,
            "prompt_patch": self.prompt_patch is not None,
            "tool_policies": bool(self.tool_policies),
            "override": self.override is not None,
            "faults": bool(self.faults),
        }
        return [k for k, v in named.items() if v]

    @model_validator(mode="after")
    def _changes_match_role(self) -> Self:
        changes = self.changes()
        if self.role is Role.baseline and changes:
            raise ValueError(
                f"the baseline is the unchanged fork (an A/A world); remove {', '.join(changes)}"
            )
        if self.role is Role.placebo and (
            not changes or set(changes) - {"prompt_patch", "intervention"}
        ):
            raise ValueError(
                "a placebo is an inert change: a prompt_patch or an intervention descriptor only"
            )
        if self.role is Role.positive_control and not self.faults:
            raise ValueError("a positive control is a fault known to harm; give it 'faults'")
        if self.role is Role.treatment and not changes:
            raise ValueError(
                "a treatment changes something: model, intervention, prompt_patch, "
                "tool_policies, override or faults"
            )
        return self

    def describe(self) -> str:
        """The world in one line, for the report."""
        if not self.changes():
            return f"{self.name} ({self.role.value}): the unchanged fork, continued live"
        parts: list[str] = []
        if self.model is not None:
            parts.append(f"model {self.model} from the fork point")
        if self.intervention is not None:
            parts.append(f"intervention {self.intervention.name}")
        if self.prompt_patch is not None:
            p = self.prompt_patch
            text = p.text if len(p.text) <= 40 else p.text[:39] + "…"
            parts.append(f"{p.mode.value} {p.target.value} {text!r}")
        if self.tool_policies:
            parts.append(
                "tools "
                + ", ".join(f"{t}={v.value}" for t, v in sorted(self.tool_policies.items()))
            )
        if self.override is not None:
            parts.append(self.override.describe())
        parts += [describe_fault(f) for f in self.faults]
        return f"{self.name} ({self.role.value}): " + "; ".join(parts)


class CohortBudget(Strict):
    """Hard caps, estimated in the plan from the cohort's own recorded steps."""

    max_forks: int = Field(default=10_000, ge=1, le=MAX_FORKS)
    max_model_tokens: int = Field(default=10_000_000, ge=1, le=10**12)
    max_world_seconds: float = Field(default=36_000.0, gt=0, le=MAX_WORLD_SECONDS)
    max_concurrent_forks: int = Field(default=8, ge=1, le=1000)


class CohortExperimentSpec(Strict):
    id: str = Field(min_length=1, max_length=80, pattern=r"^[a-z0-9][a-z0-9-]*$")
    hypothesis: Hypothesis
    seed: int = Field(ge=0, le=MAX_SEED, description="Seeds every model call and fault.")
    cohort: Cohort
    worlds: list[ForkWorld] = Field(min_length=2, max_length=MAX_WORLDS)
    tools: dict[ToolName, PolicyName] = Field(
        default_factory=dict,
        validate_default=True,
        max_length=500,
        description="Policies of the cohort's tools on every fork; '*' (default block) "
        "covers the rest. The approver signs this list.",
    )
    budget: CohortBudget = Field(default_factory=CohortBudget)
    approval: Approval = Field(default_factory=Approval)
    analysis: Analysis = Field(default_factory=Analysis)

    @field_validator("tools")
    @classmethod
    def _default_block(cls, tools: dict[str, ToolPolicy]) -> dict[str, ToolPolicy]:
        return {DEFAULT_KEY: ToolPolicy.block, **tools}

    @field_validator("worlds")
    @classmethod
    def _one_baseline_unique_names(cls, worlds: list[ForkWorld]) -> list[ForkWorld]:
        return check_world_names(worlds)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        check_world_references(self.worlds, self.hypothesis, self.analysis)
        if self.analysis.guard.holdout_episodes:
            raise ValueError(
                "analysis.guard.holdout_episodes: a cohort holds out a share of its own "
                "runs to validate the guard; set cohort.holdout_share instead"
            )
        gated = self.analysis.guard.world
        if gated is not None and not any(
            w.name == gated and w.role is Role.treatment for w in self.worlds
        ):
            raise ValueError(f"analysis.guard.world: {gated!r} is not a treatment of the spec")
        if self.analysis.forks_per_checkpoint != 1:
            raise ValueError(
                "analysis.forks_per_checkpoint: a cohort sets its forks with "
                "cohort.forks_per_world; remove it"
            )
        self._check_design()
        self._check_carry()
        for i, world in enumerate(self.worlds):
            for tool, policy in world.tool_policies.items():
                if policy is ToolPolicy.live and self.policy(tool) is not ToolPolicy.live:
                    raise ValueError(
                        f"worlds[{i}].tool_policies: {tool!r} may run live only if the "
                        "experiment's signed 'tools' list makes it live"
                    )
        upper = self.cohort.limit * len(self.worlds) * self.cohort.forks_per_world
        if upper > self.budget.max_forks:
            raise ValueError(
                f"budget.max_forks: the cohort's limit allows up to {upper} forks "
                f"({self.cohort.limit} runs x {len(self.worlds)} worlds x "
                f"{self.cohort.forks_per_world}), over {self.budget.max_forks}; lower "
                "cohort.limit or raise the budget"
            )
        return self

    def carried_bytes(self) -> int:
        """An upper bound on what a run of the experiment's chain carries into the next:
        the spec's JSON, every run's outcomes in every world (one character a fork, in a
        JSON string), a sequential design's looks, and the rest of the state."""
        seq = self.analysis.sequential
        looks = seq.looks * len(self.worlds) * CARRIED_LOOK_BYTES if seq is not None else 0
        per_world = self._runs() * (self.cohort.forks_per_world + 3) + 2 * _NAME
        matrix = len(self.worlds) * per_world
        return len(self.model_dump_json()) + matrix + looks + CARRIED_STATE_BYTES

    def _runs(self) -> int:
        """The runs the cohort holds at most: the ids it names, or its query's limit."""
        ids = self.cohort.workflow_ids
        return len(ids) if ids is not None else self.cohort.limit

    def _check_carry(self) -> None:
        """A cohort whose state would not fit a continue-as-new is refused before it
        starts, not when its first run of the chain ends."""
        carried = self.carried_bytes()
        if carried <= MAX_CARRIED_BYTES:
            return
        ids = self.cohort.workflow_ids
        field = "cohort.workflow_ids" if ids is not None else "cohort.limit"
        raise ValueError(
            f"{field}: {self._runs()} runs x {len(self.worlds)} worlds x "
            f"{self.cohort.forks_per_world} forks would carry about {carried / 1e6:.1f} MB "
            f"through each continue-as-new (the spec and the outcome of every fork), over "
            f"the {MAX_CARRIED_BYTES / 1e6:.1f} MB an experiment may carry under Temporal's "
            "2 MB payload limit; "
            + (
                "split the cohort into several experiments, or name it by a query"
                if ids is not None
                else "lower cohort.limit and split the cohort into several experiments"
            )
        )

    def _check_design(self) -> None:
        """A sequential design's waves are waves of runs: one run a wave at least."""
        seq = self.analysis.sequential
        if seq is None:
            return
        ids = self.cohort.workflow_ids
        runs = len(ids) if ids is not None else self.cohort.limit
        if seq.looks > runs:
            raise ValueError(
                f"analysis.sequential.looks: {seq.looks} looks need at least as many runs, and "
                f"the cohort has at most {runs}; lower looks or raise cohort.limit"
            )

    def policy(self, tool: str) -> ToolPolicy:
        """The experiment's policy for ``tool`` (its own entry, else the ``*`` default)."""
        return self.tools.get(tool, self.tools[DEFAULT_KEY])

    @property
    def baseline(self) -> ForkWorld:
        return next(w for w in self.worlds if w.role is Role.baseline)

    def canonical(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def digest(self) -> str:
        return digest(self.canonical())


def parse_cohort_spec(text: str, source: str) -> CohortExperimentSpec:
    """Parse YAML or JSON text into a cohort spec; raise ``SpecError`` with one line."""
    raw = load_spec_mapping(text, source)
    if "workload" in raw:
        raise SpecError(f"{source}: field workload: a spec names a workload or a cohort, not both")
    try:
        spec = CohortExperimentSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(validation_message(exc, source, CohortExperimentSpec)) from None
    return spec


def parse_any_spec(text: str, source: str) -> ExperimentSpec | CohortExperimentSpec:
    """A workload spec or, when it names a ``cohort:``, a cohort spec."""
    raw = load_spec_mapping(text, source)
    if "cohort" in raw and "workload" not in raw:
        return parse_cohort_spec(text, source)
    return parse_spec(text, source)


__all__ = [
    "Cohort",
    "CohortBudget",
    "CohortExperimentSpec",
    "ForkWorld",
    "Override",
    "PromptPatch",
    "TeamEpisodes",
    "parse_any_spec",
    "parse_cohort_spec",
]
