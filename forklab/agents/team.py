"""Example agent (c): a team of three agents, each its own workflow, exchanging durable
messages — the shape a team fork has to cut consistently.

- the **researcher** makes three model calls (research, insights, then its conclusion at
  step 3, the ``recommendations`` section) and signals its findings to the writer;
- the **writer** waits for the findings, drafts (one model call) and asks the reviewer for
  a review by an update, sent from an activity (``team.send_update``);
- the **reviewer** runs the update's handler: one model call for its note and a
  deterministic verdict: the report is approved only when the researcher's conclusion
  and the draft are substantive.

So the researcher's conclusion at step 3 decides the team's outcome: the stand-in model's
``fast`` writes a thin "draft:" conclusion (rejected), ``slow`` a full one (approved).
Every model call goes over HTTP to an OpenAI-compatible endpoint through ``chat_model``,
as in the research pipeline. Members address each other by the workflow ids in their
inputs (:func:`team_ids` derives them from one team id).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from forklab.contracts.team import TEAM_UPDATE_ACTIVITY, TeamUpdateCall

with workflow.unsafe.imports_passed_through():
    from forklab.agents.inputs import AgentErrorType, checked_input
    from forklab.agents.research_score import MIN_WORDS
    from forklab.agents.tools import ChatAnswer, ChatCall

_CALL_TIMEOUT = timedelta(seconds=60)
_RETRY = RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=5))
#: How long a member waits for the message it needs before it fails.
MESSAGE_WAIT = timedelta(hours=1)
#: The researcher's sections, in order; the last one is its conclusion (step 3).
RESEARCH_STEPS = ("research", "insights", "recommendations")
CONCLUSION_STEP = len(RESEARCH_STEPS)


class TeamIds(BaseModel):
    model_config = ConfigDict(frozen=True)

    researcher: str
    writer: str
    reviewer: str


def team_ids(team_id: str) -> TeamIds:
    return TeamIds(
        researcher=f"{team_id}-researcher",
        writer=f"{team_id}-writer",
        reviewer=f"{team_id}-reviewer",
    )


class ResearcherInput(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str = Field(min_length=1, max_length=500)
    #: the workflow id of the writer it reports to
    writer: str = Field(min_length=1)
    model: str = "fast"
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)


class WriterInput(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str = Field(min_length=1, max_length=500)
    #: the workflow id of the reviewer it asks
    reviewer: str = Field(min_length=1)
    model: str = "slow"


class ReviewerInput(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str = Field(min_length=1, max_length=500)
    model: str = "slow"


class Findings(BaseModel):
    """What the researcher signals to the writer."""

    model_config = ConfigDict(frozen=True)

    topic: str
    sections: dict[str, str]
    conclusion: str


class ReviewRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    conclusion: str
    draft: str


class Review(BaseModel):
    model_config = ConfigDict(frozen=True)

    approved: bool
    reason: str
    note: str = ""


def substantive(text: str) -> bool:
    """The research pipeline's rule for a section: enough words, not a draft."""
    return len(text.split()) >= MIN_WORDS and not text.lower().startswith("draft")


def verdict(request: ReviewRequest) -> tuple[bool, str]:
    """Approve only a substantive conclusion and draft (deterministic, so the outcome of
    a fork depends only on what its members wrote)."""
    if not substantive(request.conclusion):
        return False, "the researcher's conclusion is not substantive"
    if not substantive(request.draft):
        return False, "the draft is not substantive"
    return True, "the conclusion and the draft are substantive"


async def _chat(model: str, step: str, topic: str, context: str, summary: str) -> str:
    answer: ChatAnswer = await workflow.execute_activity(
        "chat_model",
        ChatCall(
            model=model,
            messages=[
                {"role": "system", "content": "You are one member of a research team."},
                {"role": "user", "content": f"STEP: {step}\nTOPIC: {topic}\n{context}"},
            ],
        ),
        result_type=ChatAnswer,
        start_to_close_timeout=_CALL_TIMEOUT,
        retry_policy=_RETRY,
        summary=summary,
    )
    return answer.content


