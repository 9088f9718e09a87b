"""Fork markers are authenticated: a worker serves a parent's steps only to a fork whose
marker an issuer it trusts signed for that run (issue 35, point 3). Each attack starts a
workflow by hand, as `temporal workflow start` or `client.start_workflow` would, on a
real dev server with the real agent worker; each used to be served the parent's first
steps (its secret topic in the attacker's result) or to wedge.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from agent_fixtures import AgentTestLab
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from marker_workloads import FailsInTheMiddleWorkflow, boom, note
from orchestration_lab import forklab
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import RawValue, WorkflowIDReusePolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from forklab.activities.runfork.fork_activities import ForkActivities
from forklab.activities.runfork.fork_keys import issuer_key
from forklab.activities.runfork.history_events import digest_payloads, parse_run
from forklab.activities.runfork.history_reads import first_event, latest_start
from forklab.activities.runfork.prefix_page import page_payload, passed_in
from forklab.activities.runfork.start_links import with_start_links
from forklab.agents.research import ResearchInput
from forklab.cli.runfork.agent_lab import AgentLab
from forklab.contracts.errors import ForkErrorType
from forklab.contracts.fork_request import ForkRequest
from forklab.contracts.fork_signature import issuer_public_key, sign_marker
from forklab.contracts.runfork import (
    FETCH_PREFIX,
    MARKER_MEMO_KEY,
    PREFIX_PAGE_HEADER,
    FetchPrefixInput,
    ForkMarker,
    PrefixPage,
)
from forklab.experiments.runfork.identity import lineage_root
from forklab.experiments.runfork.receipt import BoundaryMode
from forklab.experiments.runfork.steps import StepOrigin
from forklab.temporal import ForkLabPlugin
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.fork_issuers import FORK_ISSUERS


async def _finished_parent(lab: AgentTestLab, secret: str) -> tuple[str, str, ForkMarker]:
    """A completed research run about ``secret``: its id, run id and a marker naming it
    (unsigned) at step 2, approximate, as the attacker would write it."""
    handle = await lab.start_research(model="slow", topic=secret)
    await handle.result()
    run_id = (await handle.describe()).run_id or ""
    marker = _approximate_marker(handle.id, run_id, run_id, 2, tool_policies={"*": "auto"})
    return handle.id, run_id, marker


def _approximate_marker(
    parent: str, run_id: str, first_run_id: str, at_step: int, **fields: Any
) -> ForkMarker:
    """An unsigned marker naming ``parent``'s run ``run_id`` (of the chain that began with
    ``first_run_id``) at ``at_step``, approximate, as an attacker or another issuer than
    ForkLab's CLI would write it; ``fields``: the rest of it."""
    return ForkMarker(
        parent_workflow_id=parent,
        source_run_id=run_id,
        base_step=0,
        at_step=at_step,
        boundary=BoundaryMode.approximate,
        lineage_root=lineage_root(parent, first_run_id),
        **fields,
    )


async def _reissued(
    lab: AgentTestLab, marker: ForkMarker, parent: str, wid: str, issued_at: datetime
) -> tuple[ForkMarker, list[Any]]:
    """``marker`` issued for a run ``wid`` that starts with ``parent``'s own input (its
    digest in the marker), at ``issued_at``, and signed by the lab's home issuer; and that
    input."""
    start = await latest_start(lab.client, parent)
    update = {
        "fork_workflow_id": wid,
        "start_input_sha256": digest_payloads(start.input),
        "issued_at": issued_at,
    }
    signed = sign_marker(marker.model_copy(update=update), issuer_key(lab.agent.home))
    return signed, [RawValue(p) for p in start.input]


async def _start(
    lab: AgentTestLab,
    wid: str,
    args: list[Any],
    marker: ForkMarker | dict[str, Any],
    page: bytes | None = None,
) -> WorkflowHandle[Any, Any]:
    """A raw start with ``marker`` in its memo (and ``page`` in its start header, where a
    fork's prefix page travels: an attacker copying a fork's start copies it too)."""
    memo = marker.model_dump(mode="json") if isinstance(marker, ForkMarker) else marker
    headers = {PREFIX_PAGE_HEADER: page_payload(page)} if page is not None else {}
    return await with_start_links(lab.client, [], headers).start_workflow(
        "ResearchPipeline",
        args=args,
        id=wid,
        task_queue=lab.agent.agent_task_queue,
        memo={MARKER_MEMO_KEY: memo},
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
    )


