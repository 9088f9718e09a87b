"""Bounded, total input handling of the CLI (issue 35, point 7): each bad argument below
is one line and exit 2, decided before anything connects (the address is a closed port,
so a command that got past its arguments would fail otherwise, with exit 1). Numbers are
read by ``forklab.cli.arguments`` and JSON by the shared strict reader
(``forklab.runtime.strict_json``)."""

from __future__ import annotations

import pytest

from tests.helpers import run_cli

CLOSED = ("--address", "127.0.0.1:1")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["watch", "r", "--from", str(10**23)], "--from: give a number from 0 to"),
        (["watch", "r", "--from", str(-(2**63))], "--from: give a number from 0 to"),
        (["watch", "r", "--from", "ten"], "is not a whole number"),
        (["fork", "r", "--at-step", "1", "--intervention", '{"a": NaN}'], "NaN is not a finite"),
        (
            ["fork", "r", "--at-step", "1", "--intervention", '{"a": [1, -Infinity]}'],
            "-Infinity is not a finite",
        ),
        (
            ["fork", "r", "--at-step", "1", "--intervention", "[" * 60_000 + "]" * 60_000],
            "nested too deeply",
        ),
        (["fork", "r", "--at-step", "1", "--intervention", '{"a": 1e999}'], "1e999 is not a"),
        (["fork", "r", "--at-step", "1", "--intervention", "[1]"], "must be a JSON object"),
        (["fork", "r", "--at-step", "1", "--intervention", '{"a": 1'], "not valid JSON"),
        (["fork", "r", "--at-step", str(10**23)], "--at-step: give a number from 0 to"),
        (["fork", "r", "--at-step", "-1"], "--at-step: give a number from 0 to"),
        (["fork", "r", "--at-step", "1e3"], "is not a whole number"),
        (["team", "r", "--at-step", str(-(2**63))], "--at-step: give a number from 0 to"),
        (["outcome", "r", "--label", "x", "--score", "NaN"], "--score must be a finite"),
        (["outcome", "r", "--label", "x", "--score", "1e999"], "--score must be a finite"),
        (["outcome", "r", "--label", "x", "--score=-inf"], "--score must be a finite"),
        (["list", "--limit", str(10**23)], "--limit: give a number from 1 to"),
        (["list", "--limit", "0"], "--limit: give a number from 1 to"),
        (["layers", "gc", "--min-age", "nan"], "--min-age must be a finite"),
        (["layers", "gc", "--min-age", "-1"], "--min-age: give a number of at least 0"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, *argv, *CLOSED)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("forklab: error: ") and says in err


@pytest.mark.parametrize(
    "argv",
    [
        ["fork", "r", "--at-step", "1"],
        ["fork-team", "r", "--at-step", "1"],
        ["team", "r"],
        ["steps", "r"],
        ["trail", "r"],
    ],
)
def test_a_run_fork_command_that_cannot_reach_temporal_says_so_in_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Past its arguments, every run-fork command connects the same way (``plain_client``)
    and, with nothing listening, says where it looked and what to do, in one line."""
    code, out, err = run_cli(capsys, *argv, *CLOSED)
    assert code == 1 and out == "", (code, out, err)
    assert len(err.splitlines()) == 1, err
    assert err.startswith("forklab: error: cannot reach Temporal at 127.0.0.1:1 ("), err
    assert err.rstrip().endswith(
        "start it with `forklab up` or point FORKLAB_ADDRESS at your server"
    ), err
