"""The tools agent's activity tool, in a module the workflow sandbox passes through (the
Agents SDK reads the tool's type hints inside the workflow)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from temporalio import activity

if TYPE_CHECKING:
    from sample_workflows import Calls


class Mailer:
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    @activity.defn(name="email_customer")
    async def email_customer(self, to: str, subject: str, body: str) -> str:
        """Send the customer an email."""
        self.calls.count()
        return f"sent to {to}: {subject}"
