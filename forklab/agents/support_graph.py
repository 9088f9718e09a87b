"""Example agent (d): a support agent written as a LangGraph graph, run on Temporal through
``temporalio-langgraph``: a ``model`` node (an OpenAI-compatible chat call offering one
tool) and a ``tools`` node (``send_email`` through the effect ledger), looping until the
model answers without a tool call.

Each node runs as an activity, ``support-graph.model`` and ``support-graph.tools``
(the plugin names them graph.node), so every node is a step a fork can inherit or run
live, and a tool policy names the node (``support-graph.tools=block``). The nodes are
built by the worker (``support_graph_nodes``); this module holds only the workflow, which
runs LangGraph's loop with the graph the plugin registered under :data:`GRAPH`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from temporalio.langgraph import graph

    from forklab.agents.inputs import checked_input

#: The name the worker registers the graph under.
GRAPH = "support-graph"


class SupportGraphInput(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    ticket: str = Field(min_length=1, max_length=2000)
    customer: str = "customer@example.test"
    model: str = "slow"


def initial_state(inp: SupportGraphInput) -> dict[str, Any]:
    return {
        "model": inp.model,
        "messages": [
            {"role": "system", "content": "Answer the ticket; email the customer if needed."},
            {"role": "user", "content": f"TICKET: {inp.ticket}\nCUSTOMER: {inp.customer}"},
        ],
        "answer": "",
    }


@workflow.defn(name="SupportGraph")
class SupportGraphWorkflow:
    @workflow.run
    async def run(self, inp: SupportGraphInput) -> dict[str, Any]:
        inp = checked_input(SupportGraphInput, inp)
        final: dict[str, Any] = await graph(GRAPH).compile().ainvoke(initial_state(inp))
        return {"answer": final["answer"], "messages": final["messages"]}