async def _refusal(handle: WorkflowHandle[Any, Any], error: ForkErrorType) -> str:
    """The one sentence the run failed with (at once, never wedged), after checking that
    the run was handed nothing of any parent: its one ``forklab.fetch_prefix`` (which
    verifies the marker before it reads: ``test_the_fetch_refuses_before_it_reads``)
    failed with the refusal and returned nothing."""
    cause = await _failure(handle, "the run was served and completed")
    assert cause.type == error, cause
    assert "\n" not in cause.message
    history = await handle.fetch_history()
    scheduled = {
        e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    }
    assert list(scheduled.values()).count(FETCH_PREFIX) <= 1
    for e in history.events:
        if e.HasField("activity_task_completed_event_attributes"):
            done = e.activity_task_completed_event_attributes.scheduled_event_id
            assert scheduled[done] != FETCH_PREFIX, "the run was handed its parent's steps"
        if e.HasField("activity_task_failed_event_attributes"):
            failed = e.activity_task_failed_event_attributes
            assert failed.failure.application_failure_info.type == error.value
    return cause.message


async def _failure(handle: WorkflowHandle[Any, Any], completed: str) -> ApplicationError:
    """Why the run failed, within 30 s: it must fail, neither stay open (wedged) nor
    complete (``completed`` says what that would mean)."""
    try:
        await asyncio.wait_for(handle.result(), 30)
    except WorkflowFailureError as exc:
        cause = exc.cause
    except TimeoutError:
        pytest.fail("the run is still open (wedged)")
    else:
        pytest.fail(completed)
    assert isinstance(cause, ApplicationError), cause
    return cause


def _bytes(history: Any) -> bytes:
    return b"".join(e.SerializeToString() for e in history.events)


async def test_a_forged_marker_started_by_hand_is_refused_and_reads_nothing(
    agent_lab: AgentTestLab,
) -> None:
    """Before: a raw start naming any run, with another input and `approximate`, was served
    that run's first steps: the parent's secret topic was in the attacker's result."""
    secret = f"SECRET-{uuid.uuid4().hex[:8]}"
    _, _, forged = await _finished_parent(agent_lab, secret)
    issuer_key(agent_lab.agent.home)  # the worker trusts a key (as after any `forklab fork`)
    own = Ed25519PrivateKey.generate()  # the attacker's key, which no worker trusts
    attempts: dict[str, ForkMarker] = {
        "unsigned": forged,
        "own key": sign_marker(
            forged.model_copy(
                update={"fork_workflow_id": "attacker-1", "issued_at": datetime.now(UTC)}
            ),
            own,
        ),
        "made-up signature": forged.model_copy(
            update={
                "issuer_key": sign_marker(forged, issuer_key(agent_lab.agent.home)).issuer_key,
                "signature": "ab" * 64,
            }
        ),
    }
    charges = agent_lab.charges()
    expected = {
        "unsigned": "the fork marker is not signed; start forks with `forklab fork`",
        "own key": "which this worker does not trust",
        "made-up signature": "signature does not verify",
    }
    for name, marker in attempts.items():
        handle = await _start(
            agent_lab,
            f"attacker-{uuid.uuid4().hex[:8]}",
            [ResearchInput(topic="anything", model="slow")],
            marker,
        )
        message = await _refusal(handle, ForkErrorType.marker_unverified)
        assert message.startswith("fork refused: ") and expected[name] in message, (name, message)
        assert secret.encode() not in _bytes(await handle.fetch_history())
    assert agent_lab.charges() == charges


async def _real_fork(
    lab: AgentTestLab, parent: str, at_step: int = 2
) -> tuple[str, ForkMarker, list[Any], bytes]:
    """A fork made by ForkLab, finished: its id, its signed marker (as its memo holds it),
    its start input and the prefix page passed in its start."""
    fork = await lab.lab.fork(
        ForkRequest(run=parent, at_step=at_step, boundary=BoundaryMode.approximate)
    )
    await fork.handle.result()
    start = await latest_start(lab.client, fork.handle.id)
    assert start.marker is not None and start.marker.signature is not None
    event = await first_event(lab.client, fork.handle.id, start.run_id)
    page = passed_in(event.workflow_execution_started_event_attributes)
    assert page is not None, "forklab fork passed no prefix page"
    return fork.handle.id, start.marker, [RawValue(p) for p in start.input], page.data


