"""The pre-registered experiment spec (pydantic), parsed from YAML or JSON text."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Any, Protocol, Self, TypeVar, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic import Strict as StrictMode

from forklab.runtime.canon import digest
from forklab.runtime.contract import ContractViolation, feature_kinds, from_exception
from forklab.runtime.runner import workload_class
from forklab.runtime.strict_json import StrictJsonError, check_finite
from forklab.runtime.workload import Workload, WorkloadError


class SpecError(ValueError):
    """A spec that cannot be run. The message names the file, the field and the fix."""


class Role(StrEnum):
    baseline = "baseline"
    treatment = "treatment"
    placebo = "placebo"
    positive_control = "positive_control"


class Direction(StrEnum):
    """Expected change of a world's failure rate against the baseline."""

    decrease = "decrease"
    increase = "increase"
    none = "none"


#: A spec file larger than this is refused unread (a spec is a few kilobytes).
MAX_SPEC_BYTES = 256 * 1024
#: Mappings and lists nested deeper than this are refused before they are built.
MAX_DEPTH = 20
#: Bounds the workflow can honour (see docs/security.md).
MAX_SEED = 2**63 - 1
MAX_EPISODES = 10_000_000
MAX_WORLD_SECONDS = 10_000_000.0
MAX_SANDBOXES = 1000
MAX_EXPIRY_MINUTES = 7 * 24 * 60
MAX_FORKS = 99
MAX_HOLDOUT = 1_000_000
MAX_WORLDS = 32
#: Looks of a sequential design (each look is one wave of episodes and one decision).
MAX_LOOKS = 50
_NAME = 64


