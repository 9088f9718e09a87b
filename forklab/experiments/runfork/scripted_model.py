"""The local stand-in model: a seeded, scripted policy behind an OpenAI-compatible API.

It is NOT a language model. It reads a few markers in the conversation and answers the
way the example agents need, making the mistakes its **behaviour model** says a named
model makes (``BEHAVIOURS``, documented in docs/agent-experiments.md):

| model | thin section (recommendations / other) | no refund | skips the tool | bad address |
|---|---|---|---|---|
| ``fast`` | 0.60 / 0.10 | 0.70 | 0.10 | 0.05 |
| ``slow`` | 0.05 / 0.05 | 0.10 | 0.02 | 0.02 |
| ``candidate`` | 0.03 / 0.03 | 0.05 | 0.02 | 0.01 |
| any other name | 0.20 / 0.10 | 0.30 | 0.05 | 0.05 |

Each figure is the probability of the mistake at temperature 1. Temperature T scales
the mistake's log-odds by 1/T, as a softmax temperature does over two choices:
``p(T) = sigmoid(logit(p) / T)``. At T = 0 the model is greedy (it makes the mistakes
above 0.5 every time and no others), at T = 1 it makes each at its rate, and as T grows
every rate moves towards one half. The mistakes:

- *thin section*: a research step answered ``draft: TOPIC - tbd`` (the scorer fails it);
- *no refund*: a refund ticket answered "We will follow up." instead of approving it;
- *skips the tool*: a ticket answered in text without calling the mail tool;
- *bad address*: the mail tool called with ``unknown@invalid`` instead of the customer.

An instruction can make a mistake rarer, as a prompt patch would: when a system (or
developer) message contains a mistake's *counter-instruction* (``COUNTER_INSTRUCTIONS``,
any case), that mistake's rate is divided by ``HEEDED_DIVISOR`` (4): "write every section
in full", "approve eligible refunds", "always email the customer", "check the customer's
address".

Draws are a pure function of (seed, counter, stream). The server uses the request's
``seed`` when the client sends one (counter 0: the same seed draws the same mistakes
whatever came before, which is what lines up an experiment's worlds), else its own seed
and a request counter (two runs of the same agent see different draws, as they would
against a sampled model).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

#: The behaviour of a name ``BEHAVIOURS`` does not list.
DEFAULT_BEHAVIOUR = "default"

_PHRASES = {
    "research": ["gathered sources", "read the primary papers", "collected field reports"],
    "insights": ["three durable patterns", "two recurring causes", "one dominant driver"],
    "risks": ["vendor lock-in", "operational load", "cost overrun"],
    "recommendations": ["adopt in stages", "pilot with one team", "start with the read path"],
    "summary": ["balanced outlook", "cautious optimism", "clear next steps"],
}


class Behaviour(BaseModel):
    """How often a named model makes each mistake at temperature 1."""

    model_config = ConfigDict(frozen=True)

    thin_recommendations: float
    thin_section: float
    no_refund: float
    skips_tool: float
    bad_address: float


BEHAVIOURS: dict[str, Behaviour] = {
    "fast": Behaviour(
        thin_recommendations=0.6, thin_section=0.1, no_refund=0.7, skips_tool=0.1, bad_address=0.05
    ),
    "slow": Behaviour(
        thin_recommendations=0.05,
        thin_section=0.05,
        no_refund=0.1,
        skips_tool=0.02,
        bad_address=0.02,
    ),
    "candidate": Behaviour(
        thin_recommendations=0.03,
        thin_section=0.03,
        no_refund=0.05,
        skips_tool=0.02,
        bad_address=0.01,
    ),
    DEFAULT_BEHAVIOUR: Behaviour(
        thin_recommendations=0.2, thin_section=0.1, no_refund=0.3, skips_tool=0.05, bad_address=0.05
    ),
}


#: Per mistake (a ``Behaviour`` field), the instruction that makes it rarer.
COUNTER_INSTRUCTIONS = {
    "thin_recommendations": "write every section in full",
    "thin_section": "write every section in full",
    "no_refund": "approve eligible refunds",
    "skips_tool": "always email the customer",
    "bad_address": "check the customer's address",
}
#: A heeded counter-instruction divides its mistake's rate by this.
HEEDED_DIVISOR = 4.0


def _instructions(messages: list[dict[str, Any]]) -> str:
    return " ".join(_text(m).lower() for m in messages if m.get("role") in ("system", "developer"))


def rate_of(how: Behaviour, mistake: str, instructions: str) -> float:
    """The mistake's rate at temperature 1, given the conversation's instructions."""
    rate = float(getattr(how, mistake))
    if COUNTER_INSTRUCTIONS[mistake] in instructions:
        rate /= HEEDED_DIVISOR
    return rate


def behaviour(model: str) -> Behaviour:
    """The behaviour of ``model``; a name not listed behaves as ``default``."""
    return BEHAVIOURS.get(model, BEHAVIOURS[DEFAULT_BEHAVIOUR])


def mistake_probability(rate: float, temperature: float) -> float:
    """``sigmoid(logit(rate) / T)``; greedy (0 or 1) at T = 0."""
    if temperature <= 0:
        return 1.0 if rate > 0.5 else 0.0
    if rate <= 0 or rate >= 1:
        return rate
    return 1.0 / (1.0 + math.exp(-math.log(rate / (1 - rate)) / temperature))


def uniform(seed: int, counter: int, stream: str) -> float:
    word = hashlib.blake2b(f"{seed}|{counter}|{stream}".encode(), digest_size=8).digest()
    return (int.from_bytes(word, "little") >> 11) / float(1 << 53)


def _mistake(rate: float, temperature: float, seed: int, counter: int, stream: str) -> bool:
    p = mistake_probability(rate, temperature)
    if p <= 0.0:
        return False
    if p >= 1.0:
        return True
    return uniform(seed, counter, "mistake/" + stream) < p


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
    how = behaviour(model)
    told = _instructions(messages)
    convo = "\n".join(_text(m) for m in messages)
    prompt_tokens = max(1, len(convo) // 4)
    last = messages[-1] if messages else {}
    step = _marker(_text(last), "STEP") if last.get("role") == "user" else None
    if step is not None:
        topic = _marker(_text(last), "TOPIC") or "the topic"
        which = "thin_recommendations" if step == "recommendations" else "thin_section"
        rate = rate_of(how, which, told)
        if _mistake(rate, temperature, seed, counter, "thin/" + step):
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
    if (
        ticket is not None
        and mail_tool is not None
        and not answered
        and not _mistake(rate_of(how, "skips_tool", told), temperature, seed, counter, "skip")
    ):
        wants_refund = "refund" in ticket.lower()
        subject = "Your refund" if wants_refund else "About your ticket"
        tone = _pick(
            ["we are on it", "thanks for your patience"], temperature, seed, counter, "tone"
        )
        approves = wants_refund and not _mistake(
            rate_of(how, "no_refund", told), temperature, seed, counter, "refund"
        )
        body = f"Hello, {tone}. " + (
            "Your refund is approved." if approves else "We will follow up."
        )
        to = (
            "unknown@invalid"
            if _mistake(rate_of(how, "bad_address", told), temperature, seed, counter, "address")
            else customer
        )
        call = ToolCall(
            id=f"call_{hashlib.sha256(convo.encode()).hexdigest()[:12]}",
            name=mail_tool,
            arguments={"to": to, "subject": subject, "body": body},
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
