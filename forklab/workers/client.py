"""The Temporal client ForkLab's worker and CLI connect with, and the search attributes it
needs on the server.

Kept apart from ``forklab.workers.experiment.worker`` so that an operator command (``forklab
approve``, ``status``, ``start``…) imports the client without the worker: its activities, the
analysis stack and the store clients.
"""

from __future__ import annotations

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client

from forklab.workers.config import Settings
from forklab.workers.converter import strict_data_converter
from forklab.workflows.experiment.search_attributes import EXPERIMENT, STAGE


async def connect(settings: Settings) -> Client:
    return await Client.connect(
        settings.address, namespace=settings.namespace, data_converter=strict_data_converter
    )


async def ensure_search_attributes(client: Client, namespace: str) -> None:
    """Register ForkLab's search attributes when the server lacks them (the embedded dev
    server has them from its flags; another cluster may not)."""
    known = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    missing = {
        key.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
        for key in (EXPERIMENT, STAGE)
        if key.name not in known.custom_attributes
    }
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=namespace, search_attributes=missing)
        )
