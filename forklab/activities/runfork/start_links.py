"""Temporal links on a fork's start: its first history event names the run it was forked
from, and the Web UI shows that as a link (on the "Workflow Execution Started" event and
under the run's links tab).

A fork is not a child workflow (its parent may be closed, in another chain, or the fork
of a fork), so the UI's Relationships panel, which counts children, parents and
continue-as-new runs only, cannot hold it; a link on the start request is what Temporal
offers for "this run comes from that one". The Python SDK (1.35) has no ``links``
argument on ``start_workflow``, so the fork is started through a client whose service
client adds the links to that one request: everything else (data converter, codecs,
interceptors, plugins, the already-started error) is the SDK's own path. The same
request carries the fork's start headers (the prefix page ``forklab fork`` passes): the
SDK's ``start_workflow`` takes none either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta

import google.protobuf.message
from temporalio.api.common.v1 import Link, Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import StartWorkflowExecutionRequest
from temporalio.client import Client
from temporalio.service import ServiceClient, ServiceResponse


def forked_from(namespace: str, workflow_id: str, run_id: str) -> Link:
    """A link to the start of the run a fork starts from (the run whose input it takes and
    whose steps it inherits). The server wants an event type with an event id; the
    parent's step events are not known here by id, its start event always is: 1."""
    return Link(
        workflow_event=Link.WorkflowEvent(
            namespace=namespace,
            workflow_id=workflow_id,
            run_id=run_id,
            event_ref=Link.WorkflowEvent.EventReference(
                event_id=1, event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED
            ),
        )
    )


class _LinkingServiceClient(ServiceClient):
    """``inner`` with ``links`` and ``headers`` added to every workflow start it sends (a
    client made by ``with_start_links`` starts one workflow: the fork)."""

    def __init__(
        self, inner: ServiceClient, links: Sequence[Link], headers: Mapping[str, Payload]
    ) -> None:
        super().__init__(inner.config)
        self._inner = inner
        self._links = list(links)
        self._headers = dict(headers)

    @property
    def worker_service_client(self) -> ServiceClient:  # type: ignore[override]
        return self._inner.worker_service_client

    def update_rpc_metadata(self, metadata: Mapping[str, str | bytes]) -> None:
        self._inner.update_rpc_metadata(metadata)

    def update_api_key(self, api_key: str | None) -> None:
        self._inner.update_api_key(api_key)

    async def _rpc_call(
        self,
        rpc: str,
        req: google.protobuf.message.Message,
        resp_type: type[ServiceResponse],
        *,
        service: str,
        retry: bool,
        metadata: Mapping[str, str | bytes],
        timeout: timedelta | None,
    ) -> ServiceResponse:
        if isinstance(req, StartWorkflowExecutionRequest):
            req.links.extend(self._links)
            for key, payload in self._headers.items():
                req.header.fields[key].CopyFrom(payload)
        return await self._inner._rpc_call(
            rpc, req, resp_type, service=service, retry=retry, metadata=metadata, timeout=timeout
        )


def with_start_links(
    client: Client, links: Sequence[Link], headers: Mapping[str, Payload] | None = None
) -> Client:
    """``client`` as it was built (namespace, data converter, plugins, interceptors), on
    the same connection, sending ``links`` (and the start ``headers``, payloads as given:
    no codec) with each workflow it starts."""
    config = client.config()
    config["service_client"] = _LinkingServiceClient(client.service_client, links, headers or {})
    return Client(**config)
