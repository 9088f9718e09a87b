"""ForkLab for your own Temporal workers: ``from forklab.temporal import ForkLabPlugin``.

``Worker(client, task_queue=..., workflows=..., activities=..., plugins=[ForkLabPlugin()])``
is the whole change that makes a worker's workflows forkable (``docs/forks.md``, "Make
your own workflow forkable"). This module only names the public pieces; they live in
``forklab.workers.runfork.plugin``.
"""

from __future__ import annotations

from forklab.workers.runfork.plugin import (
    ForkLabPlugin,
    SearchAttributesMissing,
    ensure_search_attributes,
    search_attributes_hint,
)

__all__ = [
    "ForkLabPlugin",
    "SearchAttributesMissing",
    "ensure_search_attributes",
    "search_attributes_hint",
]
