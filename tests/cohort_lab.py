"""What the cohort-experiment tests share: a worker running ``CohortExperimentWorkflow``
and its activities on its own queue (beside the ``agent_lab`` fixture's agent worker, on
the session's dev server), a recorded cohort of research-pipeline runs, and an approver
who signs the plan the workflow shows."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_fixtures import AgentTestLab
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from forklab.activities.experiment.approval import ApprovalActivities
from forklab.activities.experiment.evidence_log import EvidenceActivities
from forklab.activities.experiment.workload_bundles import WorkloadBundles
from forklab.activities.runfork.cohort_code import CohortCode
from forklab.activities.runfork.cohort_forks import CohortActivities
from forklab.activities.runfork.cohort_plans import CohortPlans
from forklab.activities.sandbox.cohort_code_calls import CohortCodeCalls
from forklab.activities.stores.artifacts import LocalArtifactStore
from forklab.activities.stores.fork_registry import ForkRegistry
from forklab.activities.stores.ledger import SqliteLedger
from forklab.contracts.approval import approval_payload, sign
from forklab.contracts.cohort import CohortReport
from forklab.experiments.cohort.spec import CohortExperimentSpec, parse_cohort_spec
from forklab.workers.experiment.worker import workflow_runner
from forklab.workflows.experiment.cohort_messages import (
    CohortInput,
    CohortResult,
    CohortStatusView,
)
from forklab.workflows.experiment.cohort_workflow import CohortExperimentWorkflow
from forklab.workflows.experiment.messages import Stage

SCORER = "forklab.experiments.cohort.scorers:final_score"


@dataclass
class CohortLab:
    agents: AgentTestLab
    client: Client
    queue: str
    ledger: SqliteLedger
    registry: ForkRegistry
    plans: CohortPlans
    key: Ed25519PrivateKey
    #: where a test ships the bundle of its own scorer and feature functions
    store: LocalArtifactStore

    def plan_ids(self, artifact: str | None) -> list[str]:
        """The workflow ids of the stored plan's runs."""
        assert artifact is not None
        return [r.workflow_id for r in self.plans.get(artifact).runs]

    def markdown(self, report: CohortReport) -> str:
        """The report's Markdown, from the store the analysis wrote it to."""
        assert report.markdown_artifact is not None and report.markdown is None
        return self.store.get_bytes(report.markdown_artifact).decode()

    @property
    def public_key(self) -> str:
        raw = self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return raw.hex()

    async def record(self, models: list[str], temperature: float = 1.0) -> list[str]:
        """Record one research run per model (at ``temperature``); some fail."""
        handles = [
            await self.agents.start_research(model=m, temperature=temperature, topic=f"topic {i}")
            for i, m in enumerate(models)
        ]
        for h in handles:
            with contextlib.suppress(WorkflowFailureError):
                await h.result()
        return [h.id for h in handles]

    async def start(
        self, spec: CohortExperimentSpec, **fields: Any
    ) -> WorkflowHandle[Any, CohortResult]:
        inp = CohortInput(
            spec=spec, approver_public_key=self.public_key, requested_by="tester", **fields
        )
        return await self.client.start_workflow(
            CohortExperimentWorkflow.run,
            inp,
            id=f"forklab-{spec.id}",
            task_queue=self.queue,
            result_type=CohortResult,
        )

    async def status(self, handle: WorkflowHandle[Any, Any]) -> CohortStatusView:
        view: CohortStatusView = await handle.query("status", result_type=CohortStatusView)
        return view

    async def until_stage(
        self, handle: WorkflowHandle[Any, Any], stage: Stage, timeout: float = 60.0
    ) -> CohortStatusView:
        for _ in range(int(timeout / 0.1)):
            view = await self.status(handle)
            if view.stage is stage:
                return view
            if view.stage is Stage.done:
                raise AssertionError(f"the experiment ended: {view.status} {view.error}")
            await asyncio.sleep(0.1)
        raise AssertionError(f"the experiment never reached {stage}")

    async def approve(
        self,
        handle: WorkflowHandle[Any, Any],
        fingerprint: str | None = None,
        key: Ed25519PrivateKey | None = None,
    ) -> Any:
        """Sign the plan the workflow shows (or ``fingerprint``) with this lab's key (or
        ``key``) and send the approval; returns the attempt the gate recorded."""
        view = await self.until_stage(handle, Stage.awaiting_approval)
        assert view.fingerprint is not None
        signed = fingerprint or view.fingerprint
        payload = approval_payload(
            experiment_id=view.experiment_id,
            workflow_id=handle.id,
            run_id=view.approval.run_id,
            fingerprint=signed,
            nonce=view.approval.nonce,
            approver="tester",
        )
        return await handle.execute_update(
            "approve",
            {
                "approver": "tester",
                "fingerprint": signed,
                "nonce": view.approval.nonce,
                "signature": sign(key or self.key, payload),
            },
        )


def cohort_spec(cohort: dict[str, Any], worlds: list[dict[str, Any]], **more: Any) -> Any:
    raw = {
        "id": f"cohort-{uuid.uuid4().hex[:8]}",
        "hypothesis": {"text": "the worlds change how often a report passes"},
        "seed": 11,
        "cohort": {
            "fork_at": "tool:charge_customer#1",
            "forks_per_world": 3,
            "outcome": SCORER,
            "success_threshold": 1.0,
            **cohort,
        },
        "worlds": [{"name": "baseline", "role": "baseline"}, *worlds],
        "budget": {"max_forks": 1000, "max_concurrent_forks": 8},
        "approval": {"required": True, "expiry_minutes": 30},
        **more,
    }
    return parse_cohort_spec(json.dumps(raw), "cohort.yaml")


@contextlib.asynccontextmanager
async def running_cohort_lab(
    agents: AgentTestLab, tmp_path: Path, evidence: EvidenceActivities | None = None
) -> AsyncIterator[CohortLab]:
    target = agents.client.service_client.config.target_host
    client = await Client.connect(target, data_converter=pydantic_data_converter)
    ledger = SqliteLedger(tmp_path / "ledger.sqlite")
    registry = ForkRegistry(agents.agent.forks_path)
    store = LocalArtifactStore(tmp_path / "artifacts")
    code = CohortCode(
        WorkloadBundles(store, tmp_path / "bundles"), CohortCodeCalls(tmp_path / "code-calls")
    )
    plans = CohortPlans(store)
    cohort = CohortActivities(
        client,
        registry,
        agents.agent.home,
        ledger,
        plans,
        tmp_path / "cohort-reports",
        evidence,
        code,
    )
    approval = ApprovalActivities(tmp_path / "keys", allow_unapproved=False)
    queue = f"cohort-test-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[CohortExperimentWorkflow],
        activities=[
            *cohort.activities(),
            approval.approval_policy,
            approval.approver_policy,
            approval.issue_approval_key,
        ],
        workflow_runner=workflow_runner(),
        max_concurrent_activities=24,
    ):
        yield CohortLab(
            agents=agents,
            client=client,
            queue=queue,
            ledger=ledger,
            registry=registry,
            plans=plans,
            key=Ed25519PrivateKey.generate(),
            store=store,
        )
