"""A user's outcome scorer and feature function run in a box like workload code: honest
ones answer; hostile or broken ones fail closed with one sentence (they read a secret in
the environment or a file outside, write outside, loop for ever, answer NaN, a number out
of [0, 1] or text, phone home, kill their box, or try to make one run's answer depend on
another's)."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from cohort_user_code import ship_package, write_package

from forklab.activities.experiment.runner_bundle import code_digest
from forklab.activities.experiment.workload_bundles import WorkloadBundles
from forklab.activities.runfork.cohort_code import CohortCode
from forklab.activities.sandbox import jail
from forklab.activities.sandbox.cohort_code_calls import CodeItem, CohortCodeCalls, UserCodeError
from forklab.activities.stores.artifacts import LocalArtifactStore
from forklab.experiments.cohort.spec import parse_cohort_spec
from forklab.experiments.experiment.bundle import BundleFile

STATE = {"score": 0.75}


class Box:
    def __init__(self, tmp: Path, port: int) -> None:
        self.secret = tmp / "secret.txt"
        self.secret.write_text("x")
        self.outside = tmp / "outside.txt"
        self.files: list[BundleFile] = write_package(tmp / "src", self.secret, self.outside, port)
        self.digest = code_digest(self.files)
        self.calls = CohortCodeCalls(tmp / "calls", call_seconds=2.0)

    def score(self, name: str, n: int = 1) -> list[bool | float]:
        items = [CodeItem(f"run r{i}", [None, STATE, []]) for i in range(n)]
        return self.calls.scores(self.files, self.digest, f"usercode.scoring:{name}", items)

    def features(self, name: str, n: int = 1) -> list[dict[str, object]]:
        steps = [
            {
                "index": 1,
                "type": "chat_model",
                "label": "fast",
                "status": "completed",
                "origin": "own",
                "seconds": 0.1,
                "result": {"x": 1},
            },
            {
                "index": 2,
                "type": "search",
                "label": "search",
                "status": "failed",
                "origin": "own",
                "seconds": 0.1,
                "result": None,
            },
        ]
        decisive = {"index": 3, "type": "charge", "label": "charge_customer"}
        items = [CodeItem(f"run r{i}", [steps, decisive]) for i in range(n)]
        return self.calls.features(self.files, self.digest, f"usercode.scoring:{name}", items)


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture
def box(tmp_path: Path, listener: int, monkeypatch: pytest.MonkeyPatch) -> Box:
    monkeypatch.setenv("FORKLAB_TEST_SECRET", "x")
    return Box(tmp_path, listener)


def _refused(box: Box, name: str, *expected: str) -> str:
    with pytest.raises(UserCodeError) as err:
        box.score(name)
    text = str(err.value)
    assert text.startswith(f"cohort.outcome usercode.scoring:{name} "), text
    for part in expected:
        assert part in text, text
    assert "\n" not in text
    return text


def test_an_honest_scorer_and_feature_function_answer_from_their_box(box: Box) -> None:
    assert box.score("resolved", 3) == [0.75, 0.75, 0.75]
    (found,) = box.features("features")
    assert found == {
        "steps_before": 2,
        "last_failed": True,
        "tool": "charge_customer",
        "tool_calls": 1,
    }


def test_a_scorer_that_reads_a_secret_fails_closed_with_a_sentence(box: Box) -> None:
    text = _refused(
        box,
        "reads_env",
        "raised KeyError: 'FORKLAB_TEST_SECRET'",
        "usercode/scoring.py:",
        "(run r0)",
    )
    assert "x'" not in text.replace("'FORKLAB_TEST_SECRET'", "")
    _refused(box, "reads_file", "raised FileNotFoundError")


def test_a_scorer_that_writes_outside_its_box_fails_and_nothing_is_written(box: Box) -> None:
    _refused(box, "writes_file", "raised")
    assert not box.outside.exists()


def test_a_scorer_that_loops_for_ever_is_killed_after_its_seconds(box: Box) -> None:
    _refused(box, "loops", "ran past its 2 s and was killed")


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("nan", "returned float nan, not a finite score"),
        ("too_big", "returned float 1.5, out of [0, 1]"),
        ("text", "returned str 'yes', not a bool or a score in [0, 1]"),
    ],
)
def test_a_scorer_answering_out_of_contract_is_refused(box: Box, name: str, why: str) -> None:
    _refused(box, name, why)


def test_a_scorer_cannot_reach_the_network(box: Box) -> None:
    _refused(box, "phones_home", "raised")


def test_a_scorer_that_kills_its_box_fails_closed(box: Box) -> None:
    with pytest.raises(UserCodeError, match=r"usercode\.scoring:kills_its_box: its box"):
        box.score("kills_its_box")


def test_a_scorer_cannot_change_another_runs_recorded_outcome(box: Box) -> None:
    ledger = box.secret.with_name("ledger.txt")
    ledger.write_text("run other: failure")
    _refused(box, "rewrites_ledger", "raised FileNotFoundError")
    assert ledger.read_text() == "run other: failure"


def test_one_calls_answer_cannot_depend_on_anothers(box: Box) -> None:
    # each call runs in a process forked from the untouched parent: a global or a file in
    # its working folder written by one call is gone for the next
    assert box.score("remembers", 3) == [True, True, True]
    assert box.features("leaky_features", 3) == [{"calls_seen": 1}] * 3


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("bad_features", "returned 'ratio' = inf, not finite"),
        ("not_a_dict", r"returned list \[1, 2\], not a dict of feature name to value"),
    ],
)
def test_features_out_of_contract_are_refused(box: Box, name: str, why: str) -> None:
    with pytest.raises(UserCodeError, match=f"cohort.features usercode.scoring:{name} {why}"):
        box.features(name)


def test_code_that_changed_since_the_plan_is_refused(box: Box) -> None:
    box.files[1].source.write_text(box.files[1].source.read_text() + "\n# changed\n")
    with pytest.raises(UserCodeError, match=r"the code is now .* but the plan named"):
        box.score("resolved")
    assert os.listdir(box.calls.root) == []


def test_a_worker_without_bubblewrap_runs_no_user_code_unless_its_policy_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalArtifactStore(tmp_path / "artifacts")
    bundle = ship_package(store, tmp_path / "src")
    spec = parse_cohort_spec(
        json.dumps(
            {
                "id": "x",
                "hypothesis": {"text": "t"},
                "seed": 1,
                "cohort": {
                    "workflow_ids": ["a"],
                    "limit": 1,
                    "fork_at": "failed",
                    "outcome": "usercode.scoring:resolved",
                },
                "worlds": [
                    {"name": "baseline", "role": "baseline"},
                    {"name": "b", "role": "treatment", "model": "slow"},
                ],
            }
        ),
        "s.yaml",
    )
    monkeypatch.setattr(jail, "bubblewrap", lambda: (None, "bwrap is not installed"))
    bundles = WorkloadBundles(store, tmp_path / "bundles")
    calls = CohortCodeCalls(tmp_path / "calls")
    with pytest.raises(UserCodeError, match="this worker runs no workload code unconfined"):
        CohortCode(bundles, calls).prepare(spec, bundle)
    code = CohortCode(bundles, calls, allow_unconfined=True).prepare(spec, bundle)
    assert code is not None and code.bundle == bundle
    # a worker with no bundle store refuses the user's code in one sentence
    with pytest.raises(UserCodeError, match="is your own code and this worker runs none"):
        CohortCode().prepare(spec, bundle)
