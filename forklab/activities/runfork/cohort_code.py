"""The outcome scorer and the pre-decision feature function a cohort spec names: ForkLab's
shipped scorers run here, in the worker; a function of the user's own package is untrusted
code and runs in a box like workload code (``CohortCodeCalls``), from the bundle
``forklab cohort start`` shipped through the artifact store.

What each function is given, as JSON (``docs/agent-experiments.md``, *Outcomes and
features*):

- the scorer ``f(result, final_state, steps)``: the fork's result (None when it did not
  complete), its final state (the result, or the details of its failure) and its steps;
- the feature function ``f(steps, decisive)``: the steps the forks inherit (those before
  the fork point) and the decisive step's type and label (not its result: that is what the
  worlds decide).

A step is ``{"index", "type", "label", "status", "origin", "seconds", "result"}``, the
result decoded from its JSON payload (None for another encoding, or past
``MAX_RESULT_BYTES``). The rehearsal computes every kept run's features and scores the
first ``REHEARSAL_RUNS`` recorded runs, so code that breaks its contract refuses the plan
before approval, with its sentence; a breach on a fork later stops the experiment.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.client import Client

from forklab.activities.experiment.runner_bundle import code_digest
from forklab.activities.experiment.workload_bundles import WorkloadBundleError, WorkloadBundles
from forklab.activities.heartbeat import heartbeat_until
from forklab.activities.runfork.cohort_teams import team_view
from forklab.activities.runfork.fork_start import final_state
from forklab.activities.runfork.history_events import chain_steps
from forklab.activities.runfork.history_reads import read_chain
from forklab.activities.sandbox.cohort_code_calls import CodeItem, CohortCodeCalls, UserCodeError
from forklab.activities.sandbox.jail import UnconfinedRefused, require_confinement
from forklab.contracts.cohort import ForkJob, UserCode
from forklab.experiments.cohort.plan import CohortPlan, RecordedRun, cohort_digest
from forklab.experiments.cohort.scorers import SHIPPED, score_value
from forklab.experiments.cohort.spec import CohortExperimentSpec
from forklab.experiments.experiment.bundle import BundleFile
from forklab.experiments.runfork.steps import Step
from forklab.runtime import strict_json

#: Recorded runs the rehearsal scores (their own outcome), to find a broken scorer before
#: anyone approves compute.
REHEARSAL_RUNS = 3
#: A step's result larger than this reaches the user's code as None.
MAX_RESULT_BYTES = 256 * 1024
_OWN_PACKAGE = "forklab"


def _decoded(result_b64: str | None) -> Any:
    if result_b64 is None:
        return None
    try:
        payload = Payload.FromString(base64.b64decode(result_b64))
    except ValueError:
        return None
    if payload.metadata.get("encoding") != b"json/plain" or len(payload.data) > MAX_RESULT_BYTES:
        return None
    try:
        return strict_json.loads(payload.data, "a step's result")
    except ValueError:
        return None


def step_view(step: Step) -> dict[str, Any]:
    """A step as the user's code sees it (plain JSON)."""
    return {
        "index": step.index,
        "type": step.activity_type,
        "label": step.label,
        "status": step.status.value,
        "origin": step.origin.value,
        "seconds": None if step.duration_ms is None else step.duration_ms / 1000.0,
        "result": _decoded(step.result_b64),
    }


def decisive_view(step: Step | None) -> dict[str, Any] | None:
    """What is known of the decisive step before it is decided: its type and label."""
    if step is None:
        return None
    return {"index": step.index, "type": step.activity_type, "label": step.label}


