"""A fork's live call as it goes out: with its lineage, step, chain and team headers, its
step in the Web UI's summary, the fork's model swapped in, an experiment world's prompt
patch, and a model call's seed."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from temporalio import workflow
from temporalio.worker import StartActivityInput

from forklab.workflows.runfork.fork_state import ForkState

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel

    from forklab.contracts.runfork import (
        CHAIN_HEADER,
        LINEAGE_HEADER,
        MODEL_FIELDS,
        STEP_HEADER,
        TEAM_HEADER,
    )
    from forklab.experiments.cohort.spec import PatchMode, PatchTarget, PromptPatch


def with_headers(state: ForkState, input: StartActivityInput, index: int) -> StartActivityInput:
    """The call with the headers its activity reads: the lineage root (the effect ledger's
    key), its step and chain, and a team fork's team."""
    conv = workflow.payload_converter()
    headers = dict(input.headers)
    headers[LINEAGE_HEADER] = conv.to_payloads([state.lineage_root])[0]
    headers[STEP_HEADER] = conv.to_payloads([index])[0]
    headers[CHAIN_HEADER] = conv.to_payloads([workflow.info().first_execution_run_id])[0]
    team = state.marker.team if state.marker is not None else None
    if team is not None:  # the team's messaging activity addresses the team's forks
        headers[TEAM_HEADER] = conv.to_payloads([team.model_dump(mode="json")])[0]
    return dataclasses.replace(input, headers=headers)


def summarized(input: StartActivityInput, index: int) -> StartActivityInput:
    """The call with its step in the summary the Web UI shows (unless the workflow gave it
    one): set only on calls that are scheduled, as a copy of the call costs time for
    each of a long prefix's served calls."""
    if input.summary is not None:
        return input
    return dataclasses.replace(input, summary=f"step {index}: {input.activity}")


def swap_model(input: StartActivityInput, model: str) -> StartActivityInput:
    field_name = MODEL_FIELDS.get(input.activity)
    if field_name is None or not input.args:
        return input
    first = input.args[0]
    if isinstance(first, BaseModel) and field_name in type(first).model_fields:
        first = first.model_copy(update={field_name: model})
    elif isinstance(first, dict) and field_name in first:
        first = {**first, field_name: model}
    else:
        return input
    return dataclasses.replace(input, args=[first, *input.args[1:]])


def _patched(text: str, patch: PromptPatch) -> str:
    if patch.mode is PatchMode.append:
        return f"{text}\n{patch.text}" if text else patch.text
    if patch.mode is PatchMode.prepend:
        return f"{patch.text}\n{text}" if text else patch.text
    return patch.text


def patch_prompt(input: StartActivityInput, patch: PromptPatch) -> StartActivityInput:
    """The model call with its system instructions patched: the system message of a chat
    call (one is added first when there is none), or an Agents SDK call's
    ``system_instructions``. Tool instructions are those of the calls' tools, which a chat
    call has none of."""
    if patch.target is not PatchTarget.system or not input.args:
        return input
    first = input.args[0]
    if isinstance(first, BaseModel) and "messages" in type(first).model_fields:
        messages = [dict(m) for m in cast(Any, first).messages]
        system = next((m for m in messages if m.get("role") == "system"), None)
        if system is None:
            messages.insert(0, {"role": "system", "content": _patched("", patch)})
        else:
            system["content"] = _patched(str(system.get("content") or ""), patch)
        first = first.model_copy(update={"messages": messages})
    elif isinstance(first, dict) and "system_instructions" in first:
        instructions = _patched(first["system_instructions"] or "", patch)
        first = {**first, "system_instructions": instructions}
    else:
        return input
    return dataclasses.replace(input, args=[first, *input.args[1:]])


def with_seed(input: StartActivityInput, seed: int) -> StartActivityInput:
    """An Agents SDK model call asking for ``seed``: its model settings' ``extra_args``,
    which the SDK passes to the endpoint's request as they are. (ForkLab's own chat call
    reads the seed from its activity header instead.)"""
    if not input.args or not isinstance(input.args[0], dict):
        return input
    first = input.args[0]
    settings = first.get("model_settings")
    if dataclasses.is_dataclass(settings) and not isinstance(settings, type):
        extra = {**(getattr(settings, "extra_args", None) or {}), "seed": seed}
        settings = dataclasses.replace(settings, extra_args=extra)
    elif isinstance(settings, dict):
        settings = {**settings, "extra_args": {**(settings.get("extra_args") or {}), "seed": seed}}
    else:
        return input
    return dataclasses.replace(input, args=[{**first, "model_settings": settings}, *input.args[1:]])
