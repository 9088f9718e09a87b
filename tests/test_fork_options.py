"""What a fork changes (``ForkOptions``) is one model that a single fork's request, a team
fork's request and a team fork's member hold: a member recorded in a coordinator's input
(``tests/golden/team_fork_remote_activity.json``) reads as it was written and asks for
the fork it asked for then, and ``forklab fork-team``'s flags give the team fork the
options ``forklab fork``'s give a single fork."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from forklab.activities.runfork.team_fork_start import TeamForkRequest
from forklab.cli.errors import CliError
from forklab.cli.main import build_parser
from forklab.cli.runfork.team_fork_commands import request_from
from forklab.contracts.fork_request import ForkOptions, ForkRequest
from forklab.contracts.team_fork import MemberFork
from forklab.experiments.runfork.overrides import ForkSignal
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.receipt import BoundaryMode

GOLDEN = Path(__file__).resolve().parent / "golden" / "team_fork_remote_activity.json"


def _recorded_members() -> list[dict[str, Any]]:
    """The members of the coordinator's input as its start event recorded them."""
    events = json.loads(GOLDEN.read_text("utf-8"))["events"]
    started = events[0]["workflowExecutionStartedEventAttributes"]
    members: list[dict[str, Any]] = json.loads(
        base64.b64decode(started["input"]["payloads"][0]["data"])
    )["members"]
    return members


#: a member's fields, flat: the coordinator's recorded input (those added since the
#: golden history was recorded read as None there)
MEMBER_FIELDS = {
    "workflow_id",
    "fork_workflow_id",
    "run_id",
    "at_step",
    "boundary",
    "model",
    "tool_policies",
    "intervention",
    "result_override",
    "input_override",
    "signals",
    "team",
    "cohort",
    "experiment_tag",
}


#: the team part's fields added since the golden history was recorded, and what they read
#: as there: its members' addresses are all written out (none ``forked``), and its members
#: take any release (no ``release_sha256``)
_TEAM_ADDED: dict[str, Any] = {"forked": [], "release_sha256": None}


def _as_recorded(written: dict[str, Any]) -> dict[str, Any]:
    """``written`` without the team part's fields added since the golden history was
    recorded (``_TEAM_ADDED``), each checked to read as it must there."""
    team = written.get("team")
    if not isinstance(team, dict):
        return written
    assert {k: team.get(k) for k in _TEAM_ADDED} == _TEAM_ADDED
    return {**written, "team": {k: v for k, v in team.items() if k not in _TEAM_ADDED}}


def test_a_recorded_member_reads_and_writes_the_same_fields() -> None:
    assert set(MemberFork.model_fields) == MEMBER_FIELDS
    recorded = _recorded_members()
    assert len(recorded) == 3
    for raw in recorded:
        written = _as_recorded(MemberFork.model_validate(raw).model_dump(mode="json"))
        assert {k: written[k] for k in raw} == raw
        assert {k: written[k] for k in MEMBER_FIELDS - set(raw)} == dict.fromkeys(
            MEMBER_FIELDS - set(raw)
        )


def test_a_recorded_member_asks_for_its_fork_with_its_options() -> None:
    for raw in _recorded_members():
        asked = MemberFork.model_validate(raw).fork_request("team fork tf")
        fields = _as_recorded(asked.model_dump(mode="json"))
        renamed = {"workflow_id": "run", "fork_workflow_id": "name"}
        assert {renamed.get(k, k): v for k, v in raw.items()} == {
            k: fields[k] for k in (renamed.get(k, k) for k in raw)
        }
        assert (asked.requested_by, asked.record, asked.point) == ("team fork tf", True, None)


def test_options_are_the_base_fields_alone() -> None:
    request = ForkRequest(
        run="r", at_step=2, name="f", model="slow", point="failed", signals=[ForkSignal(name="go")]
    )
    options = request.options(model="fast")
    assert set(options) == set(ForkOptions.model_fields)
    assert (options["model"], options["signals"]) == ("fast", [ForkSignal(name="go")])
    team = TeamForkRequest(member="m", at_step=2, name="t", **options)
    assert team.options() == options


def _team_request(*words: str) -> TeamForkRequest:
    return request_from(build_parser("fork-team").parse_args(["fork-team", "m", *words]))


def test_fork_team_reads_the_flags_forklab_fork_reads() -> None:
    req = _team_request(
        "--override-input",
        '4={"q": 1}',
        "--signal",
        'go={"by": "ana"}',
        "--live-after",
        "--model",
        "slow",
        "--intervention",
        '{"k": "v"}',
        "--boundary",
        "approximate",
        "--freeze",
        "w",
        "--name",
        "tf",
    )
    assert (req.member, req.at_step, req.name, req.freeze) == ("m", 3, "tf", ("w",))
    assert req.input_override == (4, {"q": 1})
    assert req.signals == [ForkSignal(name="go", args=[{"by": "ana"}])]
    assert req.tool_policies == {"*": ToolPolicy.live}
    assert (req.model, req.intervention, req.boundary) == (
        "slow",
        {"k": "v"},
        BoundaryMode.approximate,
    )
    assert _team_request("--override-result", '3="x"').at_step == 3


@pytest.mark.parametrize(
    ("words", "says"),
    [
        ((), "give --at-step N"),
        (("--at-step", "1", "--tool-policy", "nope"), "is not TOOL=POLICY"),
    ],
)
def test_fork_team_refuses_bad_flags_in_one_line(words: tuple[str, ...], says: str) -> None:
    with pytest.raises(CliError, match=says) as caught:
        _team_request(*words)
    assert caught.value.code == 2
