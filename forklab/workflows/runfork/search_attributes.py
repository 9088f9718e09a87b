"""Search attributes of agent runs and their forks, for finding lineages in the Web UI
(defined in ``forklab.contracts.search_attributes``)."""

from __future__ import annotations

from forklab.contracts.search_attributes import BOUNDARY, LINEAGE_ROOT, PARENT, RUN, RUN_FORK_KEYS

__all__ = ["BOUNDARY", "LINEAGE_ROOT", "PARENT", "RUN", "RUN_FORK_KEYS"]
