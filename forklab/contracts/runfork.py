"""Messages between a fork's workflow (the interceptor) and the fork activities, and the
fork marker a fork carries in its memo."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from forklab.experiments.cohort.faults import Fault
from forklab.experiments.cohort.spec import PromptPatch
from forklab.experiments.runfork.overrides import ForkSignal, InputOverride, ResultOverride
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.prefix_messages import PrefixMessage
from forklab.experiments.runfork.receipt import BoundaryMode
from forklab.experiments.runfork.steps import Step, StepOrigin
from forklab.experiments.runfork.team_receipt import member_fork_id

#: Memo key of the fork marker (kept on continue-as-new with ``continued`` set: the later
#: runs of a fork inherit nothing more, but keep its lineage, policies, model and
#: intervention).
MARKER_MEMO_KEY = "forklab_fork"
#: Memo key the interceptor writes on every continue-as-new: the number of steps the
#: chain made before the new run. It indexes the chain: the run holding step N is found
#: from the runs' first events alone, without reading (or counting) earlier histories.
BASE_STEP_MEMO_KEY = "forklab_base_step"
#: Start header holding the receipt (a copy of what the registry holds), in the fork's
#: first event: a header, not a memo value, because Temporal warns past 2 KiB of memo on
#: every start and the marker and the receipt together pass it (an experiment's fork, a
#: team member's), while headers have no such limit. The Web UI shows the receipt in the
#: start's details.
RECEIPT_HEADER = "forklab-receipt"
#: Memo key of the receipt on forks started before it moved to ``RECEIPT_HEADER``: read
#: so their histories still show it, never written.
RECEIPT_MEMO_KEY = "forklab_receipt"
#: Activity header naming the lineage root (``forklab.experiments.runfork.identity``),
#: read by the effect ledger.
LINEAGE_HEADER = "forklab-lineage-root"
#: Activity header naming the first run id of the calling chain: the run log's stream.
CHAIN_HEADER = "forklab-chain"
#: Activity header naming a call's place in its run's scheduling order (chain-wide, like
#: step numbers; for calls in sequence it is their step number).
STEP_HEADER = "forklab-step"
#: Activity header carrying the seed a model call sends to the model (an experiment's
#: fork only): a header, not a field of the call's input, so the input (and its digest,
#: which an exact boundary compares) stays what the agent wrote.
MODEL_SEED_HEADER = "forklab-model-seed"
#: Workflow start header carrying a fork's prefix page (``forklab fork`` read and parsed
#: the parent's run to find the step, and passes what ``forklab.fetch_prefix`` would read
#: again): served only when it matches the digest in the fork's signed marker.
PREFIX_PAGE_HEADER = "forklab-prefix-page"
#: ForkLab's own activities; they are not steps of a run.
INTERNAL_PREFIX = "forklab."
FETCH_PREFIX = "forklab.fetch_prefix"
STEP_DECISION = "forklab.step_decision"
VERIFY_FORK = "forklab.verify_fork"
#: Records, in a fork's own history, an inherited call served although the fork asked
#: with another input (``approximations.DriftRecord``): append-only, beside the receipt.
RECORD_DRIFT = "forklab.record_drift"
#: Forks whose prefix draws ``workflow.random()`` from its parent's seed and reads its
#: parent's ``workflow.now()`` (the patch marks their histories).
SIDE_EFFECTS_PATCH = "forklab-parent-side-effects"
#: The query a fork answers with its :class:`ForkPoint` (``forklab fork`` waits on it).
FORK_POINT_QUERY = "forklab.fork_point"
#: Activity types whose input names a model, and the field: ``--model`` rewrites it on
#: every live call (the OpenAI Agents SDK's model activity and ForkLab's chat call).
MODEL_FIELDS = {"invoke_model_activity": "model_name", "chat_model": "model"}
#: A step whose (JSON) result has this key says which sealed layer holds the run's
#: workspace after it; a fork at step N starts from the last such layer at or before N.
WORKSPACE_LAYER_FIELD = "workspace_layer"
#: Forks run on their parent's task queue with this suffix, which only workers with
#: ``ForkLabPlugin`` poll: a worker without the fork interceptor would run the fork as an
#: ordinary run, re-executing every inherited step live.
FORK_QUEUE_SUFFIX = "@forklab"


def fork_task_queue(queue: str) -> str:
    """The queue a fork of a run recorded on ``queue`` starts on (a fork of a fork stays on
    its parent's)."""
    return queue if queue.endswith(FORK_QUEUE_SUFFIX) else queue + FORK_QUEUE_SUFFIX


#: The error type of a call a fork refuses (block policy, replay miss).
#: a memo marker that is no fork marker: the run fails instead of retrying its task


class ModelSwap(BaseModel):
    """From step ``after_step + 1`` on, live model calls use ``model``."""

    model_config = ConfigDict(frozen=True)

    after_step: int = Field(ge=0)
    model: str


class CohortFork(BaseModel):
    """What an experiment over a cohort adds to one fork: its coordinates for per-call
    model seeds and faults (``forklab.experiments.cohort.seeds``, ``.faults``), and the
    world's prompt patch and faults, applied by the interceptor to live calls after the
    fork point."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    experiment: str = Field(min_length=1, max_length=300)
    seed: int = Field(ge=0)
    #: the run's place in the cohort plan and the fork's index in its world
    run: int = Field(ge=0)
    fork: int = Field(ge=0)
    world: str = Field(min_length=1, max_length=64)
    prompt_patch: PromptPatch | None = None
    faults: list[Fault] = Field(default_factory=list, max_length=20)


#: The signal a team fork's coordinator sends each member fork once every member exists;
#: its one argument is the team fork's release token.
TEAM_RELEASE_SIGNAL = "forklab.team_release"


def release_digest(token: str) -> str:
    """What a member's marker signs of its team fork's release token (``TeamPart``). Any
    string has one: a release is anyone's signal, and a lone surrogate that a JSON decoder
    lets through must not fail the held member's workflow task."""
    return hashlib.sha256(
        b"forklab-team-release\n" + token.encode("utf-8", "surrogatepass")
    ).hexdigest()


#: Activity header carrying a team fork member's addresses (``TeamPart``), read by the
#: team's messaging activity: an update goes to the receiver's fork, never its original.
TEAM_HEADER = "forklab-team"


class TeamPart(BaseModel):
    """What a member of a team fork adds to its marker: the team fork it belongs to and
    where its messages go.

    The addresses (``all_addresses``) map a workflow id the member's code may name (an
    original member, or a member of the team fork it was forked from) to the fork that
    stands for it in this fork world; a send to any other workflow (an original without a
    fork, a workflow outside the team) is blocked, so nothing a fork sends reaches an
    original. ``held``: the member runs nothing until the team fork's coordinator (the
    workflow ``team_fork_id``) releases it, once every member's fork exists.

    The part travels in every member's memo with its marker, which Temporal wants under
    2 KiB: the team fork's own members are named once each (``forked``), their forks'
    ids following from it, so a team of 30 stays under it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    team_fork_id: str = Field(min_length=1, max_length=200)
    #: the originals this team fork forked: each one's fork is
    #: ``<team_fork_id>/<original>`` (``member_fork_id``)
    forked: list[str] = Field(default_factory=list, max_length=200)
    #: any other id the member's code may name → the fork standing for it (an original of
    #: the team fork this one was forked from)
    addresses: dict[str, str] = Field(default_factory=dict, max_length=200)
    #: the team's members that have no fork here (frozen, inherited, absent, and the
    #: originals the members were forked from): no child is ever started under their ids
    without_fork: list[str] = Field(default_factory=list, max_length=400)
    held: bool = True
    #: the digest (``release_digest``) of the token its coordinator's release carries: a
    #: held member takes a release only with that token, so nobody else's
    #: ``forklab.team_release`` lets it run before its whole team exists (None: a member
    #: forked before releases carried a token, which takes any)
    release_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")

    @property
    def all_addresses(self) -> dict[str, str]:
        """Every id the member's code may name → the fork standing for it."""
        own = {o: member_fork_id(self.team_fork_id, o) for o in self.forked}
        return {**own, **self.addresses}

    def address(self, target: str) -> str | None:
        """Where a send to ``target`` goes in this fork world (None: nowhere)."""
        addresses = self.all_addresses
        if target in addresses:
            return addresses[target]
        if target in addresses.values():
            return target
        return None


class ForkMarker(BaseModel):
    """What makes a workflow a fork: read by the worker interceptor at start."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    parent_workflow_id: str
    source_run_id: str
    base_step: int = Field(ge=0)
    at_step: int = Field(ge=0)
    boundary: BoundaryMode
    lineage_root: str
    model: str | None = None
    #: every swap along the lineage, oldest first (this fork's own last): a fork of a fork
    #: must make the calls its parent made after the parent's own swap
    model_swaps: list[ModelSwap] = Field(default_factory=list)
    tool_policies: dict[str, ToolPolicy] = Field(default_factory=dict)
    intervention: dict[str, Any] | None = None
    #: step ``at_step``'s result replaced (``forklab fork --override-result``)
    result_override: ResultOverride | None = None
    #: step ``at_step + 1`` runs live with another input (``--override-input``)
    input_override: InputOverride | None = None
    #: delivered to the workflow's signal handlers at the fork point (``--signal``)
    signals: list[ForkSignal] = Field(default_factory=list)
    #: set on the forks an experiment over a cohort starts
    cohort: CohortFork | None = None
    #: set on the member forks of a team fork (``forklab fork-team``)
    team: TeamPart | None = None
    #: a later run of the fork (it continued-as-new): nothing to inherit any more
    continued: bool = False
    #: what the issuer's signature binds (``forklab.contracts.fork_signature``): the fork's
    #: own workflow id, the sha256 of its start input, when and with which key it was
    #: issued; None on markers made before forks were signed (old histories replay)
    fork_workflow_id: str | None = None
    start_input_sha256: str | None = None
    issued_at: datetime | None = None
    #: the builds (Worker Deployment Version, else build id) that recorded the prefix,
    #: comma-separated (None: the history names none)
    parent_build: str | None = None
    #: ``forklab fork --allow-build-change``: a fork running another build whose prefix
    #: notices the change is served the parent's results matched by type (approximately)
    #: instead of failing
    allow_build_change: bool = False
    #: the sha256 of the prefix page passed in the fork's start header
    #: (``PREFIX_PAGE_HEADER``, ``fork_signature.prefix_page_sha256``), which the fetch then
    #: serves instead of reading the parent's history; None: nothing passed, the fetch
    #: reads. Signed, but not written to the memo (which Temporal wants under 2 KiB): the
    #: page stands for it, and a verifier takes it from the page the run's start carries
    prefix_page_sha256: str | None = None
    issuer_key: str | None = None
    signature: str | None = None
    #: a child workflow of a fork (or of any run), named by its parent's workflow id: it
    #: inherits no steps, only the lineage root, policies, swaps and intervention; the
    #: server, not the memo, says who its parent is
    child_of: str | None = None

    def model_at(self, index: int) -> str | None:
        """The model a call at step ``index`` uses (None: the workflow's own choice)."""
        chosen = None
        for swap in self.model_swaps:
            if index > swap.after_step:
                chosen = swap.model
        return chosen


class FetchPrefixInput(BaseModel):
    model_config = ConfigDict(frozen=True)

    workflow_id: str
    run_id: str
    #: steps before this run of the chain (its own steps are numbered after them)
    base_step: int = 0
    #: the first step this page returns and the last step of the prefix (global indexes)
    from_step: int
    upto_step: int
    max_bytes: int = 1_000_000
    #: served in place of the recorded result of its step
    result_override: ResultOverride | None = None
    #: on a fork's first run, the first page's: the marker the activity verifies (as
    #: ``forklab.verify_fork`` does) before it reads anything of the parent
    marker: ForkMarker | None = None
    #: with ``marker``: the fork's start carries its whole prefix (``PREFIX_PAGE_HEADER``),
    #: and the workflow reads it there; the activity verifies the marker, whose signature
    #: covers that page, and answers with the verdict alone (``PrefixPage.in_start``), so
    #: the fork's history holds the page once
    page_in_start: bool = False


class PrefixPage(BaseModel):
    """Part of the prefix: inherited steps with their results; on the last page also the
    parent's completed calls after the boundary (for ``auto``/``replay`` policies) and the
    calls it had in flight at the boundary."""

    steps: list[Step]
    next_step: int | None = None
    recorded_after: list[Step] = Field(default_factory=list)
    #: on the last page: the parent's calls still running when the boundary step completed
    #: (``call_match.in_flight``, results stripped); the fork runs them live
    in_flight: list[Step] = Field(default_factory=list)
    #: the signals and accepted updates the parent received among this page's steps
    #: (``prefix_messages.inside``), redelivered at the same points
    messages: list[PrefixMessage] = Field(default_factory=list)
    #: steps handed over → the time (ns) of the parent's workflow task that handed the
    #: last of them over, for this page's steps (and the one before them)
    clock: dict[int, int] = Field(default_factory=dict)
    #: the seed of the parent's ``workflow.random()`` (first page only; None: unknown)
    seed: int | None = None
    #: the verdict of a fetch asked ``page_in_start``: the marker is verified with the page
    #: the run's start carries, which is the prefix (this page itself is empty)
    in_start: bool = False


class ForkPoint(BaseModel):
    """Where a running fork stands: whether every inherited result and message has been
    handed over (it is past its prefix, and its next call is its own), the inherited calls
    an approximate boundary served although their input differs from the parent's, and the
    build running it."""

    reached: bool
    #: one sentence per inherited call served with another input than the parent's
    drift: list[str] = Field(default_factory=list)
    #: the Worker Deployment Version or build id of the worker running the fork
    build: str | None = None


class VerifyForkInput(BaseModel):
    """The marker a fork's first run found in its memo, for the worker to verify against
    its trusted issuers and the run's own recorded start."""

    model_config = ConfigDict(frozen=True)

    marker: ForkMarker


class StepDecisionInput(BaseModel):
    """A live call a fork did not run: served from the record, or blocked."""

    model_config = ConfigDict(frozen=True)

    index: int
    activity_type: str
    input_sha256: str
    decision: StepOrigin
    policy: ToolPolicy
    result_b64: str | None = None
    result_sha256: str | None = None
    #: set for a local activity or child workflow the policy refused (``local activity``,
    #: ``child workflow``): no step, shown after the step it followed
    acting: str | None = None


class RunSummary(BaseModel):
    """What locating a step needs of a run whose first event does not record its place in
    the chain (a run continued-as-new by a worker without this interceptor's memo). Runs
    that continued-as-new never change again, so their summaries may be cached."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    steps: int
    previous_run_id: str | None
    #: the run's own base when its first event records it (a fork's first run, a run the
    #: fork interceptor continued-as-new); its steps are numbered after this
    fork_base_step: int | None = None
    marker_json: str | None = None
    receipt_json: str | None = None
