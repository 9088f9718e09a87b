"""The boxed rehearsal checks the contract on every prefix before approval, in parts over
the box's CPUs: whichever part a broken episode falls in, the answer is the sentence of
the first broken episode in episode order, as one loop would give it."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.runner_bundle import bundle_files
from activities.sandbox.workload_calls import WorkloadCalls, WorkloadContractError
from experiments.bundle import BundleFile
from experiments.engine import spec_world_plans
from experiments.spec import ExperimentSpec

#: A two-step workload whose step raises (a contract violation) in the episodes ``bad``.
BREAKS_AT = """
from experiments.runtime.workload import Workload


class BreaksAt(Workload):
    name = "breaks-at"
    default_params = {"bad": []}
    interventions = {"nudge": {}}
    feature_types = {"tries": int}

    def initial_state(self, episode_seed, shocks):
        return {"tries": 0}

    def boundary(self, state):
        return 1

    def cursor(self, state):
        return state["tries"]

    def step(self, state, shocks):
        if shocks.episode in self.params["bad"]:
            raise KeyError("broken")
        state["tries"] += 1

    def done(self, state):
        return state["tries"] >= 2

    def outcome(self, state):
        return state["tries"] == 2

    def features(self, state):
        return {"tries": state["tries"]}

    def intervene(self, state, name, params, shocks):
        pass
"""

EPISODES = 5_000  # the check splits into two parts of ~2,490 on two CPUs


def rehearse(tmp_path: Path, bad: list[int], episodes: int = EPISODES) -> dict[str, object]:
    module = tmp_path / "breaks_at.py"
    module.write_text(BREAKS_AT)
    spec = ExperimentSpec.model_validate(
        {
            "id": "breaks",
            "hypothesis": {"text": "h"},
            "seed": 1,
            "episodes": episodes,
            "workload": {"name": "breaks_at:BreaksAt", "params": {"bad": bad}},
            "worlds": [
                {"name": "baseline", "role": "baseline"},
                {"name": "nudge", "role": "treatment", "intervention": {"name": "nudge"}},
            ],
        }
    )
    files = bundle_files(spec.workload.name, [BundleFile("breaks_at.py", module)])
    calls = WorkloadCalls(tmp_path / "calls")
    answer, _, _ = calls.rehearse(spec, spec_world_plans(spec), 20, files)
    return answer


@pytest.mark.parametrize(
    ("bad", "first"),
    [([4_500], 4_500), ([3_000, 4_500], 3_000), ([1_000, 4_500], 1_000), ([4_999], 4_999)],
)
def test_the_first_broken_prefix_is_answered_whichever_part_it_is_in(
    tmp_path: Path, bad: list[int], first: int
) -> None:
    with pytest.raises(WorkloadContractError) as caught:
        rehearse(tmp_path, bad)
    assert f"(episode {first}, prefix" in str(caught.value), str(caught.value)


def test_a_workload_without_broken_prefixes_rehearses(tmp_path: Path) -> None:
    answer = rehearse(tmp_path, [])
    assert answer["episodes"] == 20
    assert not list((tmp_path / "calls").iterdir()), "the call's folder is removed"


@pytest.mark.parametrize("episodes", [20, 7, 2_010])
def test_a_spec_no_bigger_than_its_sample_or_than_one_part_rehearses(
    tmp_path: Path, episodes: int
) -> None:
    assert rehearse(tmp_path, [], episodes)["episodes"] == 20