async def test_the_fetch_refuses_before_it_reads(agent_lab: AgentTestLab) -> None:
    """``forklab.fetch_prefix`` carrying a marker it cannot verify reads nothing of the
    parent: the worker's cache of parsed closed runs stays empty, where the same fetch
    without a marker (a later page, after the first verified) reads and keeps the run."""
    secret = f"SECRET-{uuid.uuid4().hex[:8]}"
    wid, run_id, forged = await _finished_parent(agent_lab, secret)
    forks = ForkActivities(agent_lab.client, agent_lab.agent.home)
    issuer_key(agent_lab.agent.home)
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, workflow_id=wid, workflow_run_id=run_id)
    page = FetchPrefixInput(workflow_id=wid, run_id=run_id, from_step=1, upto_step=2)
    own = Ed25519PrivateKey.generate()
    for marker in (forged, sign_marker(forged, own)):
        with pytest.raises(ApplicationError) as refused:
            await env.run(forks.fetch_prefix, page.model_copy(update={"marker": marker}))
        assert refused.value.type == ForkErrorType.marker_unverified
        assert forks.runs.get(wid, run_id, 0) is None, "the fetch read the parent's run"
    served = await env.run(forks.fetch_prefix, page)
    assert [s.index for s in served.steps] == [1, 2]
    assert forks.runs.get(wid, run_id, 0) is not None


async def test_a_real_marker_copied_to_another_workflow_id_is_refused(
    agent_lab: AgentTestLab,
) -> None:
    parent, _, _ = await _finished_parent(agent_lab, f"SECRET-{uuid.uuid4().hex[:8]}")
    _, marker, args, page = await _real_fork(agent_lab, parent)
    handle = await _start(agent_lab, f"copy-{uuid.uuid4().hex[:8]}", args, marker, page)
    message = await _refusal(handle, ForkErrorType.marker_unverified)
    assert "the fork marker was issued for workflow" in message and "copied" in message


async def test_a_real_marker_with_another_input_is_refused(agent_lab: AgentTestLab) -> None:
    """The fork's own id, reused once it closed, with the attacker's input."""
    parent, _, _ = await _finished_parent(agent_lab, f"SECRET-{uuid.uuid4().hex[:8]}")
    fork_id, marker, _, page = await _real_fork(agent_lab, parent)
    handle = await _start(
        agent_lab, fork_id, [ResearchInput(topic="the attacker's", model="slow")], marker, page
    )
    message = await _refusal(handle, ForkErrorType.marker_unverified)
    assert "this run's start input is not the one the fork marker was issued for" in message


async def test_a_real_marker_retargeted_to_another_parent_is_refused(
    agent_lab: AgentTestLab,
) -> None:
    """The signed marker of a fork of A, its parent changed to B (whose secret it wants)."""
    parent, _, _ = await _finished_parent(agent_lab, f"SECRET-{uuid.uuid4().hex[:8]}")
    secret = f"SECRET-{uuid.uuid4().hex[:8]}"
    other, other_run, _ = await _finished_parent(agent_lab, secret)
    fork_id, marker, args, page = await _real_fork(agent_lab, parent)
    retargeted = marker.model_copy(
        update={
            "parent_workflow_id": other,
            "source_run_id": other_run,
            "lineage_root": lineage_root(other, other_run),
        }
    )
    handle = await _start(agent_lab, fork_id, args, retargeted, page)
    message = await _refusal(handle, ForkErrorType.marker_unverified)
    assert "signature does not verify" in message
    assert secret.encode() not in _bytes(await handle.fetch_history())


def _forged_page(page: bytes, value: str) -> bytes:
    """``page`` with every inherited step's result replaced by ``value`` (as a JSON string
    payload): what an attacker holding a real fork's start would serve its own run."""
    forged = json.loads(page)
    payload = Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(value).encode())
    for step in forged["steps"]:
        step["result_b64"] = base64.b64encode(payload.SerializeToString()).decode()
    return json.dumps(forged).encode()


