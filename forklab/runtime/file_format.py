"""The runner's file format: every shape that crosses the sandbox boundary, defined once.

The runner (``python -m forklab.runtime.runner``) reads a request and checkpoints and
writes checkpoints or, for a group of worlds, each world's columns or why there are none.
The local twin (``forklab.activities.experiment.twin``), the sandbox activities
(``forklab.activities.experiment.world_batches``) and the record activities
(``forklab.activities.experiment.records``) read and write the same shapes, so they are spelled
here and nowhere else. Standard library only: this file ships inside every sandbox bundle.

``FORMAT_VERSION`` travels in every request. A snapshot bundles the runner of the code
that built it, so a worker upgraded while an experiment was in flight would otherwise
talk to an older runner without either side noticing; the runner refuses instead.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NotRequired, TypedDict, cast

from forklab.runtime import strict_json
from forklab.runtime.canon import canonical_json, sha256_hex
from forklab.runtime.files import checkpoint_digest
from forklab.runtime.workload import Feature

#: Bump when any shape below changes (3: ``continue`` runs a group of worlds).
FORMAT_VERSION = 3

#: The runner's module and the files it reads and writes in its working directory.
RUNNER_MODULE = "forklab.runtime.box"
REQUEST_FILE = "request.json"
CHECKPOINTS_FILE = "checkpoints.jsonl"
OUT_FILE = "out.json"


class FormatError(ValueError):
    """A runner file does not have the shape this format version defines."""


@dataclass(frozen=True)
class WorldPlan:
    """One world's continuation policy: the world it reports as, the intervention (with
    its params) and, for a guarded world, the rule that decides when it applies; ``forks``
    replicates per checkpoint decide the outcome by majority vote."""

    name: str
    intervention: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    guard: dict[str, Any] | None = None
    forks: int = 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> WorldPlan:
        return cls(**value)


def request_text(
    workload: str,
    params: dict[str, Any],
    seed: int,
    *,
    episodes: Sequence[int] | None = None,
    worlds: Sequence[WorldPlan] | None = None,
    seconds: Sequence[float] | None = None,
    workspace: str | None = None,
) -> str:
    """The runner's request: ``episodes`` for a ``prefix`` run; for ``continue``, the
    ``worlds`` to run one after another and the wall ``seconds`` each may take;
    ``workspace``: the folder (relative to the runner's) holding one sub-folder per
    episode, for a workload with ``has_workspace``."""
    request: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "workload": workload,
        "params": params,
        "seed": seed,
    }
    if workspace is not None:
        request["workspace"] = workspace
    if episodes is not None:
        request["episodes"] = list(episodes)
    if worlds is not None:
        if seconds is None or len(seconds) != len(worlds):
            raise ValueError("give the seconds of each world")
        request["worlds"] = [w.to_json() for w in worlds]
        request["seconds"] = [float(s) for s in seconds]
    return canonical_json(request)


def read_request(text: str) -> dict[str, Any]:
    request = json.loads(text)
    version = request.get("format") if isinstance(request, dict) else None
    if version != FORMAT_VERSION:
        raise FormatError(
            f"the request is in runner format {version!r} but this runner reads "
            f"format {FORMAT_VERSION}; rebuild the snapshot with the worker's code"
        )
    return dict(request)


class Checkpoint(TypedDict):
    """One episode stopped at its boundary: the state (canonical JSON), its sha256, where
    the workload asked to stop and where it stood, and the features recorded there.

    A workload with files adds ``workspace``, the digest of the episode's folder
    (``forklab.runtime.files.folder_digest``), and on the durable path the prefix
    activity adds ``layer``, the sealed workspace layer that holds that folder (one per
    chunk of episodes), which every world's sandbox attaches."""

    episode: int
    requested: int
    resolved: int
    sha256: str
    state: str
    features: dict[str, Feature]
    workspace: NotRequired[str]
    layer: NotRequired[str]


def checkpoint_line(checkpoint: Checkpoint) -> str:
    return canonical_json(checkpoint) + "\n"


def checkpoint_id(checkpoint: Checkpoint) -> str:
    """What a world inherits from this checkpoint: the state's sha256, joined with the
    digest of the episode's files when it has any."""
    return checkpoint_digest(checkpoint["sha256"], checkpoint.get("workspace"))


def parse_checkpoints(data: bytes, first: int, count: int) -> list[Checkpoint]:
    """Checkpoint lines for episodes ``first`` .. ``first + count - 1``, in order and intact."""
    lines = [line for line in data.decode("utf-8", errors="replace").splitlines() if line]
    if len(lines) != count:
        raise FormatError(f"expected {count} checkpoints, found {len(lines)} lines")
    checkpoints: list[Checkpoint] = []
    for expected, line in enumerate(lines, start=first):
        try:  # the box's output is the workload's to write: read strictly
            cp = strict_json.loads(line, f"checkpoint of episode {expected}")
        except strict_json.StrictJsonError as exc:
            raise FormatError(f"{exc}; this is not JSON the runner writes") from None
        if not isinstance(cp, dict) or cp.get("episode") != expected:
            raise FormatError(f"checkpoint line for episode {expected} is out of order")
        if sha256_hex(str(cp.get("state", ""))) != cp.get("sha256"):
            raise FormatError(f"checkpoint of episode {expected} fails its sha256")
        for key in ("workspace", "layer"):
            if key in cp and not _is_hex64(cp[key]):
                raise FormatError(f"checkpoint of episode {expected}: {key} is no sha256 digest")
        if not _plain_features(cp.get("features")):
            raise FormatError(
                f"checkpoint of episode {expected}: its features are not a mapping of names "
                "to plain values (one-line text, finite numbers, booleans or null)"
            )
        checkpoints.append(cast(Checkpoint, cp))
    return checkpoints


def _plain_features(features: object) -> bool:
    """What the runner's contract check lets through, checked again where a worker reads
    a box's checkpoints: the box is not trusted to have run that check."""
    if not isinstance(features, dict):
        return False
    return all(
        isinstance(name, str) and name.isprintable() and 0 < len(name) <= 100 and _plain(value)
        for name, value in features.items()
    )


def _plain(value: object) -> bool:
    """One-line text, a finite float, a 64-bit int, a bool or None."""
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, str):
        return value.isprintable()
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, int) and -(2**63) <= value < 2**63


