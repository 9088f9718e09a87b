"""The nodes of the LangGraph support agent (``support_graph``) and the graph itself.

Both nodes run as activities: ``model`` calls an OpenAI-compatible endpoint with the
conversation and the ``send_email`` tool; ``tools`` performs the model's tool calls,
``send_email`` through :class:`forklab.agents.tools.EffectTools` (effect ledger, lineage
root, idempotency key), so a fork that runs the node live sends no second email for the
same request. Built per worker: the plugin wraps the graph's nodes in place.
"""

from __future__ import annotations

import json
import operator
from datetime import timedelta
from typing import Annotated, Any, TypedDict

import openai
from langgraph.graph import END, START, StateGraph
from openai import AsyncOpenAI
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from forklab.agents.tools import EffectTools

NODE_OPTIONS: dict[str, Any] = {
    "execute_in": "activity",
    "start_to_close_timeout": timedelta(seconds=60),
    "retry_policy": RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=5)),
}
SEND_EMAIL = {
    "type": "function",
    "function": {
        "name": "send_email",
        "description": "Send one email to the customer.",
        "parameters": {
            "type": "object",
            "properties": {
                "to": {"type": "string"},
                "subject": {"type": "string"},
                "body": {"type": "string"},
            },
            "required": ["to", "subject", "body"],
        },
    },
}
_RETRYABLE_STATUS = {408, 409, 429}


class SupportState(TypedDict):
    model: str
    messages: Annotated[list[dict[str, Any]], operator.add]
    answer: str


class SupportGraphNodes:
    def __init__(self, client: AsyncOpenAI, effects: EffectTools) -> None:
        self._client = client
        self._effects = effects

    async def model(self, state: SupportState) -> dict[str, Any]:
        try:
            out = await self._client.chat.completions.create(
                model=state["model"],
                messages=state["messages"],  # type: ignore[arg-type]
                tools=[SEND_EMAIL],  # type: ignore[list-item]
            )
        except openai.APIStatusError as exc:
            retryable = exc.status_code in _RETRYABLE_STATUS or exc.status_code >= 500
            raise ApplicationError(
                f"model endpoint answered {exc.status_code}: {exc.message}",
                non_retryable=not retryable,
            ) from None
        message = out.choices[0].message
        turn: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            turn["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in message.tool_calls
                if c.type == "function"
            ]
            return {"messages": [turn]}
        return {"messages": [turn], "answer": message.content or ""}

    async def tools(self, state: SupportState) -> dict[str, Any]:
        results = []
        for call in state["messages"][-1].get("tool_calls") or []:
            name = call["function"]["name"]
            if name != "send_email":
                content = f"unknown tool {name!r}"
            else:
                try:
                    args = json.loads(call["function"]["arguments"])
                    to, subject, body = str(args["to"]), str(args["subject"]), str(args["body"])
                except (ValueError, KeyError, TypeError):
                    content = "send_email needs a JSON object with to, subject and body"
                else:
                    content = await self._effects.send_email(to, subject, body)
            results.append({"role": "tool", "tool_call_id": call["id"], "content": content})
        return {"messages": results}


async def route(state: SupportState) -> str:
    """To ``tools`` when the model asked for tools, else the end. Async: a sync router
    would run in an executor, which the workflow sandbox forbids."""
    return "tools" if state["messages"][-1].get("tool_calls") else END


def support_graph(nodes: SupportGraphNodes) -> StateGraph[Any, Any, Any, Any]:
    g: StateGraph[Any, Any, Any, Any] = StateGraph(SupportState)
    g.add_node("model", nodes.model, metadata=dict(NODE_OPTIONS))
    g.add_node("tools", nodes.tools, metadata=dict(NODE_OPTIONS))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route)
    g.add_edge("tools", "model")
    return g