async def test_a_fork_is_served_the_page_passed_in_its_start_and_reads_nothing(
    agent_lab: AgentTestLab,
) -> None:
    """`forklab fork` passes the prefix page it cut from the run it parsed; the fork's
    fetch serves it, reading nothing of the parent (the worker's cache of parsed runs stays
    empty), and it is the very page the fetch would have read."""
    parent, run_id, _ = await _finished_parent(agent_lab, f"SECRET-{uuid.uuid4().hex[:8]}")
    fork_id, marker, _, page = await _real_fork(agent_lab, parent)
    forks = ForkActivities(agent_lab.client, agent_lab.agent.home)
    env = ActivityEnvironment()
    start = await latest_start(agent_lab.client, fork_id)
    env.info = dataclasses.replace(env.info, workflow_id=fork_id, workflow_run_id=start.run_id)
    first = FetchPrefixInput(
        workflow_id=parent,
        run_id=run_id,
        from_step=1,
        upto_step=marker.at_step,
        marker=marker,
    )
    served = await env.run(forks.fetch_prefix, first)
    assert isinstance(served, RawValue) and served.payload.data == page
    verdict = await env.run(forks.fetch_prefix, first.model_copy(update={"page_in_start": True}))
    assert verdict == PrefixPage(steps=[], in_start=True)
    assert forks.runs.get(parent, run_id, 0) is None, "the fetch read the parent's run"
    read = await env.run(forks.fetch_prefix, first.model_copy(update={"marker": None}))
    assert isinstance(read, PrefixPage) and read.steps
    assert PrefixPage.model_validate_json(page) == read


async def test_a_fork_holds_its_passed_page_once_and_reads_it_from_its_start(
    agent_lab: AgentTestLab,
) -> None:
    """The real fork's history carries its prefix page in its start alone: its fetch's
    result is the verdict (``in_start``, no steps), and the steps it inherited, read back
    from its history as a fork of it reads them, are the page's."""
    parent, _, _ = await _finished_parent(agent_lab, f"SECRET-{uuid.uuid4().hex[:8]}")
    fork_id, _, _, page = await _real_fork(agent_lab, parent)
    start = await latest_start(agent_lab.client, fork_id)
    history = await agent_lab.client.get_workflow_handle(
        fork_id, run_id=start.run_id
    ).fetch_history()
    scheduled = {
        e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    }
    fetched = [
        e.activity_task_completed_event_attributes.result.payloads[0].data
        for e in history.events
        if e.HasField("activity_task_completed_event_attributes")
        and scheduled[e.activity_task_completed_event_attributes.scheduled_event_id] == FETCH_PREFIX
    ]
    assert [PrefixPage.model_validate_json(f) for f in fetched] == [
        PrefixPage(steps=[], in_start=True)
    ]
    inherited = [
        s
        for s in parse_run(fork_id, history, 0, start.run_id).steps
        if s.origin is StepOrigin.inherited
    ]
    passed = PrefixPage.model_validate_json(page).steps
    assert [(s.index, s.result_sha256) for s in inherited] == [
        (s.index, s.result_sha256) for s in passed
    ]


async def test_a_passed_page_altered_or_swapped_after_signing_is_refused(
    agent_lab: AgentTestLab,
) -> None:
    """A real fork's start run again under its own id (once it closed) with its own input
    and signed marker, and a prefix page that is not the one signed: its results forged,
    another fork's page (another parent run, another step), or none at all; and a page
    added to a marker signed without one. Each fails at once, served nothing: the page's
    digest is part of what the signature covers."""
    parent, _, _ = await _finished_parent(agent_lab, f"SECRET-{uuid.uuid4().hex[:8]}")
    other, _, _ = await _finished_parent(agent_lab, f"SECRET-{uuid.uuid4().hex[:8]}")
    fork_id, marker, args, page = await _real_fork(agent_lab, parent)
    _, _, _, other_run_page = await _real_fork(agent_lab, other)
    _, _, _, other_step_page = await _real_fork(agent_lab, parent, at_step=1)
    forged = "FORGED-" + uuid.uuid4().hex[:8]
    unpaged = sign_marker(
        marker.model_copy(update={"issued_at": datetime.now(UTC)}),
        issuer_key(agent_lab.agent.home),
    )
    attempts: list[tuple[ForkMarker, bytes | None]] = [
        (marker, _forged_page(page, forged)),
        (marker, other_run_page),
        (marker, other_step_page),
        (marker, None),
        (unpaged, page),
    ]
    for signed, passed in attempts:
        handle = await _start(agent_lab, fork_id, args, signed, passed)
        message = await _refusal(handle, ForkErrorType.marker_unverified)
        assert "signature does not verify" in message, message
        assert "prefix page" in message


