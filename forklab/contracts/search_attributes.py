"""The search attributes ForkLab registers and sets: experiments (and their stage), and
agent runs and their forks (run, parent, lineage root, boundary). Defined here, below
both the workflows that set them and the activities that start forks and find them."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

EXPERIMENT = SearchAttributeKey.for_keyword("ForkLabExperiment")
STAGE = SearchAttributeKey.for_keyword("ForkLabStage")

RUN = SearchAttributeKey.for_keyword("ForkLabRun")
PARENT = SearchAttributeKey.for_keyword("ForkLabParent")
LINEAGE_ROOT = SearchAttributeKey.for_keyword("ForkLabLineageRoot")
BOUNDARY = SearchAttributeKey.for_keyword("ForkLabBoundary")

RUN_FORK_KEYS = [RUN, PARENT, LINEAGE_ROOT, BOUNDARY]
