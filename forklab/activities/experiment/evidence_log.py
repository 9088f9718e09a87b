"""The Braintrust evidence log: each finished experiment as one root span (hypothesis,
spec, plan fingerprint, budget, approval) with one child span per world (outcomes
summary, world-seconds, snapshot, the sandboxes it ran in, inherited checkpoint digests
and the sandboxes that made them), the validity checks as scores in [0, 1].

It is an addition to the ledger, never a replacement: the local ledger row is written
first, by ``record_ledger``. Here a trace is first written to an outbox folder, then sent;
a trace that cannot be sent (Braintrust down, rate-limited, a bad key) stays queued and is
sent by the next experiment's attempt. The activity never raises for Braintrust's sake:
it reports what happened, and the workflow shows that in its status.

The SDK's background logger drops a batch it cannot send and only prints about it, so each
send runs in a private ``BraintrustState`` whose logger flushes synchronously and raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from temporalio import activity

from forklab.activities.experiment.progress import read_progress
from forklab.activities.files import atomic_write
from forklab.activities.sdk_errors import innermost_sentence
from forklab.activities.secrets_text import redact
from forklab.activities.stores.artifacts import ArtifactStore
from forklab.contracts.experiment import (
    EvidenceInput,
    EvidenceLogResult,
    EvidenceState,
    Progress,
)
from forklab.contracts.experiment_activities import LOG_EVIDENCE
from forklab.experiments.experiment.evidence_scores import experiment_scores, world_scores
from forklab.experiments.experiment.report.model import Report
from forklab.runtime.canon import canonical_json

#: Seconds one activity spends sending queued traces before it reports them still queued.
SEND_BUDGET_SECONDS = 60.0


class BraintrustConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    api_key: str = Field(min_length=1)
    app_url: str = "https://www.braintrust.dev"
    project: str = "forklab"


class Sandboxes(BaseModel):
    """The prefix checkpoints every world inherited, the sandboxes that made them (in
    chunk order; none for chunks the rehearsal handed over) and, per world, the backend's
    ids of the sandboxes its batches ran in, in chunk order (local ``lsb-…``, Daytona's
    own ids)."""

    model_config = ConfigDict(extra="forbid")

    checkpoint_digests: list[str] = Field(default_factory=list)
    prefix_sandbox_ids: list[str] = Field(default_factory=list)
    #: Prefix chunks the rehearsal ran and handed over (they had no sandbox).
    prefix_chunks_by_rehearsal: int = 0
    sandbox_ids: dict[str, list[str]] = Field(default_factory=dict)


def sandboxes(progress: Progress | None) -> Sandboxes:
    if progress is None:
        return Sandboxes()
    worlds: dict[str, list[str]] = {}
    for batch in progress.batches:  # in chunk order
        if batch.sandbox_id:
            worlds.setdefault(batch.world, []).append(batch.sandbox_id)
    return Sandboxes(
        checkpoint_digests=[p.checkpoints_digest for p in progress.prefixes],
        prefix_sandbox_ids=[p.sandbox_id for p in progress.prefixes if p.sandbox_id],
        prefix_chunks_by_rehearsal=sum(p.rehearsed for p in progress.prefixes),
        sandbox_ids=worlds,
    )


class Span(BaseModel):
    """One span as it is sent: the SDK's ``log`` fields."""

    model_config = ConfigDict(extra="forbid")

    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)
    output: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    scores: dict[str, float] = Field(default_factory=dict)


class Trace(BaseModel):
    model_config = ConfigDict(extra="forbid")

    experiment: str
    root: Span
    worlds: list[Span]


def build_trace(inp: EvidenceInput, report: Report | None, ran: Sandboxes) -> Trace:
    led = inp.ledger
    key = f"{led.experiment_id}:{led.run_id}"
    root = Span(
        id=f"{key}:root",
        name=f"experiment {led.experiment_id}",
        input={"hypothesis": led.spec.hypothesis.text, "spec": led.spec.canonical()},
        output={
            "status": led.status,
            "error": led.error,
            "valid": report.valid if report else None,
        },
        metadata={
            "plan_fingerprint": led.plan_fingerprint,
            "budget": led.budget,
            "approval": led.approval,
            "snapshot_id": led.snapshot_id,
            "code_digest": led.code_digest,
            "report_digest": led.report_digest,
            "run_id": led.run_id,
        },
        scores=experiment_scores(report) if report else {},
    )
    worlds = []
    for w in led.worlds:
        checks = {c.name: c.passed for c in w.checks}
        worlds.append(
            Span(
                id=f"{key}:world:{w.name}",
                name=f"world {w.name}",
                input={"world": w.name, "role": w.role.value},
                output={
                    "status": w.status.value,
                    "error": w.error,
                    "episodes": w.episodes,
                    "failures": w.failures,
                    "failure_rate": round(w.failures / w.episodes, 6) if w.episodes else None,
                },
                metadata={
                    "snapshot_id": led.snapshot_id,
                    "code_digest": led.code_digest,
                    "outcomes_digest": w.outcomes_digest,
                    "sandbox_ids": ran.sandbox_ids.get(w.name, []),
                    "inherited_checkpoint_digests": ran.checkpoint_digests,
                    "prefix_sandbox_ids": ran.prefix_sandbox_ids,
                    "prefix_chunks_by_rehearsal": ran.prefix_chunks_by_rehearsal,
                },
                metrics={"world_seconds": w.world_seconds},
                scores=world_scores(report, w.name, checks) if report else {},
            )
        )
    return Trace(experiment=f"{led.experiment_id}-{led.run_id[:8]}", root=root, worlds=worlds)


