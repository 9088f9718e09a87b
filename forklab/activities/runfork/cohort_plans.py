"""The cohort plan in the artifact store: the rehearsal stores it whole (every kept run
with its chain's run ids, fork step and prefix digest, every exclusion, the tool list),
the workflow carries only its ``PlanRef`` (digests, counts, tools), and the activities that
need a run of it (each fork, the analysis) read it back by digest.

So the workflow's state, its continue-as-new input and its activity inputs stay the same
size whatever the cohort's size: a plan of 10,000 runs is about 4 MB, twice Temporal's
payload limit. A plan read back is checked twice: the store re-hashes the bytes, and the
plan's contents must still match the cohort digest the approver signed.
"""

from __future__ import annotations

from collections import OrderedDict
from threading import Lock

from forklab.activities.stores.artifacts import ArtifactStore
from forklab.contracts.cohort import PlanRef
from forklab.experiments.cohort.plan import CohortPlan, check_digest

#: Plans kept in memory per worker (a fork reads its plan once per worker, not per fork).
CACHED_PLANS = 4


class CohortPlans:
    """Stores plans and reads them back, keeping the last few read in memory."""

    def __init__(self, store: ArtifactStore) -> None:
        self._store = store
        self._cache: OrderedDict[str, CohortPlan] = OrderedDict()
        self._lock = Lock()

    @property
    def store(self) -> ArtifactStore:
        """The store the plans are kept in; an experiment's report is kept beside its plan."""
        return self._store

    def put(self, plan: CohortPlan) -> PlanRef:
        check_digest(plan)
        artifact = self._store.put_json(plan.model_dump(mode="json"))
        return PlanRef(
            artifact=artifact,
            digest=plan.digest,
            runs=len(plan.runs),
            excluded=len(plan.excluded),
            tools=dict(plan.tools),
        )

    def get(self, artifact: str) -> CohortPlan:
        """The plan stored under ``artifact``; raises ``ArtifactError`` when it is missing
        or damaged and ``ValueError`` when its contents differ from its signed digest."""
        with self._lock:
            plan = self._cache.get(artifact)
            if plan is not None:
                self._cache.move_to_end(artifact)
                return plan
        plan = CohortPlan.model_validate(self._store.get_json(artifact))
        check_digest(plan)
        with self._lock:
            self._cache[artifact] = plan
            while len(self._cache) > CACHED_PLANS:
                self._cache.popitem(last=False)
        return plan
