"""What a child workflow of a cohort experiment's fork carries of the experiment: its
search attribute ``ForkLabExperiment`` (the experiment run's key, as on the fork itself),
so the experiment's cleanup and cancel, which find forks by that attribute, reach the
child too, whatever its parent-close policy; the child marker carries the fork's
``cohort`` part (``forklab.workflows.runfork.child_markers``), so its model calls get the
world's seeds, prompt patch and faults like its parent's.

The attribute is added to what the workflow asked for, never in place of it: a workflow
that sets its own ``ForkLabExperiment`` on a child has it replaced by the fork's.
"""

from __future__ import annotations

from temporalio.common import SearchAttributePair, SearchAttributes, TypedSearchAttributes

from forklab.contracts.search_attributes import EXPERIMENT


def tagged(
    asked: SearchAttributes | TypedSearchAttributes | None, run_key: str
) -> SearchAttributes | TypedSearchAttributes:
    """``asked`` with ``ForkLabExperiment = run_key``, in the form the workflow used."""
    if isinstance(asked, TypedSearchAttributes):
        return asked.updated(SearchAttributePair(EXPERIMENT, run_key))
    if asked:  # the older, untyped mapping
        return {**asked, EXPERIMENT.name: [run_key]}
    return TypedSearchAttributes([SearchAttributePair(EXPERIMENT, run_key)])
