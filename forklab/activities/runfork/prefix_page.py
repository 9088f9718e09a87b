"""A page of a fork's inherited prefix, cut from the parent's parsed run: what
``forklab.fetch_prefix`` serves, and what ``forklab fork`` passes in the fork's start.

``forklab fork`` has just read and parsed the run holding the fork's step (it resolves
the boundary there); reading and parsing it again on the worker is most of what a fork
inside a run costs more than one at a run's end. So when the whole prefix fits in one
page, the starter cuts that page here — the same cut the fetch makes — and passes it in
the fork's start header (``PREFIX_PAGE_HEADER``), its digest in the signed marker; the
fetch then verifies the marker and reads nothing, and the workflow takes the page from its
own start (a fork recorded before that got the page back as the fetch's result). It is
passed only where the worker's read would give the same page: the run has closed (its
history is final) and is the one the fork starts from.

The digest is signed with the marker but not written to the memo (Temporal wants a memo
under 2 KiB): whoever verifies a fork's marker takes it from the page its start carries
(``as_signed``), so a page altered, swapped for another fork's, added or taken away after
signing makes the signature fail.
"""

from __future__ import annotations

from temporalio.api.common.v1 import Payload
from temporalio.api.history.v1 import WorkflowExecutionStartedEventAttributes

from forklab.activities.runfork.history_events import RunRecord
from forklab.activities.runfork.overrides import override_b64
from forklab.contracts.fork_signature import prefix_page_sha256
from forklab.contracts.runfork import PREFIX_PAGE_HEADER, FetchPrefixInput, ForkMarker, PrefixPage
from forklab.experiments.runfork.call_match import in_flight
from forklab.experiments.runfork.overrides import overridden
from forklab.experiments.runfork.prefix_messages import inside
from forklab.experiments.runfork.steps import Step, StepStatus

#: The largest page passed in a fork's start (bytes of JSON): half of Temporal's
#: blob-size warning (512 KiB by default; its limit is 2 MiB), so that the start, which
#: also carries the workflow's input and the receipt, stays under it. The page is in the
#: fork's history once, in its start (the first fetch answers with the marker's verdict
#: alone: ``FetchPrefixInput.page_in_start``); a prefix past this, or past one fetch page
#: (``FetchPrefixInput.max_bytes``), is read by the worker instead and is in the history
#: once too, in the fetches' results.
MAX_PASSED_BYTES = 256 * 1024


def prefix_page(rec: RunRecord, req: FetchPrefixInput) -> PrefixPage:
    """Steps ``req.from_step..req.upto_step`` of ``rec`` with their results (the override
    applied), at most ``req.max_bytes`` of them (``next_step`` then says where the next
    page starts); on the last page also the run's completed calls after the boundary and
    the calls it had in flight there; the messages and clock of the page's steps, and on
    the first page the run's seed."""
    steps = rec.steps
    if req.result_override is not None:
        steps = overridden(steps, req.result_override, override_b64(req.result_override))
    seed = rec.seed if req.from_step == req.base_step + 1 else None
    wanted = [s for s in steps if req.from_step <= s.index <= req.upto_step]
    out: list[Step] = []
    size = 0
    for s in wanted:
        size += len(s.result_b64 or "") + 400
        if out and size > req.max_bytes:
            return PrefixPage(
                steps=out,
                next_step=s.index,
                messages=inside(rec.inputs.messages, req.from_step - 1, out[-1].index),
                clock=_clock(rec.inputs.clock, req.from_step - 1, out[-1].index),
                seed=seed,
            )
        out.append(s)
    after = [
        s
        for s in rec.steps
        if s.index > req.upto_step and s.status is StepStatus.completed and s.result_b64
    ]
    kept: list[Step] = []
    for s in after:
        size += len(s.result_b64 or "") + 400
        if size > req.max_bytes:
            break
        kept.append(s)
    return PrefixPage(
        steps=out,
        recorded_after=kept,
        in_flight=in_flight(rec.steps, req.upto_step),
        messages=inside(rec.inputs.messages, req.from_step - 1, req.upto_step),
        clock=_clock(rec.inputs.clock, req.from_step - 1, req.upto_step),
        seed=seed,
    )


def passed_page(rec: RunRecord, req: FetchPrefixInput) -> bytes | None:
    """The JSON of the fork's whole prefix as one page of ``rec``, to pass in its start;
    None when the worker must read instead: the run is still open (its history may grow
    before the fork reads it), or the prefix needs more than one page or
    ``MAX_PASSED_BYTES``."""
    if not rec.closed or rec.run_id != req.run_id or req.from_step != req.base_step + 1:
        return None
    page = prefix_page(rec, req)
    if page.next_step is not None:
        return None
    data = page.model_dump_json(exclude_defaults=True).encode()
    return data if len(data) <= MAX_PASSED_BYTES else None


def page_payload(data: bytes) -> Payload:
    """A page's JSON as the payload a fork's start header carries and its fetch returns."""
    return Payload(metadata={"encoding": b"json/plain"}, data=data)


def passed_in(started: WorkflowExecutionStartedEventAttributes) -> Payload | None:
    """The prefix page a run's start carries (None: none), as the JSON it was signed as:
    the payload's metadata is not signed, so it is not taken from the start."""
    passed = started.header.fields.get(PREFIX_PAGE_HEADER)
    return page_payload(passed.data) if passed is not None else None


def as_signed(marker: ForkMarker, started: WorkflowExecutionStartedEventAttributes) -> ForkMarker:
    """``marker`` (read from a run's memo) as its issuer signed it, for the run that
    ``started``: with the digest of the prefix page that start carries, or without one."""
    passed = passed_in(started)
    digest = prefix_page_sha256(marker, passed.data) if passed is not None else None
    return marker.model_copy(update={"prefix_page_sha256": digest})


def _clock(clock: dict[int, int], lo: int, hi: int) -> dict[int, int]:
    """The workflow task times of positions ``lo..hi`` (steps handed over)."""
    return {n: t for n, t in clock.items() if lo <= n <= hi}
