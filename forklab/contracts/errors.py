"""The failure types ForkLab raises, one enum per half.

Each value is the ``type`` of a Temporal ``ApplicationError``: it is what a workflow's
``except`` reads, what ``temporal workflow show`` prints and what tests assert on, so it is
spelled once, here. Values are stable: recorded histories carry them.
"""

from __future__ import annotations

from enum import StrEnum


class ExperimentErrorType(StrEnum):
    """Why an experiment's workflow or one of its activities failed."""

    #: the workflow's input is malformed (e.g. a carried state that does not parse)
    bad_input = "BadInput"
    #: the spec cannot run as written (a field, a workload parameter)
    bad_spec = "BadSpec"
    #: a world group's request does not fit the plan
    bad_group = "BadGroup"
    #: the workload's bundle is missing, tampered with or over a limit
    workload_bundle = "WorkloadBundle"
    #: the workload broke its contract (state, features, outcome, determinism)
    workload_contract = "WorkloadContract"
    rehearsal_failed = "RehearsalFailed"
    #: no working bubblewrap on the worker, and its policy does not allow the fallback
    unconfined_refused = "UnconfinedRefused"
    #: the run failed before anyone approved it
    failed_before_approval = "FailedBeforeApproval"
    snapshot_unavailable = "SnapshotUnavailable"
    snapshot_mismatch = "SnapshotMismatch"
    #: a snapshot's files differ from the digest the plan names
    snapshot_corrupted = "SnapshotCorrupted"
    prefix_failed = "PrefixFailed"
    no_workspaces = "NoWorkspaces"
    workspace_unavailable = "WorkspaceUnavailable"
    analysis_failed = "AnalysisFailed"
    #: a shared store stayed unreachable for longer than the worker waits (retryable)
    store_unavailable = "StoreUnavailable"


class ForkErrorType(StrEnum):
    """Why a fork (or an agent run's ForkLab activity) failed."""

    #: a call the fork's tool policy blocks (``block``, or ``replay`` with no record)
    tool_blocked = "fork_tool_blocked"
    #: the fork's calls do not match the inherited prefix
    prefix_diverged = "fork_prefix_diverged"
    #: the fork marker is malformed or cannot be served
    marker_invalid = "fork_marker_invalid"
    #: a well-formed marker this worker cannot verify was issued for this run (unsigned,
    #: an untrusted key, copied to another workflow id, another input, altered)
    marker_unverified = "fork_marker_unverified"
    #: a verified marker whose inherited prefix holds a step that cannot be served
    prefix_unservable = "fork_prefix_unservable"
    #: another attempt holds the effect's claim
    effect_held = "effect_held"
    #: an agent worker's workflow input, signal, update or activity input holds a
    #: non-finite number, nests too deeply, is too large or has the wrong shape
    #: (``forklab.workers.runfork.agent_converter``, ``forklab.workflows.runfork.finite_payloads``)
    payload_refused = "payload_refused"
    #: the same idempotency key with another request
    idempotency_mismatch = "idempotency_mismatch"
    #: a fenced write by an attempt that lost its claim
    fenced = "fenced"
    workspace_bad_path = "workspace_bad_path"
    workspace_error = "workspace_error"
    workspace_layer_corrupted = "workspace_layer_corrupted"
    #: a fault an experiment's world injected (a brownout, a tool response it broke)
    injected_fault = "fork_injected_fault"
    #: a fork picked up by a build other than those its receipt named (the builds polling
    #: its queue when it started), without ``--allow-build-change``: it ran nothing live
    #: a team fork's member whose coordinator never released it (it ran nothing)
    team_not_released = "fork_team_not_released"
    #: a team fork's member sent a message to a workflow outside its fork world (an
    #: original member without a fork, or a workflow outside the team): not delivered
    team_send_blocked = "fork_team_send_blocked"