def _json(value: Any) -> Any:
    """``value`` as strict JSON (a fork's result with a non-finite number cannot be
    handed to the user's code: a breach of the data, said in one sentence)."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise UserCodeError(f"the fork's result or final state is not plain JSON ({exc})") from None


def user_functions(spec: CohortExperimentSpec) -> dict[str, str]:
    """The spec's functions that are the user's own code, by field: the scorer unless it is
    a shipped one, and the feature function (ForkLab ships none)."""
    named = {} if spec.cohort.outcome in SHIPPED else {"cohort.outcome": spec.cohort.outcome}
    if spec.cohort.features is not None:
        named["cohort.features"] = spec.cohort.features
    return named


def check_names(spec: CohortExperimentSpec, bundle: str | None) -> None:
    """One sentence (``ValueError``) for a function the experiment cannot run: a name in
    ForkLab's own package that is not a shipped scorer, or the user's code without the
    bundle that carries it."""
    for field, name in user_functions(spec).items():
        if name.split(".")[0].split(":")[0] == _OWN_PACKAGE:
            shipped = ", ".join(sorted(SHIPPED))
            what = "scorers" if field == "cohort.outcome" else "scorers (no feature function)"
            raise ValueError(
                f"{field}: {name!r} is not one of ForkLab's shipped {what} ({shipped}); "
                "name one of those or a function of your own package"
            )
        if bundle is None:
            raise ValueError(
                f"{field}: {name!r} is your own code, which runs in a box from the bundle "
                "`forklab cohort start` ships, and this experiment came without one; start "
                "it with forklab cohort start"
            )


class CohortCode:
    """Runs the spec's scorer and feature function: shipped scorers in this process, the
    user's code in ``calls``' boxes from ``bundles`` (a worker without them refuses user
    code with a sentence). ``allow_unconfined`` is the worker's policy for a host without
    bubblewrap, as for workload code."""

    def __init__(
        self,
        bundles: WorkloadBundles | None = None,
        calls: CohortCodeCalls | None = None,
        allow_unconfined: bool = False,
    ) -> None:
        self._bundles = bundles
        self._calls = calls
        self._allow_unconfined = allow_unconfined

    def _files(
        self, field: str, name: str, bundle: str
    ) -> tuple[list[BundleFile], CohortCodeCalls]:
        """The bundle's files on this host (verified against its manifest) and the boxes
        to run them in."""
        bundles, calls = self._boxes(field, name)
        try:
            return bundles.files(bundle), calls
        except WorkloadBundleError as exc:
            raise UserCodeError(f"{field}: {exc}") from None

    def _boxes(self, field: str, name: str) -> tuple[WorkloadBundles, CohortCodeCalls]:
        if self._bundles is None or self._calls is None:
            raise UserCodeError(
                f"{field}: {name!r} is your own code and this worker runs none (it has no "
                "bundle store or box folder); run the experiment on a forklab worker"
            )
        try:
            require_confinement(self._allow_unconfined)
        except UnconfinedRefused as exc:
            raise UserCodeError(f"{field}: {name!r} cannot run: {exc}") from None
        return self._bundles, self._calls

    def prepare(self, spec: CohortExperimentSpec, bundle: str | None) -> UserCode | None:
        """The user's code the plan will run, by the digest of its files (None when the
        spec names shipped scorers only); ``ValueError`` with one sentence otherwise."""
        check_names(spec, bundle)
        named = user_functions(spec)
        if not named or bundle is None:
            return None
        field, name = next(iter(named.items()))
        files, _ = self._files(field, name, bundle)
        return UserCode(bundle=bundle, digest=code_digest(files))

    async def rehearse(
        self,
        spec: CohortExperimentSpec,
        code: UserCode | None,
        plan: CohortPlan,
        recorded: Mapping[str, RecordedRun],
        client: Client,
    ) -> CohortPlan:
        """The plan with every kept run's features (when the spec names a feature
        function) and its digest made again; the scorer tried on the first recorded runs.
        A breach is a ``UserCodeError`` with its sentence."""
        if code is None:
            return plan
        named = user_functions(spec)
        if "cohort.outcome" in named and plan.runs:
            await self._try_scorer(spec, code, plan, client)
        features = spec.cohort.features
        if features is None:
            return plan
        items = []
        for run in plan.runs:
            steps = recorded[run.workflow_id].steps
            decisive = next((s for s in steps if s.index == run.decisive_step), None)
            inherited = [step_view(s) for s in steps if s.index <= run.at_step]
            items.append(CodeItem(f"run {run.workflow_id}", [inherited, decisive_view(decisive)]))
        files, calls = self._files("cohort.features", features, code.bundle)
        found = await heartbeat_until(
            asyncio.to_thread(calls.features, files, code.digest, features, items)
        )
        runs = [r.model_copy(update={"features": f}) for r, f in zip(plan.runs, found, strict=True)]
        out = plan.model_copy(update={"runs": runs})
        out.digest = cohort_digest(out)
        return out

    async def _try_scorer(
        self, spec: CohortExperimentSpec, code: UserCode, plan: CohortPlan, client: Client
    ) -> None:
        items = []
        for run in plan.runs[:REHEARSAL_RUNS]:
            chain = await read_chain(client, run.workflow_id)
            state = final_state(chain)
            if run.team is not None:
                # a team is scored on its result member, with every member's end
                cut = run.team.cuts[0]
                chains = {
                    m.workflow_id: await read_chain(client, m.workflow_id) for m in cut.members
                }
                chain = chains[run.team.result_member]
                view = team_view("", run.workflow_id, run.team.result_member, cut, chains, {})
                state = view.model_dump(mode="json")
            last = chain[-1]
            result = last.close.get("result") if last.status == "completed" else None
            steps = [step_view(s) for s in chain_steps(chain)]
            args = [_json(result), _json(state), steps]
            items.append(CodeItem(f"recorded run {run.workflow_id}", args))
        files, calls = self._files("cohort.outcome", spec.cohort.outcome, code.bundle)
        await heartbeat_until(
            asyncio.to_thread(calls.scores, files, code.digest, spec.cohort.outcome, items)
        )

    async def score(
        self, job: ForkJob, workflow_id: str, result: Any, state: Any, steps: Sequence[Step]
    ) -> tuple[float, bool]:
        """The (score, success) of a fork of recorded run ``workflow_id``: a shipped scorer
        here, the user's in a box of its own (one fork a box: its answer can be no other
        fork's). A breach is a ``UserCodeError`` with its sentence."""
        shipped = SHIPPED.get(job.scorer)
        if shipped is not None:
            try:
                return score_value(shipped(result, state, steps), job.success_threshold)
            except ValueError as exc:
                raise UserCodeError(f"cohort.outcome {job.scorer} {exc}") from None
        if job.code is None:
            raise UserCodeError(
                f"cohort.outcome: {job.scorer!r} is your own code and the fork's job names "
                "no bundle to run it from"
            )
        files, calls = self._files("cohort.outcome", job.scorer, job.code.bundle)
        at = f"run {workflow_id}, world {job.world.name}, fork {job.fork}"
        item = CodeItem(at, [_json(result), _json(state), [step_view(s) for s in steps]])
        (raw,) = await heartbeat_until(
            asyncio.to_thread(calls.scores, files, job.code.digest, job.scorer, [item])
        )
        return score_value(raw, job.success_threshold)
