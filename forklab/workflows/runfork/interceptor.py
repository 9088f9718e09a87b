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

The mechanism's parts, each in its own module beside this one: ``fork_state`` (what a run
keeps, and ``current_fork``), ``fork_inbound`` (a run's start and its live messages),
``prefix_load`` (the marker verified, the prefix loaded), ``fork_outbound`` (each call the
workflow makes), ``served_calls`` (recorded outcomes handed over), ``call_rewrites``
(headers, model swap, prompt patch, seed), ``injected_faults``, ``policy_refusals`` and
``child_markers``.
"""

from __future__ import annotations

from temporalio.worker import (
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from forklab.workflows.runfork.fork_inbound import ForkInbound
from forklab.workflows.runfork.fork_state import current_fork

#: ``current_fork`` is public here too: workflow code reads its fork's intervention with it
__all__ = ["ForkInterceptor", "current_fork"]


class ForkInterceptor(Interceptor):
    """Add to every worker that runs (or replays) workflows that may be forked."""

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        return ForkInbound