def _is_hex64(value: object) -> bool:
    return (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    )


class WorldColumns(TypedDict):
    """One world over a run of episodes, in episode order: did it succeed, did the
    intervention apply, the fingerprint of the shocks it drew, and the sha256 of the
    checkpoint it was forked from."""

    outcomes: list[bool]
    intervened: list[bool]
    shocks: list[str]
    inherited: list[str]


#: Each column of ``WorldColumns`` and the type of its entries.
COLUMN_TYPES: dict[str, type] = {
    "outcomes": bool,
    "intervened": bool,
    "shocks": str,
    "inherited": str,
}


def empty_columns() -> WorldColumns:
    return {"outcomes": [], "intervened": [], "shocks": [], "inherited": []}


def parse_columns(value: object, episodes: int) -> WorldColumns:
    """One world's columns: every column, ``episodes`` entries of its type."""
    if not isinstance(value, dict) or sorted(value) != sorted(COLUMN_TYPES):
        raise FormatError("output is not an object with " + "/".join(COLUMN_TYPES))
    for key, kind in COLUMN_TYPES.items():
        col = value[key]
        if not isinstance(col, list) or len(col) != episodes:
            raise FormatError(f"column {key!r} does not hold {episodes} entries")
        if not all(isinstance(v, kind) for v in col):
            raise FormatError(f"column {key!r} holds values that are not {kind.__name__}")
    columns: WorldColumns = {
        "outcomes": value["outcomes"],
        "intervened": value["intervened"],
        "shocks": value["shocks"],
        "inherited": value["inherited"],
    }
    return columns


@dataclass(frozen=True)
class WorldOutput:
    """What the runner wrote for one world of a group: its ``columns``, or why there are
    none (``error``: a sentence; ``contract``: the workload broke its contract;
    ``timed_out``: it ran past its seconds) and the wall ``seconds`` it ran."""

    columns: WorldColumns | None
    error: str | None = None
    contract: bool = False
    timed_out: bool = False
    seconds: float = 0.0


#: The most characters of a world's error kept (a traceback's tail).
ERROR_CHARS = 2000


def parse_world_outputs(data: bytes, episodes: int, worlds: int) -> list[WorldOutput]:
    """The runner's ``continue`` output: one entry per world of the group, in order."""
    try:  # no runner writes a non-finite number (the contract refuses them): a box did
        value = strict_json.loads(data, "output")
    except strict_json.StrictJsonError as exc:
        raise FormatError(f"{exc}; this is not JSON the runner writes") from None
    entries = value.get("worlds") if isinstance(value, dict) and len(value) == 1 else None
    if not isinstance(entries, list) or len(entries) != worlds:
        raise FormatError(f"output is not an object with the results of {worlds} worlds")
    return [_world_output(entry, episodes, i) for i, entry in enumerate(entries)]


def _world_output(entry: object, episodes: int, index: int) -> WorldOutput:
    if not isinstance(entry, dict):
        raise FormatError(f"the result of world {index} is not an object")
    seconds = entry.get("seconds")
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not 0 <= seconds < math.inf
    ):
        raise FormatError(f"the result of world {index} has no seconds")
    kinds = sorted(set(entry) - {"seconds"})
    if len(kinds) != 1 or kinds[0] not in ("columns", "contract", "error", "timed_out"):
        raise FormatError(f"the result of world {index} is neither columns nor an error")
    (kind,) = kinds
    body = entry[kind]
    spent = float(seconds)
    if kind == "columns":
        try:
            return WorldOutput(parse_columns(body, episodes), seconds=spent)
        except FormatError as exc:
            raise FormatError(f"world {index}: {exc}") from None
    if kind == "timed_out":
        if body is not True:
            raise FormatError(f"the result of world {index} is neither columns nor an error")
        return WorldOutput(None, timed_out=True, seconds=spent)
    if not isinstance(body, str):
        raise FormatError(f"the error of world {index} is not text")
    return WorldOutput(None, error=body[-ERROR_CHARS:], contract=kind == "contract", seconds=spent)


class Batch(TypedDict):
    """The runner's result for a run of episodes (lists in episode order; the twin turns
    each into columns, ``forklab.experiments.experiment.columnar``)."""

    episodes: list[int]
    requested: list[int]
    resolved: list[int]
    checkpoints: list[str]
    features: list[dict[str, Feature]]
    worlds: dict[str, WorldColumns]
    #: per world with more than one fork per checkpoint: the forks its majority votes did
    #: not run because they were decided (``forklab.runtime.vote``); the twin's runs only
    forks_saved: NotRequired[dict[str, int]]