async def test_a_marker_without_a_page_digest_falls_back_to_the_read(
    agent_lab: AgentTestLab,
) -> None:
    """A fork started as before prefix pages were passed (an older `forklab fork`): its
    marker signs no page digest and its start carries no page; the fetch reads the parent's
    history and serves its steps."""
    parent, run_id, marker = await _finished_parent(agent_lab, f"SECRET-{uuid.uuid4().hex[:8]}")
    wid = f"unpaged-{uuid.uuid4().hex[:8]}"
    old, args = await _reissued(agent_lab, marker, parent, wid, datetime.now(UTC))
    handle = await _start(agent_lab, wid, args, old)
    await asyncio.wait_for(handle.result(), 60)
    history = await handle.fetch_history()
    assert (
        PREFIX_PAGE_HEADER
        not in history.events[0].workflow_execution_started_event_attributes.header.fields
    )
    scheduled = {
        e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    }
    pages = [
        PrefixPage.model_validate_json(
            e.activity_task_completed_event_attributes.result.payloads[0].data
        )
        for e in history.events
        if e.HasField("activity_task_completed_event_attributes")
        and scheduled[e.activity_task_completed_event_attributes.scheduled_event_id] == FETCH_PREFIX
    ]
    assert [[s.index for s in p.steps] for p in pages] == [[1, 2]]
    assert {s.run_id for s in pages[0].steps} == {run_id}


async def test_a_marker_used_long_after_it_was_issued_is_refused(agent_lab: AgentTestLab) -> None:
    """A marker signed for this very id and input, an hour before the run starts."""
    parent, _, forged = await _finished_parent(agent_lab, f"SECRET-{uuid.uuid4().hex[:8]}")
    wid = f"late-{uuid.uuid4().hex[:8]}"
    an_hour_ago = datetime.fromtimestamp(datetime.now(UTC).timestamp() - 3600, UTC)
    late, args = await _reissued(agent_lab, forged, parent, wid, an_hour_ago)
    handle = await _start(agent_lab, wid, args, late)
    assert "a marker used again later" in await _refusal(handle, ForkErrorType.marker_unverified)


async def test_a_worker_that_trusts_no_issuer_serves_no_fork(agent_lab: AgentTestLab) -> None:
    """Nothing issued from the worker's home and no registered issuers: fail closed."""
    _, _, forged = await _finished_parent(agent_lab, f"SECRET-{uuid.uuid4().hex[:8]}")
    signed = sign_marker(forged, Ed25519PrivateKey.generate())
    handle = await _start(
        agent_lab, f"none-{uuid.uuid4().hex[:8]}", [ResearchInput(topic="x")], signed
    )
    message = await _refusal(handle, ForkErrorType.marker_unverified)
    assert "this worker trusts no fork issuer" in message and "FORKLAB_FORK_ISSUERS" in message


@contextlib.asynccontextmanager
async def _fails_in_the_middle_worker(
    env: WorkflowEnvironment, home: Path
) -> AsyncIterator[tuple[Client, str]]:
    """A worker of ``FailsInTheMiddleWorkflow`` with ForkLab's plugin for ``home`` (which
    reads the trusted issuers when it is made); its client and task queue."""
    client = await Client.connect(
        env.client.service_client.config.target_host, data_converter=pydantic_data_converter
    )
    queue = f"marker-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[FailsInTheMiddleWorkflow],
        activities=[note, boom],
        plugins=[ForkLabPlugin(home=home)],
    ):
        yield client, queue


