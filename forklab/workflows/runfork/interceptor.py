"""The fork mechanism: a worker interceptor that serves a fork's first N activity calls
from its parent's recorded history and applies the fork's tool policies after that.

It depends on nothing ForkLab-specific in the workflow: any workflow whose model and tool
calls are activities (an OpenAI Agents SDK agent on ``temporalio-openai-agents``
included) can be forked. A fork is a new workflow of the same type, started with the
parent's input and a ``ForkMarker`` in its memo. At start the interceptor runs ONE
activity, ``forklab.fetch_prefix``, whose result (the parent's steps 1..N with their
results) lands in the fork's own history — so a replay after a crash serves the same
prefix without reading the parent again. Every worker that may run or replay a fork needs
this interceptor (a ``Replayer`` too).

On continue-as-new the interceptor writes the chain's step count so far into the next
run's memo (``BASE_STEP_MEMO_KEY``), so steps keep their chain-wide numbers in headers and
summaries, and a fork finds the run holding step N from first events alone. A fork's
marker stays on its later runs, marked ``continued``: they inherit nothing more, but keep
the fork's lineage root (the effect ledger's key), tool policies, model swaps and
intervention.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from datetime import timedelta
from typing import Any, cast

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ContinueAsNewInput,
    Interceptor,
    StartActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)
from temporalio.worker import ExecuteWorkflowInput as _ExecuteWorkflowInput

from forklab.contracts.errors import ForkErrorType

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, ValidationError

    from forklab.contracts.runfork import (
        BASE_STEP_MEMO_KEY,
        CHAIN_HEADER,
        FETCH_PREFIX,
        INTERNAL_PREFIX,
        LINEAGE_HEADER,
        MARKER_MEMO_KEY,
        MODEL_FIELDS,
        MODEL_SEED_HEADER,
        STEP_DECISION,
        STEP_HEADER,
        CohortFork,
        FetchPrefixInput,
        ForkMarker,
        PrefixPage,
        StepDecisionInput,
    )
    from forklab.experiments.cohort.faults import CallSite, apply_faults
    from forklab.experiments.cohort.seeds import model_call_seed
    from forklab.experiments.cohort.spec import PatchMode, PatchTarget, PromptPatch
    from forklab.experiments.runfork.identity import lineage_root
    from forklab.experiments.runfork.policy import Decision, decide, policy_for, uses_records
    from forklab.experiments.runfork.receipt import BoundaryMode
    from forklab.experiments.runfork.steps import Step, StepOrigin, StepStatus, payload_digest
    from forklab.experiments.validation_text import first_error

_FORK_ACTIVITY_TIMEOUT = timedelta(minutes=2)
_FORK_RETRY = RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=10))


class ForkInterceptor(Interceptor):
    """Add to every worker that runs (or replays) workflows that may be forked."""

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        return _ForkInbound


class _ForkState:
    """Per workflow run: the marker, the inherited prefix, the calls made so far."""

    def __init__(self) -> None:
        self.marker: ForkMarker | None = None
        self.prefix: dict[int, Step] = {}
        self.recorded: dict[tuple[str, str], Step] = {}
        #: steps of the chain before this run
        self.base = 0
        self.calls = 0
        self.lineage_root = ""
        #: results (JSON) of each tool's live calls on this fork, oldest first: what an
        #: injected ``stale_data`` fault answers with
        self.tool_results: dict[str, list[Any]] = {}

    def next_index(self) -> int:
        self.calls += 1
        return self.base + self.calls


def current_fork() -> ForkMarker | None:
    """The fork marker of the running workflow (None for a run that is not a fork), for
    workflow code that reads the fork's intervention after the boundary.

    The memo is whatever the starter wrote, so a marker that is not one fails the run
    (non-retryable): a validation error would otherwise fail the workflow task, which
    Temporal retries for ever, leaving the run open and stuck."""
    raw = workflow.memo().get(MARKER_MEMO_KEY) if workflow.memo() else None
    if raw is None:
        return None
    try:
        return ForkMarker.model_validate(raw)
    except ValidationError as exc:
        raise ApplicationError(
            f"memo {MARKER_MEMO_KEY!r} is not a fork marker ({first_error(exc)}); "
            "start forks with `forklab fork`",
            type=ForkErrorType.marker_invalid,
            non_retryable=True,
        ) from None


def _base_step(marker: ForkMarker | None) -> int:
    raw = workflow.memo().get(BASE_STEP_MEMO_KEY) if workflow.memo() else None
    if isinstance(raw, int):
        return raw
    return marker.base_step if marker is not None else 0


class _ForkInbound(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        self._state = _ForkState()
        super().init(_ForkOutbound(outbound, self._state))

    async def execute_workflow(self, input: _ExecuteWorkflowInput) -> Any:
        state = self._state
        info = workflow.info()
        state.lineage_root = lineage_root(info.workflow_id, info.first_execution_run_id)
        marker = current_fork()
        state.base = _base_step(marker)
        if marker is not None:
            state.marker = marker
            state.lineage_root = marker.lineage_root
            if _inherits(marker):
                await _load_prefix(state, marker)
        return await super().execute_workflow(input)


def _inherits(marker: ForkMarker) -> bool:
    """Whether the fork reads its parent's record: steps to serve, or recorded calls its
    policies may serve (none when it starts from a checkpoint at the boundary and every
    policy is ``live`` or ``block``)."""
    if marker.boundary is BoundaryMode.lineage_only or marker.continued:
        return False
    return marker.at_step > marker.base_step or uses_records(marker.tool_policies)


async def _load_prefix(state: _ForkState, marker: ForkMarker) -> None:
    start = marker.base_step + 1
    while True:
        page: PrefixPage = await workflow.execute_activity(
            FETCH_PREFIX,
            FetchPrefixInput(
                workflow_id=marker.parent_workflow_id,
                run_id=marker.source_run_id,
                base_step=marker.base_step,
                from_step=start,
                upto_step=marker.at_step,
            ),
            result_type=PrefixPage,
            start_to_close_timeout=_FORK_ACTIVITY_TIMEOUT,
            retry_policy=_FORK_RETRY,
            summary=f"fork: inherit steps {start}..{marker.at_step} of {marker.parent_workflow_id}",
        )
        for s in page.steps:
            state.prefix[s.index] = s
        for s in page.recorded_after:
            state.recorded.setdefault((s.activity_type, s.input_sha256), s)
        if page.next_step is None:
            break
        start = page.next_step
    for s in state.prefix.values():
        if s.status is StepStatus.completed:
            state.recorded.setdefault((s.activity_type, s.input_sha256), s)


def _input_digest(args: Any) -> str:
    payloads = workflow.payload_converter().to_payloads(list(args))
    return payload_digest([(p.metadata.get("encoding", b""), p.data) for p in payloads])


def _decode(step: Step, ret_type: type | None) -> Any:
    payload = Payload.FromString(base64.b64decode(step.result_b64 or ""))
    converter = workflow.payload_converter()
    return (
        converter.from_payload(payload, ret_type) if ret_type else converter.from_payload(payload)
    )


def _blocked(tool: str, index: int, why: str) -> ApplicationError:
    return ApplicationError(
        f"step {index} ({tool}) {why}", type=ForkErrorType.tool_blocked, non_retryable=True
    )


def _swap_model(input: StartActivityInput, model: str) -> StartActivityInput:
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


def _patch_prompt(input: StartActivityInput, patch: PromptPatch) -> StartActivityInput:
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


def _with_seed(input: StartActivityInput, seed: int) -> StartActivityInput:
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


def _json_of(step: Step) -> Any:
    payload = Payload.FromString(base64.b64decode(step.result_b64 or ""))
    try:
        return json.loads(payload.data)
    except ValueError:
        return None


class _ForkOutbound(WorkflowOutboundInterceptor):
    def __init__(self, next: WorkflowOutboundInterceptor, state: _ForkState) -> None:
        super().__init__(next)
        self._state = state

    def _headers(self, input: StartActivityInput, index: int) -> StartActivityInput:
        conv = workflow.payload_converter()
        headers = dict(input.headers)
        headers[LINEAGE_HEADER] = conv.to_payloads([self._state.lineage_root])[0]
        headers[STEP_HEADER] = conv.to_payloads([index])[0]
        headers[CHAIN_HEADER] = conv.to_payloads([workflow.info().first_execution_run_id])[0]
        return dataclasses.replace(input, headers=headers)

    def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle[Any]:
        if input.activity.startswith(INTERNAL_PREFIX):
            return super().start_activity(input)
        state = self._state
        index = state.next_index()
        marker = state.marker
        if input.summary is None:
            input = dataclasses.replace(input, summary=f"step {index}: {input.activity}")
        if marker is None:
            return super().start_activity(self._headers(input, index))
        model = marker.model_at(index)
        if model is not None:
            input = _swap_model(input, model)
        if (
            marker.boundary is not BoundaryMode.lineage_only
            and not marker.continued
            and index <= marker.at_step
        ):
            return self._serve_prefix(input, index, marker)
        if marker.cohort is not None and input.activity in MODEL_FIELDS:
            return self._cohort_model_call(input, index, marker.cohort)
        digest = _input_digest(input.args)
        recorded = state.recorded.get((input.activity, digest))
        decision = decide(input.activity, marker.tool_policies, recorded is not None)
        if decision is Decision.run_live:
            handle = super().start_activity(self._headers(input, index))
            if marker.cohort is not None and marker.cohort.faults:
                return workflow.ActivityHandle(self._faulted(handle, input, index, marker.cohort))
            return handle
        policy = policy_for(input.activity, marker.tool_policies).value
        note = StepDecisionInput(
            index=index,
            activity_type=input.activity,
            input_sha256=digest,
            decision=(
                StepOrigin.replayed if decision is Decision.serve_recorded else StepOrigin.blocked
            ),
            policy=policy,
            result_b64=recorded.result_b64
            if decision is Decision.serve_recorded and recorded
            else None,
            result_sha256=recorded.result_sha256
            if decision is Decision.serve_recorded and recorded
            else None,
        )
        return workflow.ActivityHandle(self._decided(input, note))

    async def _decided(self, input: StartActivityInput, note: StepDecisionInput) -> Any:
        await workflow.execute_activity(
            STEP_DECISION,
            note,
            result_type=StepDecisionInput,
            start_to_close_timeout=_FORK_ACTIVITY_TIMEOUT,
            retry_policy=_FORK_RETRY,
            summary=f"step {note.index}: {input.activity} {note.decision} (policy {note.policy})",
        )
        if note.result_b64 is None:
            why = (
                "is blocked on this fork"
                if note.policy == "block"
                else "has no exact recorded call to replay"
            )
            raise _blocked(input.activity, note.index, f"{why} (policy {note.policy})")
        step = Step(
            index=note.index,
            activity_type=note.activity_type,
            input_sha256=note.input_sha256,
            status=StepStatus.completed,
            run_id="",
            result_b64=note.result_b64,
        )
        return _decode(step, input.ret_type)

    def _cohort_model_call(
        self, input: StartActivityInput, index: int, cohort: CohortFork
    ) -> workflow.ActivityHandle[Any]:
        """A live model call of an experiment's fork: a brownout fails it instead; else
        it runs with the world's prompt patch and this call's seed (a function of the
        experiment seed, the run, the fork and the step index, never of the world)."""
        site = CallSite(seed=cohort.seed, run=cohort.run, fork=cohort.fork, call=index)
        hit = apply_faults(cohort.faults, site)
        if hit.error is not None:
            why = f"an injected brownout: the model provider answered {hit.error.value}"
            return workflow.ActivityHandle(self._injected(input, index, why))
        if cohort.prompt_patch is not None:
            input = _patch_prompt(input, cohort.prompt_patch)
        seed = model_call_seed(cohort.seed, cohort.run, cohort.fork, index)
        input = _with_seed(self._headers(input, index), seed)
        headers = dict(input.headers)
        headers[MODEL_SEED_HEADER] = workflow.payload_converter().to_payloads([seed])[0]
        return super().start_activity(dataclasses.replace(input, headers=headers))

    async def _injected(self, input: StartActivityInput, index: int, why: str) -> Any:
        raise ApplicationError(
            f"step {index} ({input.activity}) failed with {why}",
            type=ForkErrorType.injected_fault,
            non_retryable=True,
        )

    async def _faulted(
        self,
        handle: workflow.ActivityHandle[Any],
        input: StartActivityInput,
        index: int,
        cohort: CohortFork,
    ) -> Any:
        """The live tool call's result after the world's faults; one the call's result
        type cannot read any more fails the call, as a broken response would."""
        result = await handle
        conv = workflow.payload_converter()
        try:
            value = json.loads(conv.to_payloads([result])[0].data)
        except ValueError:
            return result
        earlier = self._state.tool_results.setdefault(input.activity, [])
        if not earlier:
            earlier.extend(
                _json_of(s)
                for s in sorted(self._state.prefix.values(), key=lambda s: s.index)
                if s.activity_type == input.activity and s.status is StepStatus.completed
            )
        site = CallSite(
            seed=cohort.seed, run=cohort.run, fork=cohort.fork, call=index, tool=input.activity
        )
        out = apply_faults(cohort.faults, site, value, list(earlier))
        earlier.append(value)
        if not out.applied:
            return result
        if input.ret_type is None:
            return out.value
        changed = Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(out.value).encode())
        try:
            return conv.from_payload(changed, input.ret_type)
        except Exception:  # whatever the result type's reader raises on a broken response
            kinds = ", ".join(k.value for k in out.applied)
            why = f"an injected {kinds}: its response no longer reads as its result type"
            return await self._injected(input, index, why)

    def _serve_prefix(
        self, input: StartActivityInput, index: int, marker: ForkMarker
    ) -> workflow.ActivityHandle[Any]:
        step = self._state.prefix.get(index)
        if step is None:
            raise ApplicationError(
                f"step {index} is not in the inherited prefix",
                type=ForkErrorType.prefix_diverged,
                non_retryable=True,
            )
        if step.activity_type != input.activity:
            raise ApplicationError(
                f"at step {index} the parent called {step.activity_type} "
                f"and the fork calls {input.activity}",
                type=ForkErrorType.prefix_diverged,
                non_retryable=True,
            )
        if marker.boundary is BoundaryMode.exact and _input_digest(input.args) != step.input_sha256:
            raise ApplicationError(
                f"at step {index} ({input.activity}) the fork's input differs "
                "from the parent's (an exact boundary inherits only identical calls)",
                type=ForkErrorType.prefix_diverged,
                non_retryable=True,
            )
        return workflow.ActivityHandle(self._served(input, step))

    async def _served(self, input: StartActivityInput, step: Step) -> Any:
        if step.status is StepStatus.blocked:
            raise _blocked(input.activity, step.index, "was blocked on the parent fork")
        return _decode(step, input.ret_type)

    def continue_as_new(self, input: ContinueAsNewInput) -> Any:
        memo = dict(input.memo) if input.memo is not None else dict(workflow.memo())
        memo[BASE_STEP_MEMO_KEY] = self._state.base + self._state.calls
        marker = self._state.marker
        if marker is not None:  # the next run serves no prefix, and stays this fork
            memo[MARKER_MEMO_KEY] = marker.model_copy(update={"continued": True}).model_dump(
                mode="json"
            )
        return super().continue_as_new(dataclasses.replace(input, memo=memo))
