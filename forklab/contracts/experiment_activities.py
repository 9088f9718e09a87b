"""The experiment workflow's activities, by reference: name, input, output."""

from __future__ import annotations

from forklab.contracts.activity import ActivityRef
from forklab.contracts.experiment import (
    AnalyseInput,
    AnalysisResult,
    ApprovalPolicy,
    ApproverPolicy,
    BatchInput,
    CapacityInput,
    CapacityVerdict,
    CleanupInput,
    CleanupResult,
    EvidenceInput,
    EvidenceLogResult,
    GroupOutcome,
    KeyInput,
    KeyIssued,
    LedgerInput,
    LookInput,
    LookResult,
    PlanSnapshot,
    PolicyInput,
    PrefixInput,
    PrefixRef,
    PrefixRefsInput,
    PrefixResult,
    Rehearsal,
    RehearsedPrefixInput,
    RehearseInput,
    SaveProgressInput,
    SnapshotInput,
)

# planning (no sandbox compute)
APPROVAL_POLICY = ActivityRef[PolicyInput, ApprovalPolicy](
    "approval_policy", PolicyInput, ApprovalPolicy
)
APPROVER_POLICY = ActivityRef[PolicyInput, ApproverPolicy](
    "approver_policy", PolicyInput, ApproverPolicy
)
ISSUE_APPROVAL_KEY = ActivityRef[KeyInput, KeyIssued]("issue_approval_key", KeyInput, KeyIssued)
REHEARSE = ActivityRef[RehearseInput, Rehearsal]("rehearse", RehearseInput, Rehearsal)
RESOLVE_SNAPSHOT = ActivityRef[SnapshotInput, PlanSnapshot](
    "resolve_snapshot", SnapshotInput, PlanSnapshot
)
CHECK_CAPACITY = ActivityRef[CapacityInput, CapacityVerdict](
    "check_capacity", CapacityInput, CapacityVerdict
)
REHEARSED_PREFIX = ActivityRef[RehearsedPrefixInput, PrefixResult](
    "rehearsed_prefix", RehearsedPrefixInput, PrefixResult
)
# sandboxes
RUN_PREFIXES = ActivityRef[PrefixInput, PrefixResult]("run_prefixes", PrefixInput, PrefixResult)
RUN_WORLD_GROUP = ActivityRef[BatchInput, GroupOutcome]("run_world_group", BatchInput, GroupOutcome)
CLEANUP_SANDBOXES = ActivityRef[CleanupInput, CleanupResult](
    "cleanup_sandboxes", CleanupInput, CleanupResult
)
# records
SAVE_PROGRESS = ActivityRef[SaveProgressInput, str]("save_progress", SaveProgressInput, str)
LOAD_PREFIX_REFS = ActivityRef[PrefixRefsInput, list[PrefixRef]](
    "load_prefix_refs", PrefixRefsInput, list[PrefixRef]
)
DECIDE_LOOK = ActivityRef[LookInput, LookResult]("decide_look", LookInput, LookResult)
ANALYSE = ActivityRef[AnalyseInput, AnalysisResult]("analyse", AnalyseInput, AnalysisResult)
WRITE_READOUT = ActivityRef[AnalysisResult, AnalysisResult](
    "write_readout", AnalysisResult, AnalysisResult
)
RECORD_LEDGER = ActivityRef[LedgerInput, None]("record_ledger", LedgerInput, None)
LOG_EVIDENCE = ActivityRef[EvidenceInput, EvidenceLogResult](
    "log_evidence", EvidenceInput, EvidenceLogResult
)
