"""The fork marker contract, without a server: what the issuer's signature binds, and the
worker's setting of trusted issuers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from forklab.contracts.fork_signature import (
    _UNSIGNED,
    issuer_public_key,
    marker_payload,
    marker_refusal,
    prefix_page_sha256,
    sign_marker,
)
from forklab.contracts.runfork import CohortFork, ForkMarker, ModelSwap, TeamPart, release_digest
from forklab.experiments.runfork.overrides import ForkSignal, InputOverride, ResultOverride
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.receipt import BoundaryMode
from forklab.workers.config import ConfigError
from forklab.workers.runfork.fork_issuers import (
    FORK_ISSUERS,
    FORK_ISSUERS_FILE,
    registered_issuers,
)

KEY = Ed25519PrivateKey.generate()
#: trusted too: a marker re-labelled as its must still not verify
OTHER = Ed25519PrivateKey.generate()
TRUSTED = {issuer_public_key(KEY): "ops", issuer_public_key(OTHER): "ci"}
NOW = datetime(2026, 12, 5, 1, 0, tzinfo=UTC)
MARKER = sign_marker(
    ForkMarker(
        parent_workflow_id="parent",
        source_run_id="run-1",
        base_step=0,
        at_step=3,
        boundary=BoundaryMode.exact,
        lineage_root="parent@run-1",
        model_swaps=[ModelSwap(after_step=3, model="slow")],
        tool_policies={"charge_customer": ToolPolicy.block, "*": ToolPolicy.auto},
        intervention={"hint": 1},
        fork_workflow_id="fork-1",
        start_input_sha256="a" * 64,
        issued_at=NOW,
    ),
    KEY,
)


def _refusal(marker: ForkMarker, **kw: Any) -> str | None:
    args: dict[str, Any] = {
        "trusted": TRUSTED,
        "workflow_id": "fork-1",
        "start_input_sha256": "a" * 64,
        "started_at": NOW + timedelta(seconds=2),
    }
    return marker_refusal(marker, **(args | kw))


def test_a_signed_marker_verifies_for_its_own_run_only() -> None:
    assert _refusal(MARKER) is None
    # what the fork interceptor sets on later runs and children is not signed
    assert _refusal(MARKER.model_copy(update={"continued": True, "child_of": "x"})) is None
    assert "issued for workflow 'fork-1', not 'fork-2'" in (
        _refusal(MARKER, workflow_id="fork-2") or ""
    )
    assert "start input" in (_refusal(MARKER, start_input_sha256="b" * 64) or "")
    late = _refusal(MARKER, started_at=NOW + timedelta(minutes=16))
    assert late is not None and "used again later" in late
    early = _refusal(MARKER, started_at=NOW - timedelta(minutes=6))
    assert early is not None and "used again later" in early
    assert "does not trust" in (_refusal(MARKER, trusted={}) or "")


_SIGNED_CHANGES: list[dict[str, Any]] = [
    {"parent_workflow_id": "other"},
    {"source_run_id": "run-2"},
    {"base_step": 1},
    {"at_step": 4},
    {"boundary": BoundaryMode.approximate},
    {"lineage_root": "other@run-9"},
    {"model_swaps": []},
    {"tool_policies": {"*": ToolPolicy.auto}},
    {"intervention": {"hint": 2}},
    {"issued_at": NOW + timedelta(seconds=1)},
    {"fork_workflow_id": "fork-1 "},
    {"start_input_sha256": "b" * 64},
    {"issuer_key": issuer_public_key(OTHER)},
    {"model": "slow"},
    {"result_override": ResultOverride(step=3, value="ok", result_sha256="c" * 64)},
    {
        "input_override": InputOverride(
            step=4, value={"a": 1}, activity_type="deposit", input_sha256="d" * 64, ordinal=1
        )
    },
    {"signals": [ForkSignal(name="approve", args=[True])]},
    {"cohort": CohortFork(experiment="exp-1", seed=7, run=0, fork=1, world="brownout")},
    {"parent_build": "build-2"},
    {"allow_build_change": True},
    # a team fork's member: another team fork, or its messages sent elsewhere
    {"team": TeamPart(team_fork_id="tf-1", addresses={"writer": "elsewhere"})},
    # a prefix page passed in the start where none was (or another page)
    {"prefix_page_sha256": "e" * 64},
]


@pytest.mark.parametrize("change", _SIGNED_CHANGES)
def test_every_signed_field_is_bound(change: dict[str, Any]) -> None:
    altered = MARKER.model_copy(update=change)
    refusal = _refusal(altered, workflow_id=altered.fork_workflow_id)
    assert refusal == (
        "the fork marker's signature does not verify (the marker, or the prefix page passed "
        "with it, was altered or made up)"
    )


def test_a_passed_page_is_bound_to_its_prefix_and_cannot_be_dropped() -> None:
    """The page digest binds the page to the prefix the marker names: the same bytes cut
    for another run, boundary or override digest differently. A marker signed with a
    page's digest does not verify without it or with another page's; one that passes no
    page signs the bytes it signed before the field existed (older issuers verify)."""
    page = b'{"steps":[]}'
    digest = prefix_page_sha256(MARKER, page)
    assert digest != prefix_page_sha256(MARKER, page + b" ")
    for other in (
        {"source_run_id": "run-2"},
        {"at_step": 4},
        {"base_step": 1},
        {"parent_workflow_id": "other"},
        {"result_override": ResultOverride(step=3, value="ok", result_sha256="c" * 64)},
    ):
        assert prefix_page_sha256(MARKER.model_copy(update=other), page) != digest, other
    with_page = sign_marker(MARKER.model_copy(update={"prefix_page_sha256": digest}), KEY)
    assert _refusal(with_page) is None
    for taken in (None, prefix_page_sha256(MARKER, b'{"steps":[1]}')):
        assert "signature does not verify" in (
            _refusal(with_page.model_copy(update={"prefix_page_sha256": taken})) or ""
        )
    assert b"prefix_page_sha256" not in marker_payload(MARKER)
    assert b"prefix_page_sha256" in marker_payload(with_page)


#: A member's marker as the code before release tokens signed it (key bytes 0..31): its
#: signature, recorded from that code, must verify on this one.
_OLD_KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
_OLD_MEMBER = ForkMarker(
    parent_workflow_id="researcher",
    source_run_id="run-1",
    base_step=0,
    at_step=2,
    boundary=BoundaryMode.exact,
    lineage_root="researcher@run-1",
    fork_workflow_id="tf-1/researcher",
    start_input_sha256="a" * 64,
    issued_at=NOW,
    team=TeamPart(team_fork_id="tf-1", forked=["researcher", "writer"], without_fork=["reviewer"]),
    issuer_key=issuer_public_key(_OLD_KEY),
    signature="8a78134abffcc90d263b76f449c2c2e9c32f6013c056c8e6427e03387fc17112"
    "707e0b266300e236def159b02c5ae8ed44306244b92147e0fa1f90918250b70b",
)


def test_a_members_release_digest_is_bound_and_an_older_member_still_verifies() -> None:
    """The digest of the team fork's release token is signed with the member's marker: a
    marker whose digest was swapped (to release it with a token of one's own) or dropped
    (to make it take any release) does not verify. A member signed before the digest
    existed signs the bytes it signed then."""
    old = {"trusted": {issuer_public_key(_OLD_KEY): "ops"}, "workflow_id": "tf-1/researcher"}
    assert _refusal(_OLD_MEMBER, **old) is None
    assert _OLD_MEMBER.team is not None
    team = _OLD_MEMBER.team.model_copy(update={"release_sha256": release_digest("t" * 64)})
    member = sign_marker(_OLD_MEMBER.model_copy(update={"team": team}), _OLD_KEY)
    assert _refusal(member, **old) is None
    for digest in (release_digest("mine"), None):
        swapped = member.model_copy(
            update={"team": team.model_copy(update={"release_sha256": digest})}
        )
        assert "signature does not verify" in (_refusal(swapped, **old) or ""), digest
    assert b"release_sha256" not in marker_payload(_OLD_MEMBER)
    assert b"release_sha256" in marker_payload(member)
    # a release is anyone's signal: whatever string it carries has a digest (a lone
    # surrogate, which a plain JSON decoder lets through, raised in the held member's handler)
    assert release_digest("\ud800") != team.release_sha256


def test_every_marker_field_is_signed_or_set_by_the_server() -> None:
    """A field added to ``ForkMarker`` is signed unless it is one the interceptor sets on
    later runs and children (the server vouches for those): a forger cannot change it."""
    bound = {key for change in _SIGNED_CHANGES for key in change}
    assert set(ForkMarker.model_fields) - _UNSIGNED == bound
    assert {"signature", "continued", "child_of"} == _UNSIGNED


def test_an_unsigned_marker_or_one_of_another_key_is_refused() -> None:
    bare = MARKER.model_copy(update={"signature": None})
    assert _refusal(bare) == "the fork marker is not signed; start forks with `forklab fork`"
    other = sign_marker(MARKER, Ed25519PrivateKey.generate())
    assert "which this worker does not trust" in (_refusal(other) or "")


def test_the_issuers_setting_is_read_whole_or_refused(tmp_path: Any) -> None:
    key = issuer_public_key(KEY)
    assert registered_issuers({}) is None
    assert registered_issuers({FORK_ISSUERS: f"ops {key}"}) == {key: "ops"}
    file = tmp_path / "issuers"
    file.write_text(f"# the operators' hosts\nops {key}\n")
    assert registered_issuers({FORK_ISSUERS_FILE: str(file)}) == {key: "ops"}
    for env, says in (
        ({FORK_ISSUERS: "ops"}, "FORKLAB_FORK_ISSUERS: entry 1 is not '<name> <public key>'"),
        ({FORK_ISSUERS: " ; "}, "FORKLAB_FORK_ISSUERS names no fork issuer"),
        ({FORK_ISSUERS: f"a {key}; b {key}"}, "one per fork issuer"),
        ({FORK_ISSUERS: f"a {key}", FORK_ISSUERS_FILE: str(file)}, "keep one"),
        ({FORK_ISSUERS_FILE: str(tmp_path / "nope")}, "cannot read"),
    ):
        with pytest.raises(ConfigError) as err:
            registered_issuers(env)
        assert says in str(err.value), (env, err.value)
