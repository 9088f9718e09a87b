"""The outbound side of the fork interceptor: each call the workflow makes, served from
the parent's record, decided by the fork's policies, or run live as the fork rewrites it;
children started with their marker; continue-as-new carrying the fork on."""

from __future__ import annotations

import dataclasses
from typing import Any

from temporalio import workflow
from temporalio.worker import (
    ContinueAsNewInput,
    SignalExternalWorkflowInput,
    StartActivityInput,
    StartChildWorkflowInput,
    StartLocalActivityInput,
    WorkflowOutboundInterceptor,
)

from forklab.workflows.runfork.call_rewrites import (
    patch_prompt,
    summarized,
    swap_model,
    with_headers,
    with_seed,
)
from forklab.workflows.runfork.child_cohort import tagged
from forklab.workflows.runfork.child_markers import child_marker
from forklab.workflows.runfork.drift_records import noted_drift
from forklab.workflows.runfork.fork_failures import diverged
from forklab.workflows.runfork.fork_memo import raw_memo
from forklab.workflows.runfork.fork_state import ForkState
from forklab.workflows.runfork.injected_faults import faulted, injected
from forklab.workflows.runfork.policy_refusals import refuse, refused_by_policy
from forklab.workflows.runfork.served_calls import decided, input_digest, serve_inherited
from forklab.workflows.runfork.stall_watch import Owed
from forklab.workflows.runfork.team_messages import addressed, child_id

with workflow.unsafe.imports_passed_through():
    from forklab.contracts.runfork import (
        BASE_STEP_MEMO_KEY,
        CHAIN_HEADER,
        INTERNAL_PREFIX,
        LINEAGE_HEADER,
        MARKER_MEMO_KEY,
        MODEL_FIELDS,
        MODEL_SEED_HEADER,
        RECEIPT_HEADER,
        CohortFork,
        StepDecisionInput,
    )
    from forklab.experiments.cohort.faults import CallSite, apply_faults
    from forklab.experiments.cohort.seeds import model_call_seed
    from forklab.experiments.runfork.blocked import CHILD_WORKFLOW, LOCAL_ACTIVITY
    from forklab.experiments.runfork.call_match import CallKey, Divergence
    from forklab.experiments.runfork.overrides import InputOverride
    from forklab.experiments.runfork.owed import child_not_inherited, signal_not_inherited
    from forklab.experiments.runfork.policy import Decision, decide, policy_for
    from forklab.experiments.runfork.steps import StepOrigin


#: Child workflows started with a child marker (the run's lineage root and, on a fork,
#: its policies); histories recorded before it replay without the patch marker.
CHILD_PATCH = "forklab-child-marker"
#: A child of a cohort experiment's fork carries the fork's ``cohort`` part in its marker
#: and the experiment's search attribute (``child_cohort``); histories of forks recorded
#: before it started children without them.
CHILD_COHORT_PATCH = "forklab-child-cohort"
#: A fork under an exact boundary that starts a child the parent had not started while it
#: still owes its prefix something fails instead of starting it; forks recorded before
#: it started such a child.
UNSERVED_CHILD_PATCH = "forklab-unserved-child-diverges"
#: The same for a signal to another workflow; forks recorded before it sent it.
UNSERVED_SIGNAL_PATCH = "forklab-unserved-signal-diverges"


def _override_key(override: InputOverride, exact: bool) -> CallKey:
    return CallKey(override.activity_type, override.input_sha256 if exact else "", override.ordinal)


