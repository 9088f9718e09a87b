"""Keep a provider's credential out of text a provider's server wrote.

Errors quote what a server said, and a hostile or badly configured server (a proxy, a
debugging endpoint) can quote the request's ``Authorization`` header back; that text then
reaches the status view, the workflow's history, the ledger and the terminal.
"""

from __future__ import annotations


def redact(text: str, secret: str, name: str) -> str:
    """``text`` with every occurrence of ``secret`` replaced by ``<name>``."""
    return text.replace(secret, f"<{name}>") if secret else text
