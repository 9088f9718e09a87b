"""Majority votes over k forks that stop once decided (forklab.runtime.vote): the same
outcome as every fork's vote, fewer forks run, and the saving in the report."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from forklab.runtime.crn import Shocks
from forklab.runtime.file_format import WorldPlan
from forklab.runtime.runner import run_batch, run_prefix
from forklab.runtime.vote import vote_decided
from forklab.workloads.counter_recovery import CounterRecovery
from tests.helpers import plan_json, run_cli


def test_a_decided_vote_is_the_full_vote_for_every_sequence_of_forks() -> None:
    for forks in (1, 3, 5, 7, 9):
        for outcomes in itertools.product((False, True), repeat=forks):
            full = sum(outcomes) * 2 > forks
            successes = failures = ran = 0
            decided = None
            for ok in outcomes:
                ran += 1
                successes += ok
                failures += not ok
                decided = vote_decided(successes, failures, forks)
                if decided is not None:
                    break
            assert decided == full
            # decided as soon as the forks left could no longer change it, not later
            assert ran == next(
                r
                for r in range(1, forks + 1)
                if sum(outcomes[:r]) * 2 > forks or (r - sum(outcomes[:r])) * 2 >= forks
            )


def _replicate(wl: CounterRecovery, state_text: str, episode: int, replicate: int) -> bool:
    """One fork by hand: replicate ``r`` draws the agent stream ``#r{r}``."""
    state = json.loads(state_text)
    shocks = Shocks(9, episode, replicate)
    while not wl.done(state):
        wl.step(state, shocks)
    return bool(wl.outcome(state))


def test_votes_that_stop_early_give_every_outcome_and_count_the_forks_saved() -> None:
    wl = CounterRecovery({"noise": 0.25})
    five = WorldPlan(name="baseline", forks=5)
    batch = run_batch(wl, 9, range(200), [five])
    saved = 0
    for episode in range(200):
        cp = run_prefix(wl, 9, episode)
        votes = [_replicate(wl, cp["state"], episode, r) for r in range(5)]
        assert batch["worlds"]["baseline"]["outcomes"][episode] == (sum(votes) >= 3)
        ran = next(
            r
            for r in range(1, 6)
            if vote_decided(sum(votes[:r]), r - sum(votes[:r]), 5) is not None
        )
        saved += 5 - ran
    assert batch["forks_saved"] == {"baseline": saved}
    assert saved >= 200  # a vote is decided after three agreeing forks at the latest
    one_fork = run_batch(wl, 9, range(20), [WorldPlan(name="baseline")])
    assert one_fork["forks_saved"] == {}  # nothing to save with one fork per checkpoint


def test_the_report_shows_the_forks_saved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = {
        "id": "votes",
        "hypothesis": {"text": "h"},
        "seed": 1,
        "episodes": 200,
        "workload": {"name": "counter-recovery", "params": {"noise": 0.25}},
        "worlds": [
            {"name": "baseline", "role": "baseline"},
            {"name": "refresh", "role": "treatment", "intervention": {"name": "refresh"}},
        ],
        "analysis": {"forks_per_checkpoint": 3},
    }
    path = tmp_path / "votes.json"
    path.write_text(json.dumps(spec))
    report = plan_json(capsys, path)
    saved = report["settings"]["forks_saved"]
    assert set(saved) == {"baseline", "refresh"} and all(0 < n < 200 * 3 for n in saved.values())
    code, out, _ = run_cli(capsys, "plan", str(path))
    assert code == 0 and "forks saved by majority votes decided early (of 3 per checkpoint)" in out