async def test_a_marker_whose_prefix_holds_a_failed_step_fails_at_once(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """Before: the run stayed open, its workflow task failing with `Unknown payload
    encoding <unknown>`. A marker signed by a trusted issuer (ForkLab's CLI refuses such a
    boundary; another issuer may not) and an unsigned one both fail the run at once; so
    does a signed one naming a parent run that is not there."""
    home = tmp_path / "home"
    async with _fails_in_the_middle_worker(temporal_env, home) as (client, queue):
        parent = await client.start_workflow(
            FailsInTheMiddleWorkflow.run, 3, id=f"fails-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        assert await parent.result() == ["note 1", "failed 2", "note 3"]
        start = await latest_start(client, parent.id)
        missing = str(uuid.uuid4())
        cases = [(True, start.run_id), (False, start.run_id), (True, missing), (True, "x")]
        for signed, run_id in cases:
            wid = f"bad-prefix-{uuid.uuid4().hex[:8]}"
            marker = _approximate_marker(
                parent.id,
                run_id,
                start.first_run_id,
                3,
                fork_workflow_id=wid,
                start_input_sha256=digest_payloads(start.input),
                issued_at=datetime.now(UTC),
            )
            if signed:
                marker = sign_marker(marker, issuer_key(home))
            handle = await client.start_workflow(
                "FailsInTheMiddle",
                args=[RawValue(p) for p in start.input],
                id=wid,
                task_queue=queue,
                memo={MARKER_MEMO_KEY: marker.model_dump(mode="json")},
            )
            cause = await _failure(handle, "the run was served a failed step and completed")
            if run_id != start.run_id:  # a parent run that is not there (retention, a typo)
                assert cause.type == ForkErrorType.prefix_unservable, cause
                assert cause.message.startswith("fork refused: its prefix cannot be served: ")
            elif signed:
                assert cause.type == ForkErrorType.prefix_unservable, cause
                assert cause.message == (
                    "fork refused: its prefix cannot be served: step 2 is failed in the "
                    "parent's history (boom)"
                )
            else:
                assert cause.type == ForkErrorType.marker_unverified, cause


async def test_a_worker_with_registered_issuers_serves_only_their_forks(
    temporal_env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers on other hosts hold public keys only: the operator's home's issuer key
    (`forklab keys --fork-issuer`) registered in FORKLAB_FORK_ISSUERS. A fork issued from
    another home, and one signed by the worker's own home key, are refused."""
    operator, stranger, worker_home = tmp_path / "op", tmp_path / "stranger", tmp_path / "w"
    monkeypatch.setenv(FORK_ISSUERS, f"ops {issuer_public_key(issuer_key(operator))}; x {'0' * 64}")
    async with _fails_in_the_middle_worker(temporal_env, worker_home) as (client, queue):
        parent = await client.start_workflow(
            FailsInTheMiddleWorkflow.run, 1, id=f"one-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        await parent.result()
        issuer_key(worker_home)  # the worker's own home key counts for nothing now
        for home, served in ((operator, True), (stranger, False), (worker_home, False)):
            lab = AgentLab(client, AgentSettings(home=home, agent_task_queue=queue))
            fork = await lab.fork(ForkRequest(run=parent.id, at_step=1))
            if served:
                assert await fork.handle.result() == ["note 1"]
                continue
            with pytest.raises(WorkflowFailureError) as failure:
                await asyncio.wait_for(fork.handle.result(), 30)
            cause = failure.value.cause
            assert isinstance(cause, ApplicationError)
            assert cause.type == ForkErrorType.marker_unverified
            assert "which this worker does not trust" in cause.message


def test_an_agent_worker_with_a_bad_issuers_setting_does_not_start(tmp_path: Path) -> None:
    """One line, exit 2, before it connects anywhere (the address is nobody's)."""
    env = {
        **os.environ,
        "FORKLAB_HOME": str(tmp_path),
        "FORKLAB_ADDRESS": "127.0.0.1:9",
        FORK_ISSUERS: "ops short",
    }
    out = forklab(env, "agent-worker")
    assert out.returncode == 2, out
    assert out.stderr.strip() == (
        "forklab: error: FORKLAB_FORK_ISSUERS: entry 1 is not '<name> <public key>' (a name "
        "of letters, digits, _ . @ -, and the 64 hex digits forklab keys prints)"
    )
