"""The search attributes ForkLab registers and sets, for finding experiments in the Web UI."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

EXPERIMENT = SearchAttributeKey.for_keyword("ForkLabExperiment")
STAGE = SearchAttributeKey.for_keyword("ForkLabStage")

#: Agent runs and their forks (see ``forklab.workflows.runfork.search_attributes``).
RUN_FORK_NAMES = ["ForkLabRun", "ForkLabParent", "ForkLabLineageRoot", "ForkLabBoundary"]

#: ``name=Type`` pairs, as ``temporal server start-dev --search-attribute`` takes them.
DEV_SERVER_FLAGS = [f"{key.name}=Keyword" for key in (EXPERIMENT, STAGE)] + [
    f"{name}=Keyword" for name in RUN_FORK_NAMES
]
