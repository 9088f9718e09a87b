"""Steady inputs for LangGraph nodes on Temporal, so that a LangGraph agent forks exactly.

``temporalio-langgraph`` runs each ``execute_in="activity"`` node as one activity whose
input is the node's arguments plus a serialized LangGraph config. That config carries
values LangGraph draws while the graph runs inside the workflow: checkpoint ids (uuid6,
from the wall clock), task ids derived from them, the checkpoint namespaces built from
those, and ``node_first_attempt_time`` (``time.time()``). No two runs of a graph, nor a
run and its fork (nor a run and its own replay), send the same node the same input, so
a fork matching inherited calls by input digest is refused at the first node.

:class:`LangGraphInputs` replaces each of them before the call leaves the workflow: every
id by one derived from the call's place in the run (the n-th node call, the id's order
of appearance), the first-attempt time by None. The node still sees a well-formed config,
the same for the same call in a run and in its forks. A node that reads those ids or that
time gets the steady values (the ids stay unique per call; the time is absent).

List it after the fork interceptor (the outbound interceptor listed last runs first, so
the fork mechanism sees the steady input).
"""

from __future__ import annotations

import copy
import dataclasses
import uuid
from typing import Any

from temporalio.worker import (
    Interceptor,
    StartActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)
from temporalio.workflow import ActivityHandle

_NAMESPACE = uuid.UUID("6f1c2a7e-9d43-4b0e-8a55-3c2e1f0b7d91")
_CONFIGURABLE_IDS = ("checkpoint_id", "__pregel_task_id")
_INFO_IDS = ("checkpoint_id", "task_id")
_NAMESPACES = "checkpoint_ns"


class LangGraphInputs(Interceptor):
    """Add to a worker that runs LangGraph agents on ``temporalio-langgraph`` and forks."""

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        return _Inbound


class _Inbound(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_Outbound(outbound))


class _Outbound(WorkflowOutboundInterceptor):
    def __init__(self, next: WorkflowOutboundInterceptor) -> None:
        super().__init__(next)
        self._calls = 0

    def start_activity(self, input: StartActivityInput) -> ActivityHandle[Any]:
        if len(input.args) == 1 and is_node_input(input.args[0]):
            self._calls += 1
            input = dataclasses.replace(input, args=[steady(input.args[0], self._calls)])
        return super().start_activity(input)


def is_node_input(value: object) -> bool:
    """Whether ``value`` is the LangGraph integration's node-activity input."""
    return (
        dataclasses.is_dataclass(value)
        and not isinstance(value, type)
        and type(value).__module__.startswith("temporalio.langgraph")
        and isinstance(getattr(value, "langgraph_config", None), dict)
    )


def steady(node_input: Any, call: int) -> Any:
    """``node_input`` with its drawn ids replaced by ids of the ``call``-th node call and
    its first-attempt time removed."""
    config: dict[str, Any] = copy.deepcopy(node_input.langgraph_config)
    renamed: dict[str, str] = {}

    def fresh(old: str) -> str:
        if old not in renamed:
            renamed[old] = str(uuid.uuid5(_NAMESPACE, f"{call}:{len(renamed)}"))
        return renamed[old]

    def namespace(ns: str) -> str:
        # "node:<task id>|child:<task id>": each level's id is drawn
        parts = []
        for level in ns.split("|"):
            name, sep, task = level.partition(":")
            parts.append(f"{name}{sep}{fresh(task)}" if sep and task else level)
        return "|".join(parts)

    configurable = config.get("configurable")
    if isinstance(configurable, dict):
        for key in _CONFIGURABLE_IDS:
            if isinstance(configurable.get(key), str):
                configurable[key] = fresh(configurable[key])
        if isinstance(configurable.get(_NAMESPACES), str):
            configurable[_NAMESPACES] = namespace(configurable[_NAMESPACES])
        ids = configurable.get("checkpoint_map")
        if isinstance(ids, dict):
            configurable["checkpoint_map"] = {
                namespace(k) if k else k: fresh(v) if isinstance(v, str) else v
                for k, v in ids.items()
            }
    metadata = config.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("langgraph_checkpoint_ns"), str):
        metadata["langgraph_checkpoint_ns"] = namespace(metadata["langgraph_checkpoint_ns"])
    info = config.get("execution_info")
    if isinstance(info, dict):
        for key in _INFO_IDS:
            if isinstance(info.get(key), str):
                info[key] = fresh(info[key])
        if isinstance(info.get(_NAMESPACES), str):
            info[_NAMESPACES] = namespace(info[_NAMESPACES])
        if "node_first_attempt_time" in info:
            info["node_first_attempt_time"] = None
    return dataclasses.replace(node_input, langgraph_config=config)
