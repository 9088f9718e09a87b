"""Who a run is, for the stores it writes: the effect ledger's scope and the run log's stream.

A workflow id names a run only while it is open: a monthly job may start ``monthly-X``
again after the first run closed, and two namespaces sharing one home or one database
may each hold a ``monthly-X``. Keyed by the bare id, the second run would replay the
first one's charges (the payments service never called) and read its events. So every
key here carries what no later run can share: the namespace, and the first run id of
the chain (Temporal's ``first_execution_run_id``, kept across continue-as-new), next to
the workflow id. A fork inherits its parent's lineage root and so meets its effects.
"""

from __future__ import annotations

import json

#: separates the workflow id from the first run id in a lineage root; run ids are UUIDs
#: (no ``@``), so the last one splits a root unambiguously whatever the workflow id holds
_ROOT_SEPARATOR = "@"


def lineage_root(workflow_id: str, first_run_id: str) -> str:
    """The lineage root a run that is not a fork starts: its chain's own identity."""
    return f"{workflow_id}{_ROOT_SEPARATOR}{first_run_id}"


def effect_scope(namespace: str, root: str) -> str:
    """The effect ledger's key for lineage ``root`` in ``namespace`` (one-to-one on the
    pair: JSON, not a joined string that two different pairs could share)."""
    return json.dumps([namespace, root], separators=(",", ":"))


def run_stream(namespace: str, workflow_id: str, first_run_id: str) -> str:
    """The run log's stream of one continue-as-new chain."""
    return json.dumps([namespace, workflow_id, first_run_id], separators=(",", ":"))
