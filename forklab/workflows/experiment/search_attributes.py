"""The search attributes ForkLab registers and sets, for finding experiments in the Web UI
(defined in ``forklab.contracts.search_attributes``)."""

from __future__ import annotations

from forklab.contracts.search_attributes import EXPERIMENT, RUN_FORK_KEYS, STAGE

#: Agent runs and their forks (see ``forklab.workflows.runfork.search_attributes``).
RUN_FORK_NAMES = [key.name for key in RUN_FORK_KEYS]

#: ``name=Type`` pairs, as ``temporal server start-dev --search-attribute`` takes them.
DEV_SERVER_FLAGS = [f"{key.name}=Keyword" for key in (EXPERIMENT, STAGE)] + [
    f"{name}=Keyword" for name in RUN_FORK_NAMES
]

__all__ = ["DEV_SERVER_FLAGS", "EXPERIMENT", "RUN_FORK_NAMES", "STAGE"]