class Strict(BaseModel):
    """Strict mode: no coercion. An integer field refuses ``true`` and ``"300"``, a float
    field refuses ``true`` and ``"0.5"`` (it takes an integer: ``budget: 300``), a boolean
    refuses ``"false"`` and ``0``: the spec says what it means, or it is refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


#: Strict mode reads a spec parsed from YAML (Python objects) more strictly than JSON: it
#: would refuse the string ``baseline`` for an Enum and a list for a tuple. These fields
#: read those leniently; a string is still no number and a number no string.
_Lax = StrictMode(False)
RoleName = Annotated[Role, _Lax]
DirectionName = Annotated[Direction, _Lax]
FeaturePair = Annotated[tuple[StrictStr, StrictStr], _Lax]


class Hypothesis(Strict):
    text: str = Field(min_length=1, max_length=2000)
    expected: dict[str, DirectionName] = Field(
        default_factory=dict,
        description="Per world name: the expected direction of its failure rate vs baseline.",
    )


class WorkloadRef(Strict):
    name: str = Field(
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(:[A-Za-z_][A-Za-z0-9_]*)?$",
        description="A built-in workload name or an import path 'module:attribute'.",
    )
    params: dict[str, Any] = Field(default_factory=dict)


class Intervention(Strict):
    name: str = Field(min_length=1, max_length=_NAME)
    params: dict[str, Any] = Field(default_factory=dict)


class World(Strict):
    name: str = Field(min_length=1, max_length=_NAME, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    role: RoleName
    intervention: Intervention | None = None

    @model_validator(mode="after")
    def _intervention_matches_role(self) -> Self:
        if self.role is Role.baseline and self.intervention is not None:
            raise ValueError("the baseline world takes no intervention; remove 'intervention'")
        if self.role is not Role.baseline and self.intervention is None:
            raise ValueError(f"a {self.role.value} world needs an 'intervention'")
        return self


class Budget(Strict):
    max_world_seconds: float = Field(
        default=3600.0,
        gt=0,
        le=MAX_WORLD_SECONDS,
        description="Hard cap on sandbox compute, in world-seconds.",
    )
    max_concurrent_sandboxes: int = Field(default=4, ge=1, le=MAX_SANDBOXES)
    safety_factor: float = Field(
        default=3.0, ge=1.0, le=100.0, description="Rehearsed world-seconds are multiplied by this."
    )


class Approval(Strict):
    required: bool = Field(
        default=True,
        description="false asks to skip approval; the worker's policy decides "
        "(FORKLAB_ALLOW_UNAPPROVED, default never).",
    )
    expiry_minutes: float = Field(default=60.0, gt=0, le=MAX_EXPIRY_MINUTES)


class Comparison(Strict):
    world: str = Field(max_length=_NAME)
    vs: str = Field(max_length=_NAME)


class Guard(Strict):
    """How the guard policy is learned and validated (see docs/analysis.md)."""

    world: str | None = Field(
        default=None,
        max_length=_NAME,
        description="The treatment the guard gates (default: the first treatment).",
    )
    harm_cap: int | None = Field(
        default=None,
        ge=0,
        le=MAX_EPISODES,
        description="Max harms on the training set in the slices the rule fires on; "
        "null means no slice may have more harms than rescues.",
    )
    holdout_episodes: int = Field(
        default=0,
        ge=0,
        le=MAX_HOLDOUT,
        description="Fresh episodes (after the spec's) for validating the guard rule; "
        "0, the default, means as many as the spec has.",
    )


class SequentialMethod(StrEnum):
    """How a sequential design decides after each wave (see docs/analysis.md)."""

    #: Lan–DeMets α-spending boundaries on each world's paired score statistic.
    group_sequential = "group_sequential"


class Spending(StrEnum):
    """The α-spending function of a group-sequential design."""

    obrien_fleming = "obrien_fleming"
    pocock = "pocock"


class Sequential(Strict):
    """A pre-registered sequential design: the episodes run in ``looks`` equal waves and
    after each wave every world stops for efficacy, for futility or continues. The
    maximum is ``episodes`` (the budget), α and power are ``analysis.alpha``/``power``."""

    method: Annotated[SequentialMethod, _Lax] = SequentialMethod.group_sequential
    spending: Annotated[Spending, _Lax] = Field(
        default=Spending.obrien_fleming,
        description="obrien_fleming spends little α early (the last look stays near the "
        "fixed design); pocock spends it evenly (earlier stops, a costlier last look).",
    )
    looks: int = Field(
        default=8, ge=2, le=MAX_LOOKS, description="Waves of episodes, one decision after each."
    )
    futility: float = Field(
        default=0.005,
        ge=0.0,
        lt=0.5,
        description="Stop a treatment once its conditional power under the current trend "
        "is below this (non-binding, so α holds); 0 never stops for futility. The defaults "
        "are those docs/benchmarks/sequential.md measured to keep the fixed design's power.",
    )


class Analysis(Strict):
    comparisons: list[Comparison] = Field(
        default_factory=list,
        max_length=100,
        description="Extra pairs beyond each world against the baseline.",
    )
    quantile_bins: int = Field(
        default=4, ge=2, le=20, description="Numeric features are sliced into this many quantiles."
    )
    interactions: list[FeaturePair] = Field(
        default_factory=list, max_length=100, description="Pairs of features to slice jointly."
    )
    forks_per_checkpoint: int = Field(
        default=1,
        ge=1,
        le=MAX_FORKS,
        description="Replicates per checkpoint and world; odd (majority vote).",
    )
    alpha: float = Field(default=0.05, gt=0, lt=1, description="Significance level.")
    power: float = Field(default=0.8, gt=0, lt=1, description="Power for the episode count.")
    guard: Guard = Field(default_factory=Guard)
    sequential: Sequential | None = Field(
        default=None,
        description="A sequential design (waves and early stops); null runs every world "
        "over every episode.",
    )

    @model_validator(mode="after")
    def _odd_forks(self) -> Self:
        if self.forks_per_checkpoint % 2 == 0:
            raise ValueError("forks_per_checkpoint must be odd so a majority vote cannot tie")
        return self

    @field_validator("interactions")
    @classmethod
    def _two_features(cls, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        for a, b in pairs:
            if a == b:
                raise ValueError(f"the pair ({a}, {b}) must name two different features")
        return pairs


class ExperimentSpec(Strict):
    id: str = Field(min_length=1, max_length=80, pattern=r"^[a-z0-9][a-z0-9-]*$")
    hypothesis: Hypothesis
    seed: int = Field(ge=0, le=MAX_SEED, description="Episode i uses the integer seed `seed + i`.")
    episodes: int = Field(ge=1, le=MAX_EPISODES)
    workload: WorkloadRef
    worlds: list[World] = Field(min_length=2, max_length=MAX_WORLDS)
    budget: Budget = Field(default_factory=Budget)
    approval: Approval = Field(default_factory=Approval)
    analysis: Analysis = Field(default_factory=Analysis)

    @field_validator("worlds")
    @classmethod
    def _one_baseline_unique_names(cls, worlds: list[World]) -> list[World]:
        return check_world_names(worlds)

    @model_validator(mode="after")
    def _references_known_worlds(self) -> Self:
        # Messages start with the field they concern; parse_spec reports it as the field.
        check_world_references(self.worlds, self.hypothesis, self.analysis)
        known = {w.name for w in self.worlds}
        design = self.analysis.sequential
        if design is not None and design.looks > self.episodes:
            raise ValueError(
                f"analysis.sequential.looks: {design.looks} looks need at least as many "
                f"episodes (the spec has {self.episodes}); lower looks or raise episodes"
            )
        guard_world = self.analysis.guard.world
        if guard_world is not None and guard_world not in known:
            raise ValueError(f"analysis.guard.world: names unknown world {guard_world!r}")
        if guard_world is not None and guard_world == self.baseline.name:
            raise ValueError(
                "analysis.guard.world: the guard gates an intervention; name a non-baseline world"
            )
        return self

    @property
    def baseline(self) -> World:
        return next(w for w in self.worlds if w.role is Role.baseline)

    def canonical(self) -> dict[str, Any]:
        """The spec as the fingerprint signs it. A spec without a sequential design dumps
        without the key, so the fingerprints of specs written before designs existed stay
        what their approvers signed; a design, once declared, is signed with the rest."""
        if self.analysis.sequential is None:
            return self.model_dump(mode="json", exclude={"analysis": {"sequential"}})
        return self.model_dump(mode="json")

    def digest(self) -> str:
        return digest(self.canonical())


class _NamedWorld(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def role(self) -> Role: ...


_W = TypeVar("_W", bound=_NamedWorld)


def check_world_names(worlds: list[_W]) -> list[_W]:
    """Exactly one baseline and unique names: both spec kinds pair every world with it."""
    baselines = [w.name for w in worlds if w.role is Role.baseline]
    if len(baselines) != 1:
        raise ValueError(
            f"exactly one world must have role 'baseline' (found {len(baselines)}: "
            f"{', '.join(baselines) or 'none'})"
        )
    names = [w.name for w in worlds]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"world names must be unique; repeated: {', '.join(dupes)}")
    return worlds


def check_world_references(
    worlds: Sequence[_NamedWorld], hypothesis: Hypothesis, analysis: Analysis
) -> None:
    """The hypothesis and the comparisons name only worlds the spec declares."""
    known = {w.name for w in worlds}
    for name in hypothesis.expected:
        if name not in known:
            raise ValueError(f"hypothesis.expected: names unknown world {name!r}")
    for comp in analysis.comparisons:
        for name in (comp.world, comp.vs):
            if name not in known:
                raise ValueError(f"analysis.comparisons: names unknown world {name!r}")


def _did_you_mean(loc: tuple[int | str, ...], root: type[BaseModel]) -> str:
    """``; did you mean X?`` for an unknown key at ``loc``, from the fields its model has
    (followed through nested models, lists and optionals); empty when none is close."""
    model: Any = root
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        fields = getattr(model, "model_fields", {})
        if part not in fields:
            return ""
        model = _model_in(fields[part].annotation)
        if model is None:
            return ""
    known = list(getattr(model, "model_fields", {}))
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]}?"
    return f"; the fields here are {', '.join(known)}" if known else ""


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (``M``, ``list[M]``, ``M | None``, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if (found := _model_in(arg)) is not None:
            return found
    return None


def _field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "(top level)"


#: Pydantic's errors for a value of the wrong type, which ``_got`` completes.
_TYPE_ERRORS = frozenset({"int_type", "float_type", "bool_type", "string_type"})


def _got(value: object) -> str:
    """What a spec gave instead of the type the field takes, and how to write it."""
    if isinstance(value, bool):
        return f"not the boolean {str(value).lower()}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:39] + "…"
        hint = ""
        try:
            float(value)
            hint = "; write the number without quotes"
        except ValueError:
            if value.lower() in ("true", "false"):
                hint = "; write true or false without quotes"
        return f"not the string {shown!r}{hint}"
    if isinstance(value, int | float):
        return f"not {value!r}" if len(repr(value)) <= 40 else "not that number"
    if value is None:
        return "not null"
    return "not a mapping" if isinstance(value, dict) else f"not a {type(value).__name__}"


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _check_shape(text: str, source: str) -> None:
    """Refuse anchors/aliases (alias bombs) and deep nesting from the event stream, which
    the parser produces without recursion, before anything is built."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        line = event.start_mark.line + 1 if event.start_mark else 0
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise SpecError(
                f"{source}: YAML anchors and aliases are not allowed in a spec (line {line}); "
                "write the values out"
            )
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise SpecError(
                    f"{source}: nested deeper than {MAX_DEPTH} levels at line {line}; "
                    "a spec is a shallow mapping"
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def parse_spec(text: str, source: str) -> ExperimentSpec:
    """Parse YAML or JSON text into a validated spec; raise ``SpecError`` with one clear line."""
    try:
        return _parse_spec(text, source)
    except SpecError as exc:
        raise SpecError(_one_line(str(exc))) from None


def _parse_spec(text: str, source: str) -> ExperimentSpec:
    raw = load_spec_mapping(text, source)
    if "cohort" in raw and "workload" not in raw:
        raise SpecError(
            f"{source}: names a cohort of recorded runs, not a workload; read it with "
            "forklab.experiments.cohort.spec.parse_cohort_spec"
        )
    try:
        spec = ExperimentSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(validation_message(exc, source)) from None
    resolve_workload(spec, source)
    return spec


def load_spec_mapping(text: str, source: str) -> dict[str, Any]:
    """The top-level mapping of a spec's YAML or JSON text, read within the size, alias and
    nesting limits (shared by workload and cohort specs)."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(f"{source}: larger than {MAX_SPEC_BYTES // 1024} KiB; a spec is small")
    try:
        _check_shape(text, source)
        raw = yaml.safe_load(text)
    except SpecError:
        raise
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid syntax"
        raise SpecError(
            f"{source}: YAML/JSON syntax error{where}: {problem}; fix the file's syntax"
        ) from None
    except ValueError:  # an integer literal longer than Python converts (4300 digits)
        raise SpecError(
            f"{source}: a number has too many digits to read; no spec field takes it"
        ) from None
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: expected a mapping of spec fields at the top level")
    try:  # YAML's .nan/.inf and JSON's NaN/Infinity/1e999, in any field (params included)
        check_finite(raw, source)
    except StrictJsonError as exc:
        raise SpecError(f"{exc}; write a finite number") from None
    return raw


def validation_message(
    exc: ValidationError, source: str, model: type[BaseModel] | None = None
) -> str:
    """The first validation error as one line naming the field (and how many more). An
    unknown key comes first: a misspelt field (``episods:``) also leaves the real one
    missing, and "episodes: Field required" alone hides the typo that caused it."""
    errors = exc.errors()
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    if unknown:
        loc = tuple(unknown[0]["loc"])
        hint = _did_you_mean(loc, model or ExperimentSpec)
        return f"{source}: field {_field_path(loc)}: unknown field{hint}{more}"
    err = errors[0]
    field = _field_path(tuple(p for p in err["loc"] if not str(p).startswith("function-")))
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] in _TYPE_ERRORS:
        msg = f"{msg}, {_got(err['input'])}"
    head, sep, rest = msg.partition(": ")
    if not err["loc"] and sep and " " not in head:
        field, msg = head, rest
    return f"{source}: field {field}: {msg}{more}"


def resolve_workload(spec: ExperimentSpec, source: str = "spec") -> Workload:
    """Instantiate the spec's workload and check every world's intervention against it."""
    try:
        cls = workload_class(spec.workload.name)
        try:
            workload = cls(spec.workload.params)
            feature_kinds(cls)
        except (WorkloadError, ContractViolation):
            raise
        except Exception as exc:  # the workload's own code failed, not the spec
            raise from_exception(cls, exc, "while loading the workload") from exc
        for i, world in enumerate(spec.worlds):
            if world.intervention is None:
                continue
            try:
                workload.intervention_params(world.intervention.name, world.intervention.params)
            except WorkloadError as exc:
                raise WorkloadError(f"worlds[{i}].{exc.field}", exc.message) from None
    except WorkloadError as exc:
        raise SpecError(f"{source}: field {exc.field}: {exc.message}") from None
    except ContractViolation as exc:
        raise SpecError(f"{source}: {exc}") from exc
    except Exception as exc:  # the workload's own code failed: name it, one line
        raise SpecError(
            f"{source}: field workload.name: the workload {spec.workload.name!r} failed "
            f"({type(exc).__name__}: {exc})"
        ) from None
    return workload


def json_schema() -> dict[str, Any]:
    return ExperimentSpec.model_json_schema()