async def _wait(condition: Any, what: str) -> None:
    try:
        await workflow.wait_condition(condition, timeout=MESSAGE_WAIT)
    except TimeoutError:
        raise ApplicationError(
            f"no {what} arrived within {MESSAGE_WAIT}", non_retryable=True
        ) from None


@workflow.defn(name="TeamResearcher")
class ResearcherWorkflow:
    @workflow.run
    async def run(self, inp: ResearcherInput) -> dict[str, Any]:
        inp = checked_input(ResearcherInput, inp)
        sections: dict[str, str] = {}
        for step in RESEARCH_STEPS:
            context = "\n".join(f"{k}: {v}" for k, v in sections.items())
            sections[step] = await _chat(inp.model, step, inp.topic, context, f"researcher: {step}")
        conclusion = sections[RESEARCH_STEPS[-1]]
        findings = Findings(topic=inp.topic, sections=sections, conclusion=conclusion)
        writer = workflow.get_external_workflow_handle(inp.writer)
        try:
            await writer.signal("findings", findings)
        except Exception as exc:
            raise ApplicationError(
                f"could not signal the writer {inp.writer!r} ({exc}): it is not running "
                "(start_team starts it before the researcher)",
                type=AgentErrorType.team_member_unreachable,
                non_retryable=True,
            ) from None
        return findings.model_dump()


@workflow.defn(name="TeamWriter")
class WriterWorkflow:
    def __init__(self) -> None:
        self._findings: Findings | None = None

    @workflow.signal
    def findings(self, findings: Findings) -> None:
        if self._findings is None:  # the first findings count; later ones are ignored
            self._findings = findings

    @workflow.run
    async def run(self, inp: WriterInput) -> dict[str, Any]:
        inp = checked_input(WriterInput, inp)
        await _wait(lambda: self._findings is not None, "findings from the researcher")
        assert self._findings is not None
        conclusion = self._findings.conclusion
        draft = await _chat(
            inp.model, "summary", inp.topic, f"conclusion: {conclusion}", "writer: draft"
        )
        answer = await workflow.execute_activity(
            TEAM_UPDATE_ACTIVITY,
            TeamUpdateCall(
                target=inp.reviewer,
                update="review",
                payload=ReviewRequest(conclusion=conclusion, draft=draft).model_dump(),
            ),
            result_type=dict,
            start_to_close_timeout=_CALL_TIMEOUT,
            retry_policy=_RETRY,
            summary="writer: ask the reviewer",
        )
        review = Review.model_validate(answer)
        return {"conclusion": conclusion, "draft": draft, "review": review.model_dump()}


@workflow.defn(name="TeamReviewer")
class ReviewerWorkflow:
    @workflow.init
    def __init__(self, inp: ReviewerInput) -> None:
        # read here, not in ``run``: the update handler needs the model and topic
        raw = inp if isinstance(inp, ReviewerInput) else None
        self._model = raw.model if raw else "slow"
        self._topic = raw.topic if raw else ""
        self._review: Review | None = None
        self._busy = False

    @workflow.update
    async def review(self, request: ReviewRequest) -> Review:
        self._busy = True
        note = await _chat(
            self._model, "risks", self._topic, f"draft: {request.draft}", "reviewer: note"
        )
        approved, reason = verdict(request)
        self._review = Review(approved=approved, reason=reason, note=note)
        return self._review

    @review.validator
    def _one_review(self, request: ReviewRequest) -> None:
        if self._busy:
            raise ValueError("this reviewer has already taken a review")

    @workflow.run
    async def run(self, inp: ReviewerInput) -> dict[str, Any]:
        inp = checked_input(ReviewerInput, inp)
        self._model, self._topic = inp.model, inp.topic
        await _wait(lambda: self._review is not None, "review request from the writer")
        await workflow.wait_condition(workflow.all_handlers_finished)
        assert self._review is not None
        return self._review.model_dump()


TEAM_WORKFLOWS: list[type] = [ResearcherWorkflow, WriterWorkflow, ReviewerWorkflow]
