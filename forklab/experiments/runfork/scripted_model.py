"""The local stand-in model: a seeded, scripted policy behind an OpenAI-compatible API.

It is NOT a language model. It reads a few markers in the conversation and answers the
way the example agents need: per named model (``fast`` writes a thin recommendation,
``slow`` and ``candidate`` a full one) and with tool calls when tools are offered. With a
temperature above 0 it varies its wording by draws that are a pure function of
(seed, request counter, stream): the server counts requests, so two runs of the same
agent see different draws, as they would against a sampled model.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MODELS = ("fast", "slow", "candidate")

_PHRASES = {
    "research": ["gathered sources", "read the primary papers", "collected field reports"],
    "insights": ["three durable patterns", "two recurring causes", "one dominant driver"],
    "risks": ["vendor lock-in", "operational load", "cost overrun"],
    "recommendations": ["adopt in stages", "pilot with one team", "start with the read path"],
    "summary": ["balanced outlook", "cautious optimism", "clear next steps"],
}


def uniform(seed: int, counter: int, stream: str) -> float:
    word = hashlib.blake2b(f"{seed}|{counter}|{stream}".encode(), digest_size=8).digest()
    return (int.from_bytes(word, "little") >> 11) / float(1 << 53)


class ToolCall(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: dict[str, Any]


class Reply(BaseModel):
    model_config = ConfigDict(frozen=True)

    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _marker(text: str, name: str) -> str | None:
    for line in text.splitlines():
        if line.upper().startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    return None


def _pick(options: list[str], temperature: float, seed: int, counter: int, stream: str) -> str:
    """Greedy (the first option) at temperature 0; otherwise another option with a
    probability that grows with the temperature."""
    if temperature <= 0:
        return options[0]
    u = uniform(seed, counter, stream)
    if u >= min(0.9, temperature / 2):
        return options[0]
    return options[1 + int(uniform(seed, counter, stream + "/which") * (len(options) - 1))]


def respond(
    model: str,
    messages: list[dict[str, Any]],
    tools: list[str],
    temperature: float = 0.0,
    seed: int = 0,
    counter: int = 0,
) -> Reply:
    """The scripted answer to one chat request. ``tools`` are the offered tool names."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; the local server has {', '.join(MODELS)}")
    convo = "\n".join(_text(m) for m in messages)
    prompt_tokens = max(1, len(convo) // 4)
    last = messages[-1] if messages else {}
    step = _marker(_text(last), "STEP") if last.get("role") == "user" else None
    if step is not None:
        topic = _marker(_text(last), "TOPIC") or "the topic"
        if step == "recommendations" and model == "fast":
            content = f"draft: {topic} - tbd"
        else:
            options = _PHRASES.get(step, ["done"])
            phrase = _pick(options, temperature, seed, counter, step)
            content = (
                f"[{model}] {step} on {topic}: {phrase}. "
                f"Evidence weighed against the earlier sections; confidence stated."
            )
        return Reply(
            content=content, prompt_tokens=prompt_tokens, completion_tokens=len(content) // 4
        )
    ticket = _marker(convo, "TICKET")
    customer = _marker(convo, "CUSTOMER") or "customer@example.test"
    answered = any(m.get("role") == "tool" for m in messages)
    mail_tool = next((t for t in tools if "email" in t or "mail" in t), None)
    if ticket is not None and mail_tool is not None and not answered:
        wants_refund = "refund" in ticket.lower()
        subject = "Your refund" if wants_refund else "About your ticket"
        tone = _pick(
            ["we are on it", "thanks for your patience"], temperature, seed, counter, "tone"
        )
        body = f"Hello, {tone}. " + (
            "Your refund is approved." if wants_refund and model != "fast" else "We will follow up."
        )
        call = ToolCall(
            id=f"call_{hashlib.sha256(convo.encode()).hexdigest()[:12]}",
            name=mail_tool,
            arguments={"to": customer, "subject": subject, "body": body},
        )
        return Reply(tool_calls=[call], prompt_tokens=prompt_tokens, completion_tokens=24)
    content = "Replied to the customer by email." if answered else f"[{model}] noted."
    return Reply(content=content, prompt_tokens=prompt_tokens, completion_tokens=len(content) // 4)


def reply_json(reply: Reply) -> dict[str, Any]:
    """The assistant message in chat-completions form."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in reply.tool_calls
        ]
    return message
