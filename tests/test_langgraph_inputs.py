"""Steady LangGraph node inputs, on the shape ``temporalio-langgraph`` 0.1 sends (two runs
of one graph recorded here: the same node call, different drawn ids and times)."""

from __future__ import annotations

import json
from typing import Any

from temporalio.langgraph._activity import ActivityInput

from forklab.workflows.runfork.langgraph_inputs import is_node_input, steady


def _node_input(task: str, checkpoint: str, at: float) -> ActivityInput:
    ns = f"model:{task}"
    config: dict[str, Any] = {
        "tags": [],
        "metadata": {
            "langgraph_step": 1,
            "langgraph_node": "model",
            "langgraph_triggers": ["branch:to:model"],
            "langgraph_path": ["__pregel_pull", "model"],
            "langgraph_checkpoint_ns": ns,
        },
        "configurable": {
            "checkpoint_ns": ns,
            "checkpoint_id": None,
            "checkpoint_map": {"": checkpoint},
            "__pregel_task_id": task,
            "__pregel_scratchpad": {"step": 1, "stop": 10007, "resume": [], "null_resume": None},
        },
        "context": None,
        "previous": None,
        "execution_info": {
            "checkpoint_id": checkpoint,
            "checkpoint_ns": ns,
            "task_id": task,
            "thread_id": None,
            "run_id": None,
            "node_attempt": 1,
            "node_first_attempt_time": at,
        },
    }
    return ActivityInput(args=({"q": "hi", "messages": []},), kwargs={}, langgraph_config=config)


A = _node_input(
    "5dcf3ee3-7301-0616-4376-a9185c4b2a8f", "1f1ee90b-4c32-601a-8000-cc6313c43cde", 1796244070.05
)
B = _node_input(
    "d2f0d3b8-e2e7-1899-2282-82b25f6b6646", "1f1ee90b-4f5e-6aa4-8000-26f133b93ec7", 1796244070.39
)


def _json(x: ActivityInput) -> str:
    return json.dumps(
        {"args": x.args, "kwargs": x.kwargs, "config": x.langgraph_config}, sort_keys=True
    )


def test_two_runs_of_the_same_call_send_the_same_input() -> None:
    assert _json(A) != _json(B)
    assert _json(steady(A, 1)) == _json(steady(B, 1))


def test_the_steady_config_is_well_formed_and_keeps_what_is_not_drawn() -> None:
    out = steady(A, 1).langgraph_config
    task = out["configurable"]["__pregel_task_id"]
    assert task != A.langgraph_config["configurable"]["__pregel_task_id"]
    # one id, one replacement: the namespace names the same task id
    assert out["configurable"]["checkpoint_ns"] == f"model:{task}"
    assert out["metadata"]["langgraph_checkpoint_ns"] == f"model:{task}"
    assert out["execution_info"]["task_id"] == task
    checkpoint = out["execution_info"]["checkpoint_id"]
    assert out["configurable"]["checkpoint_map"] == {"": checkpoint} and checkpoint != task
    assert out["execution_info"]["node_first_attempt_time"] is None
    assert out["metadata"]["langgraph_step"] == 1 and out["execution_info"]["node_attempt"] == 1
    assert steady(A, 1).args == A.args
    # the original is not changed (it is LangGraph's)
    assert A.langgraph_config["execution_info"]["node_first_attempt_time"] == 1796244070.05


def test_calls_keep_distinct_ids_and_other_inputs_pass_untouched() -> None:
    one, two = steady(A, 1).langgraph_config, steady(A, 2).langgraph_config
    assert one["execution_info"]["task_id"] != two["execution_info"]["task_id"]
    assert is_node_input(A)
    assert not is_node_input({"langgraph_config": {}})
    assert not is_node_input(ActivityInput)
