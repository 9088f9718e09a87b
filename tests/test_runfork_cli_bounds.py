"""Bounded, total input handling of the run-fork commands (issue 35, point 7): each bad
argument below is one line and exit 2, decided before anything connects (the address
is a closed port, so a command that got past its arguments would fail otherwise)."""

from __future__ import annotations

import pytest

from tests.helpers import run_cli

CLOSED = ("--address", "127.0.0.1:1")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["watch", "r", "--from", str(10**23)], "--from: give an offset from 0 to"),
        (["watch", "r", "--from", str(-(2**63))], "--from: give an offset from 0 to"),
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
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, *argv, *CLOSED)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("forklab: error: ") and says in err
