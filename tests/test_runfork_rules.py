"""The pure rules of run forks, and the SQLite run log that applies them (a real file);
the effect ledger's tests are in ``test_effect_ledger_zombie.py``, over both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from forklab.activities.stores.run_log import RunLog
from forklab.experiments.runfork.diff import diff_states, divergence_step
from forklab.experiments.runfork.effects import downstream_key, request_sha256
from forklab.experiments.runfork.fencing import Verdict
from forklab.experiments.runfork.policy import (
    Decision,
    PolicyError,
    ToolPolicy,
    decide,
    parse_policies,
)
from forklab.experiments.runfork.receipt import (
    BoundaryError,
    BoundaryMode,
    PrefixEvent,
    resolve_boundary,
)
from forklab.experiments.runfork.scripted_model import respond
from forklab.experiments.runfork.steps import Step, StepStatus, prefix_sha256


def _steps(n: int, pending_at: int | None = None) -> list[Step]:
    return [
        Step(
            index=i,
            activity_type="t",
            input_sha256=f"in{i}",
            result_sha256=f"out{i}",
            status=StepStatus.pending if i == pending_at else StepStatus.completed,
            run_id="r",
        )
        for i in range(1, n + 1)
    ]


def test_policies_parse_with_a_default_and_decide() -> None:
    p = parse_policies(["charge_customer=block", "email.send=replay"])
    assert p["*"] is ToolPolicy.auto
    assert decide("charge_customer", p, recorded=True) is Decision.blocked
    assert decide("email.send", p, recorded=False) is Decision.blocked
    assert decide("email.send", p, recorded=True) is Decision.serve_recorded
    assert decide("chat_model", p, recorded=True) is Decision.serve_recorded
    assert decide("chat_model", p, recorded=False) is Decision.run_live
    assert decide("x", parse_policies(["*=live"]), recorded=True) is Decision.run_live
    with pytest.raises(PolicyError, match="not one of"):
        parse_policies(["charge_customer=maybe"])
    with pytest.raises(PolicyError, match="TOOL=POLICY"):
        parse_policies(["block"])


def test_exact_boundary_errors_name_the_step_and_the_cause() -> None:
    with pytest.raises(BoundaryError, match=r"step 3 .*never completed"):
        resolve_boundary(_steps(4, pending_at=3), [], 3, BoundaryMode.exact)
    with pytest.raises(BoundaryError, match="only 4 steps"):
        resolve_boundary(_steps(4), [], 5, BoundaryMode.exact)
    signal = [PrefixEvent(kind="local activity", after_step=1)]
    with pytest.raises(BoundaryError, match="local activity reached the parent after step 1"):
        resolve_boundary(_steps(4), signal, 2, BoundaryMode.exact)
    # signals and updates inside the prefix are redelivered: the boundary stays exact
    messages = [PrefixEvent(kind="signal", after_step=1), PrefixEvent(kind="update", after_step=0)]
    assert resolve_boundary(_steps(4), messages, 3, BoundaryMode.exact).restorable
    approx = resolve_boundary(_steps(4), signal, 2, BoundaryMode.approximate)
    assert not approx.restorable and approx.resolved_step == 2
    assert resolve_boundary(_steps(4), signal, 1, BoundaryMode.exact).restorable
    lineage = resolve_boundary(_steps(4), signal, 2, BoundaryMode.lineage_only)
    assert lineage.prefix == [] and lineage.resolved_step == 0


def test_prefix_digest_covers_types_inputs_and_results() -> None:
    a = _steps(3)
    b = [*a[:2], a[2].model_copy(update={"result_sha256": "other"})]
    assert prefix_sha256(a) != prefix_sha256(b)
    assert prefix_sha256(a) == prefix_sha256(_steps(3))


def test_diff_reports_paths_and_divergence() -> None:
    d = diff_states({"a": 1, "b": {"c": [1, 2]}, "x": 0}, {"a": 1, "b": {"c": [1, 3, 4]}, "y": 0})
    assert [c.path for c in d.changed] == ["b.c[1]"]
    assert [c.path for c in d.added] == ["b.c[2]", "y"]
    assert [c.path for c in d.removed] == ["x"]
    assert divergence_step([1, 2, 3], [1, 2, 4]) == 3
    assert divergence_step([1, 2], [1, 2]) is None
    assert divergence_step([1, 2], [1, 2, 3]) == 3


def test_request_digest_ignores_volatile_fields() -> None:
    a = request_sha256({"amount": 1, "nonce": "x"}, volatile=["nonce"])
    assert a == request_sha256({"nonce": "y", "amount": 1}, volatile=["nonce"])
    assert a != request_sha256({"amount": 2, "nonce": "x"}, volatile=["nonce"])


def test_the_service_key_is_one_to_one_and_bounded() -> None:
    """Root ``shop:charge`` with key ``x`` and root ``shop`` with key ``charge:x`` joined
    to one string; the service would have taken the second charge for the first."""
    a = downstream_key("shop:charge", "charge:x")
    b = downstream_key("shop", "charge:charge:x")
    assert a != b
    assert len(downstream_key("r" * 200, "charge:" + "k" * 200)) == len(a) == 72
    assert downstream_key("shop", "charge:x") == downstream_key("shop", "charge:x")


def test_run_log_fences_writers_and_resumes_from_any_offset(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "log.sqlite")
    assert log.append("run", "p", 1, 0, {"n": 0}).offset == 0
    assert log.append("run", "p", 1, 1, {"n": 1}).offset == 1
    dup = log.append("run", "p", 1, 1, {"n": 1})
    assert dup.decision.verdict is Verdict.duplicate and dup.accepted and dup.offset is None
    gap = log.append("run", "p", 1, 3, {"n": 3})
    assert gap.decision.verdict is Verdict.gap and gap.decision.expected_seq == 2
    assert log.append("run", "p", 2, 0, {"n": "new owner"}).offset == 2
    stale = log.append("run", "p", 1, 2, {"n": "zombie"})
    assert stale.decision.verdict is Verdict.stale_epoch and not stale.accepted
    assert log.append("run", "q", 1, 0, {"n": "other producer"}).offset == 3
    assert [e.offset for e in log.read("run")] == [0, 1, 2, 3]
    assert [e.event["n"] for e in log.read("run", after=1)] == ["new owner", "other producer"]
    assert log.count("run") == 4


def test_scripted_model_is_greedy_at_zero_and_varies_with_temperature() -> None:
    msgs = [{"role": "user", "content": "STEP: risks\nTOPIC: t"}]
    assert respond("fast", msgs, []).content == respond("fast", msgs, [], counter=99).content
    texts = {
        respond("slow", msgs, [], temperature=1.5, seed=1, counter=c).content for c in range(40)
    }
    assert len(texts) > 1
    thin = respond("fast", [{"role": "user", "content": "STEP: recommendations\nTOPIC: t"}], [])
    assert thin.content is not None and thin.content.startswith("draft")
    # an unknown name behaves as the documented default model
    unknown = respond("gpt-x", msgs, []).content
    assert unknown == respond("default", msgs, []).content.replace("default", "gpt-x")
    call = respond(
        "slow", [{"role": "user", "content": "TICKET: refund\nCUSTOMER: a@b"}], ["send_email"]
    )
    assert call.tool_calls and call.tool_calls[0].arguments["to"] == "a@b"
