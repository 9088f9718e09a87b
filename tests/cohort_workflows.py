"""A third-party-style workflow for cohort experiments, written knowing nothing of
ForkLab: an order desk that looks a customer up, then the order, and scores itself on
whether the order's status could be read. Its tools return JSON objects, so the faults an
experiment injects into tool responses (a field renamed or missing) reach its logic."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.workflow import ParentClosePolicy


@activity.defn(name="lookup_customer")
async def lookup_customer(order: str) -> dict[str, Any]:
    return {"order": order, "customer": f"cust-{order}", "tier": "gold"}


@activity.defn(name="lookup_order")
async def lookup_order(order: str) -> dict[str, Any]:
    return {"order": order, "status": "shipped", "items": ["book", "lamp"]}


@workflow.defn(name="OrderDesk")
class OrderDeskWorkflow:
    @workflow.run
    async def run(self, order: str) -> dict[str, Any]:
        customer = await workflow.execute_activity(
            lookup_customer, order, start_to_close_timeout=timedelta(seconds=30)
        )
        found = await workflow.execute_activity(
            lookup_order, order, start_to_close_timeout=timedelta(seconds=30)
        )
        status = found.get("status")
        return {
            "customer": customer.get("customer"),
            "status": status,
            "score": 1.0 if status == "shipped" else 0.0,
        }


@workflow.defn(name="Courier")
class CourierWorkflow:
    """Delivers an order until it is cancelled: a child its parent leaves running."""

    @workflow.run
    async def run(self, order: str) -> str:
        await workflow.wait_condition(lambda: False)
        return order


@workflow.defn(name="OrderDispatch")
class OrderDispatchWorkflow:
    """Looks the order up, hands it to a courier (a child workflow it abandons: the
    courier outlives it) and scores itself on the order's status."""

    @workflow.run
    async def run(self, order: str) -> dict[str, Any]:
        found = await workflow.execute_activity(
            lookup_order, order, start_to_close_timeout=timedelta(seconds=30)
        )
        await workflow.start_child_workflow(
            CourierWorkflow.run,
            order,
            id=f"{workflow.info().workflow_id}-courier",
            parent_close_policy=ParentClosePolicy.ABANDON,
        )
        return {"status": found.get("status"), "score": 1.0}


ACTIVITIES = [lookup_customer, lookup_order]
#: The order desk's tools, both live on its forks.
ORDER_TOOLS = {"lookup_order": "live", "lookup_customer": "live"}
#: A positive control for the order desk: every live order lookup loses its status, so
#: every fork of a run that succeeded fails.
ORDER_DRIFT = {
    "name": "drift",
    "role": "positive_control",
    "faults": [{"kind": "schema_drift", "rate": 1.0, "tools": ["lookup_order"], "field": "status"}],
}
