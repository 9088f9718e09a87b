"""The example agents' model call and side-effecting tools.

``chat_model`` calls any OpenAI-compatible endpoint with the ``openai`` client.
``charge_customer`` and ``email.send`` go to the payments/mail service through the effect
ledger: key (namespace and lineage root, key name), request digest without volatile
fields, claim token and attempt epoch; in the ambiguous window (claimed, no completion) a tool in
``ledger_query`` mode asks the service whether its key was applied before trying again.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.request
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

import openai
from openai import AsyncOpenAI
from pydantic import BaseModel, ConfigDict, Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from forklab.activities.runfork.run_context import effect_scope, holder, model_seed
from forklab.activities.stores.effect_ledger import Claim, EffectLedger
from forklab.contracts.errors import ForkErrorType
from forklab.experiments.runfork.effects import ClaimOutcome, downstream_key, request_sha256

_RETRYABLE_STATUS = {408, 409, 429}


class ChatCall(BaseModel):
    model_config = ConfigDict(frozen=True)

    model: str
    messages: list[dict[str, str]]
    temperature: float = 0.0


class ChatAnswer(BaseModel):
    content: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ModelActivities:
    def __init__(self, client: AsyncOpenAI) -> None:
        self._client = client

    @activity.defn(name="chat_model")
    async def chat_model(self, call: ChatCall) -> ChatAnswer:
        """One chat completion; an experiment's fork sends the seed its header carries
        (``forklab.experiments.cohort.seeds``), so its sampled answers line up with the
        other worlds' forks of the same run."""
        seed = model_seed()
        try:
            out = await self._client.chat.completions.create(
                model=call.model,
                messages=call.messages,  # type: ignore[arg-type]
                temperature=call.temperature,
                seed=openai.omit if seed is None else seed,
            )
        except openai.APIStatusError as exc:
            retryable = exc.status_code in _RETRYABLE_STATUS or exc.status_code >= 500
            raise ApplicationError(
                f"model endpoint answered {exc.status_code}: {exc.message}",
                non_retryable=not retryable,
            ) from None
        content = out.choices[0].message.content or ""
        usage = out.usage
        return ChatAnswer(
            content=content,
            model=call.model,
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
        )


class LedgerMode(StrEnum):
    #: no ledger, no idempotency key: a retry applies the effect again
    naive = "naive"
    #: the ledger fences attempts and replays completed keys
    ledger = "ledger"
    #: the ledger plus the service's status query in the ambiguous window
    ledger_query = "ledger_query"


class ChargeRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    key_name: str = Field(min_length=1, max_length=200)
    customer: str
    amount_cents: int = Field(gt=0)


class EffectResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    key_name: str
    effect_id: str
    status: str  # applied | replayed | recovered
    kind: str


#: Added to an attempt's timeout for its lease: the clocks of the hosts that read it
LEASE_MARGIN = timedelta(seconds=5)
#: An attempt's lease when its activity has no timeout that bounds it
DEFAULT_LEASE = timedelta(minutes=2)
#: The share of its lease an attempt spends waiting for another execution's claim
HELD_WAIT_SHARE = 0.5


def attempt_lease(info: activity.Info) -> float:
    """Seconds during which this attempt may still apply its effect: its start-to-close
    timeout (else its schedule-to-close) and a margin. Temporal starts no later attempt
    of it before that; another execution meeting its claim waits as long."""
    bound = info.start_to_close_timeout or info.schedule_to_close_timeout or DEFAULT_LEASE
    return (bound + LEASE_MARGIN).total_seconds()