def send_trace(config: BraintrustConfig, trace: Trace) -> None:
    """Send one trace through the SDK; raises when Braintrust did not take it.

    The SDK is imported here, not at module level: the worker module is imported inside
    Temporal's workflow sandbox (by modules that define workflows), and the SDK's HTTP
    stack subclasses ``http.client`` classes the sandbox forbids touching."""
    import braintrust
    from braintrust.logger import BraintrustState, _HTTPBackgroundLogger
    from braintrust.span_types import SpanTypeAttribute

    state = BraintrustState()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated
    logger = state.global_bg_logger()
    if not isinstance(logger, _HTTPBackgroundLogger):
        raise TypeError("this braintrust SDK has no HTTP background logger to flush synchronously")
    logger.sync_flush = True  # raise instead of printing "Dropping batch"
    logger.num_tries = 1  # the outbox retries, later
    experiment = braintrust.init(
        project=config.project,
        experiment=trace.experiment,
        api_key=config.api_key,
        app_url=config.app_url,
        update=True,  # a retried trace lands in the same experiment, rows merge by id
        set_current=False,
        state=state,
    )
    r = trace.root
    root = experiment.start_span(name=r.name, type=SpanTypeAttribute.TASK, id=r.id)
    root.log(input=r.input, output=r.output, metadata=r.metadata, scores=r.scores)
    for w in trace.worlds:
        child = root.start_span(name=w.name, type=SpanTypeAttribute.TASK, id=w.id)
        child.log(
            input=w.input, output=w.output, metadata=w.metadata, metrics=w.metrics, scores=w.scores
        )
        child.end()
    root.end()
    experiment.flush()


class EvidenceActivities:
    def __init__(self, store: ArtifactStore, outbox: Path, config: BraintrustConfig | None) -> None:
        self._store = store
        self._outbox = outbox
        self._config = config

    @property
    def config(self) -> BraintrustConfig | None:
        """Braintrust's settings; None when it is off."""
        return self._config

    def pending(self) -> list[Path]:
        if not self._outbox.is_dir():
            return []
        return sorted(self._outbox.glob("*.json"), key=lambda p: (p.stat().st_mtime, p.name))

    def drain(self, config: BraintrustConfig) -> str | None:
        """Send every queued trace, oldest first; stop at the first failure (Braintrust is
        then down for the rest too) and return why."""
        for path in self.pending():
            trace = Trace.model_validate_json(path.read_text())
            try:
                send_trace(config, trace)
            except Exception as exc:  # the SDK raises many kinds; all mean "not sent yet"
                return redact(innermost_sentence(exc), config.api_key, "BRAINTRUST_API_KEY")
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return None

    @activity.defn(name=LOG_EVIDENCE.name)
    async def log_evidence(self, inp: EvidenceInput) -> EvidenceLogResult:
        config = self._config
        if config is None:
            return EvidenceLogResult(
                state=EvidenceState.off,
                message="Braintrust off (BRAINTRUST_API_KEY not set); the local ledger has it",
            )
        report = None
        if inp.ledger.report_digest:
            data = await asyncio.to_thread(self._store.get_json, inp.ledger.report_digest)
            report = Report.model_validate(data)
        progress = None
        if inp.progress_digest:
            progress = await asyncio.to_thread(read_progress, self._store, inp.progress_digest)
        trace = build_trace(inp, report, sandboxes(progress))
        name = f"{inp.ledger.experiment_id}__{inp.ledger.run_id}"
        return await self.send(config, name, trace)

    async def send(self, config: BraintrustConfig, name: str, trace: Trace) -> EvidenceLogResult:
        """Queue ``trace`` in the outbox under ``name`` (a retried send replaces it), then
        send every queued trace; what happened, never an exception for Braintrust's sake.
        Experiments over cohorts send theirs through this too (one outbox)."""
        path = self._outbox / f"{name}.json".replace("/", "_")
        text = canonical_json(json.loads(trace.model_dump_json()))
        await asyncio.to_thread(atomic_write, path, text.encode())
        try:
            error = await asyncio.wait_for(
                asyncio.to_thread(self.drain, config), SEND_BUDGET_SECONDS
            )
        except TimeoutError:
            error = f"sending took longer than {SEND_BUDGET_SECONDS:g} s"
        pending = len(self.pending())
        if error is None:
            return EvidenceLogResult(
                state=EvidenceState.sent,
                message=f"sent to Braintrust project {config.project}, experiment "
                f"{trace.experiment}",
            )
        return EvidenceLogResult(
            state=EvidenceState.queued,
            message=f"Braintrust did not take it ({error}); {pending} trace(s) queued, sent "
            "with the next experiment",
            pending=pending,
        )
