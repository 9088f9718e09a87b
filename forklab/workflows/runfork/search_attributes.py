"""Search attributes of agent runs and their forks, for finding lineages in the Web UI."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

RUN = SearchAttributeKey.for_keyword("ForkLabRun")
PARENT = SearchAttributeKey.for_keyword("ForkLabParent")
LINEAGE_ROOT = SearchAttributeKey.for_keyword("ForkLabLineageRoot")
BOUNDARY = SearchAttributeKey.for_keyword("ForkLabBoundary")

RUN_FORK_KEYS = [RUN, PARENT, LINEAGE_ROOT, BOUNDARY]