class EffectTools:
    def __init__(
        self,
        service_url: str,
        ledger: EffectLedger,
        mode: LedgerMode = LedgerMode.ledger_query,
        crash_point: str | None = None,
        crash_flag: Path | None = None,
        hang_seconds: float | None = None,
    ) -> None:
        self._url = service_url.rstrip("/")
        self._ledger = ledger
        self._mode = mode
        self._crash_point = crash_point
        self._crash_flag = crash_flag
        self._hang_seconds = hang_seconds

    async def _maybe_crash(self, point: str) -> None:
        """Fault injection for benchmarks and tests, once (the flag file remembers): kill
        the worker at a named point, or make this attempt hang there (a zombie that
        finishes after its successor)."""
        if self._crash_point != point or self._crash_flag is None:
            return
        if self._crash_flag.exists():
            return
        self._crash_flag.write_text(point)
        if self._hang_seconds is not None:
            await asyncio.sleep(self._hang_seconds)
            return
        os._exit(137)

    def _http(
        self, method: str, path: str, body: dict[str, Any] | None, key: str | None
    ) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self._url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if key is not None:
            req.add_header("Idempotency-Key", key)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                out: dict[str, Any] = json.loads(resp.read())
                return out
        except urllib.error.HTTPError as exc:
            raise ApplicationError(
                f"effects service answered {exc.code} on {path}", non_retryable=exc.code < 500
            ) from None

    async def _claim(self, root: str, ledger_key: str, digest: str, key_name: str) -> Claim:
        """Claim the key; while another execution holds it (a fork's parent still
        charging), wait in this attempt, checking again with a growing pause, for at most
        half the attempt's timeout; then leave it to a later attempt, after the holder's
        lease. Its completion then replays here; its death makes the claim ours."""
        info = activity.info()
        lease = attempt_lease(info)
        deadline = time.monotonic() + lease * HELD_WAIT_SHARE
        pause = 0.25
        while True:
            claim = await asyncio.to_thread(
                self._ledger.claim,
                root,
                ledger_key,
                info.activity_type,
                digest,
                holder(),
                info.attempt,
                lease,
            )
            if claim.outcome is not ClaimOutcome.held:
                return claim
            assert claim.entry is not None and claim.retry_after is not None
            left = deadline - time.monotonic()
            if left <= 0:
                wait = max(claim.retry_after, 1.0)
                raise ApplicationError(
                    f"key {key_name!r} is held by {claim.entry.holder}, whose attempt may "
                    f"still be applying it; trying again in {wait:.0f} s",
                    type=ForkErrorType.effect_held,
                    next_retry_delay=timedelta(seconds=wait),
                )
            await asyncio.sleep(max(min(pause, claim.retry_after, left), 0.05))
            pause = min(pause * 2, 5.0)

    async def _apply(
        self, kind: str, path: str, key_name: str, params: dict[str, Any]
    ) -> EffectResult:
        if self._mode is LedgerMode.naive:
            await self._maybe_crash("before_call")
            out = await asyncio.to_thread(self._http, "POST", path, params, None)
            await self._maybe_crash("after_apply")
            # nothing records a completion here: "after completion" is the same moment
            await self._maybe_crash("after_complete")
            return EffectResult(
                key_name=key_name, effect_id=out["effect"]["effect_id"], status="applied", kind=kind
            )
        root = effect_scope()
        info = activity.info()
        ledger_key = f"{kind}:{key_name}"
        digest = request_sha256(params)
        claim = await self._claim(root, ledger_key, digest, key_name)
        if claim.outcome is ClaimOutcome.mismatch:
            raise ApplicationError(
                f"key {key_name!r} was used for a different request",
                type=ForkErrorType.idempotency_mismatch,
                non_retryable=True,
            )
        if claim.outcome is ClaimOutcome.fenced:
            raise ApplicationError(
                f"attempt {info.attempt} is fenced: a newer attempt holds key {key_name!r}",
                type=ForkErrorType.fenced,
                non_retryable=True,
            )
        if claim.outcome is ClaimOutcome.replay:
            assert claim.entry is not None and claim.entry.result is not None
            return EffectResult.model_validate({**claim.entry.result, "status": "replayed"})
        assert claim.claim_token is not None
        service_key = (
            downstream_key(root, ledger_key) if self._mode is LedgerMode.ledger_query else None
        )
        effect: dict[str, Any] | None = None
        status = "applied"
        if claim.outcome is ClaimOutcome.ambiguous and service_key is not None:
            found = await asyncio.to_thread(
                self._http, "GET", f"/effects/status?key={service_key}", None, None
            )
            if found["applied"]:
                effect, status = found["effect"], "recovered"
        if effect is None:
            await self._maybe_crash("before_call")
            out = await asyncio.to_thread(self._http, "POST", path, params, service_key)
            effect = out["effect"]
            await self._maybe_crash("after_apply")
        result = EffectResult(
            key_name=key_name, effect_id=effect["effect_id"], status=status, kind=kind
        )
        ok = await asyncio.to_thread(
            self._ledger.complete, root, ledger_key, claim.claim_token, result.model_dump()
        )
        if not ok:
            raise ApplicationError(
                f"completion of {key_name!r} rejected: a newer attempt holds the claim",
                type=ForkErrorType.fenced,
                non_retryable=True,
            )
        await self._maybe_crash("after_complete")
        return result

    @activity.defn(name="charge_customer")
    async def charge_customer(self, req: ChargeRequest) -> EffectResult:
        params = {"customer": req.customer, "amount_cents": req.amount_cents}
        return await self._apply("charge", "/payments/charge", req.key_name, params)

    @activity.defn(name="email.send")
    async def send_email(self, to: str, subject: str, body: str) -> str:
        """Send one email to a customer (the support agent's tool)."""
        params = {"to": to, "subject": subject, "body": body}
        key = "email-" + request_sha256(params)[:16]
        result = await self._apply("email", "/mail/send", key, params)
        return f"email {result.status}: {result.effect_id}"