class ForkOutbound(WorkflowOutboundInterceptor):
    def __init__(self, next: WorkflowOutboundInterceptor, state: ForkState) -> None:
        super().__init__(next)
        self._state = state

    async def signal_external_workflow(self, input: SignalExternalWorkflowInput) -> None:
        """A signal the parent sent inside the prefix (and its target acknowledged there)
        is not sent again: the send completes where the parent's acknowledgement came. An
        exact fork that sends another while it still owes its prefix something fails: it
        would reach its target before the fork point. Past it, on a team fork's member, a
        signal goes to the fork standing for its target in the fork world, never to an
        original; one with nowhere to go is blocked."""
        state = self._state
        served = state.redelivery.sent_signal(input.signal) if state.redelivery else None
        if served is not None:
            await served
            return
        exact = state.matcher is not None and state.matcher.exact
        if (
            exact
            and Owed(state.matcher, state.redelivery).any()
            and workflow.patched(UNSERVED_SIGNAL_PATCH)
        ):
            raise diverged(state, signal_not_inherited(input.signal, input.workflow_id))
        marker = self._state.marker
        if marker is not None and marker.team is not None:
            what = f"signal {input.signal[:100]!r}"
            to = addressed(marker.team, input.workflow_id, what, self._state.children)
            input = dataclasses.replace(input, workflow_id=to, workflow_run_id=None)
        await super().signal_external_workflow(input)

    def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle[Any]:
        if input.activity.startswith(INTERNAL_PREFIX):
            return super().start_activity(input)
        state = self._state
        index = state.next_index()
        marker = state.marker
        if marker is None:
            return super().start_activity(with_headers(state, summarized(input, index), index))
        matcher = state.matcher
        if matcher is not None and (matcher.owed or state.input_override is not None):
            # the call as the parent's lineage made it (its model swaps up to here)
            model = marker.model_at(index)
            seen = swap_model(input, model) if model is not None else input
            digest = input_digest(seen.args)
            key = matcher.key(seen.activity, digest)
            step = matcher.take(key)
            if step is not None:
                if step.input_sha256 != digest:  # an approximate boundary: say and record so
                    state.drift.append(noted_drift(step, digest))
                return workflow.ActivityHandle(serve_inherited(state, seen, step, matcher))
            input = summarized(input, index)  # a call the UI shows (a served one is none)
            try:
                matcher.check_live(key)
            except Divergence as exc:
                raise diverged(state, str(exc)) from None
            override = state.input_override
            if override is not None and key == _override_key(override, matcher.exact):
                # the parent's step N, asked something else: it runs live, whatever policy
                state.input_override = None
                asked = dataclasses.replace(input, args=[override.value, *input.args[1:]])
                return super().start_activity(with_headers(state, asked, index))
        # not inherited: the call comes after the boundary, whatever its place in the code
        input = summarized(input, index)
        after = max(index, marker.at_step + 1) if matcher is not None else index
        model = marker.model_at(after)
        if model is not None:
            swapped = swap_model(input, model)
            if swapped is not input:  # say so where the UI shows the call
                input = dataclasses.replace(swapped, summary=f"{swapped.summary} · model {model}")
        if marker.cohort is not None and input.activity in MODEL_FIELDS:
            return self._cohort_model_call(input, index, marker.cohort)
        digest = input_digest(input.args)
        recorded = state.recorded.get((input.activity, digest))
        decision = decide(input.activity, marker.tool_policies, recorded is not None)
        if decision is Decision.run_live:
            handle = super().start_activity(with_headers(state, input, index))
            if marker.cohort is not None and marker.cohort.faults:
                return workflow.ActivityHandle(faulted(state, handle, input, index, marker.cohort))
            return handle
        policy = policy_for(input.activity, marker.tool_policies)
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
        return workflow.ActivityHandle(decided(input, note))

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
            return workflow.ActivityHandle(injected(input, index, why))
        if cohort.prompt_patch is not None:
            input = patch_prompt(input, cohort.prompt_patch)
        seed = model_call_seed(cohort.seed, cohort.run, cohort.fork, index)
        input = with_seed(with_headers(self._state, input, index), seed)
        headers = dict(input.headers)
        headers[MODEL_SEED_HEADER] = workflow.payload_converter().to_payloads([seed])[0]
        return super().start_activity(dataclasses.replace(input, headers=headers))

    def start_local_activity(self, input: StartLocalActivityInput) -> workflow.ActivityHandle[Any]:
        """A local activity is no step (its input is not recorded, so it can be neither
        served nor matched), but the fork's policies still decide whether it runs, and it
        carries the lineage root, so a live effect meets the lineage's record in the
        effect ledger instead of being applied under a root of its own."""
        if input.activity.startswith(INTERNAL_PREFIX):
            return super().start_local_activity(input)
        refused = refused_by_policy(self._state, input.activity)
        if refused is not None:
            return workflow.ActivityHandle(refuse(self._state, LOCAL_ACTIVITY, input, refused))
        conv = workflow.payload_converter()
        headers = dict(input.headers)
        headers[LINEAGE_HEADER] = conv.to_payloads([self._state.lineage_root])[0]
        headers[CHAIN_HEADER] = conv.to_payloads([workflow.info().first_execution_run_id])[0]
        return super().start_local_activity(dataclasses.replace(input, headers=headers))

    async def start_child_workflow(
        self, input: StartChildWorkflowInput
    ) -> workflow.ChildWorkflowHandle[Any, Any]:
        """A child workflow acts for its parent: on a fork the policies decide whether it
        starts (by its workflow type) and its own calls follow them; every child carries
        its parent's lineage root (the effect ledger's key) in a child marker. The memo the
        workflow gives a child never carries a marker of its own making."""
        served = self._state.redelivery.child(input) if self._state.redelivery else None
        if served is not None:  # closed inside the prefix: its recorded outcome
            return served
        state = self._state
        exact = state.matcher is not None and state.matcher.exact
        owes = exact and Owed(state.matcher, state.redelivery).any()
        if owes and workflow.patched(UNSERVED_CHILD_PATCH):
            # every child an exact prefix holds closed inside it and is served: this one
            # is not the parent's, and would run live inside the prefix
            raise diverged(state, child_not_inherited(input.workflow, input.id))
        memo = dict(input.memo or {})
        memo.pop(MARKER_MEMO_KEY, None)
        refused = refused_by_policy(self._state, input.workflow)
        if refused is not None:
            await refuse(self._state, CHILD_WORKFLOW, input, refused)
        cohort = self._state.marker.cohort if self._state.marker is not None else None
        if cohort is not None and workflow.patched(CHILD_COHORT_PATCH):
            input = dataclasses.replace(
                input, search_attributes=tagged(input.search_attributes, cohort.experiment)
            )
        else:
            cohort = None
        marker = self._state.marker
        if marker is not None and marker.team is not None:
            input = dataclasses.replace(input, id=child_id(marker.team, input.id))
        self._state.children.add(input.id)
        if workflow.patched(CHILD_PATCH):
            memo[MARKER_MEMO_KEY] = child_marker(self._state, cohort).model_dump(mode="json")
        return await super().start_child_workflow(dataclasses.replace(input, memo=memo))

    def continue_as_new(self, input: ContinueAsNewInput) -> Any:
        memo = dict(input.memo) if input.memo is not None else raw_memo()
        memo[BASE_STEP_MEMO_KEY] = self._state.base + self._state.calls
        marker = self._state.marker
        if marker is not None:  # the next run serves no prefix, and stays this fork
            memo[MARKER_MEMO_KEY] = marker.model_copy(update={"continued": True}).model_dump(
                mode="json"
            )
        else:  # only a fork's own (verified) marker goes on: the server vouches for it
            memo.pop(MARKER_MEMO_KEY, None)
        headers = dict(input.headers)
        if marker is not None and self._state.receipt_header is not None:
            headers[RECEIPT_HEADER] = self._state.receipt_header
        return super().continue_as_new(dataclasses.replace(input, memo=memo, headers=headers))
