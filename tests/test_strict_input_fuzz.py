"""Generated input against every place JSON enters besides specs (those are
``test_spec_fuzz.py``'s): the shared strict reader itself, ``forklab fork --intervention``,
the payments/mail service's request bodies, the runner's output read back from a box,
and the experiment workers' payload converter. ``hypothesis`` writes JSON values of every
shape with ``NaN``, ``±Infinity`` and ``1e999`` somewhere in some of them, and raw text;
each entry point either takes a value holding only finite numbers or refuses it in one
line (exit 2, a 400, ``FormatError``, a non-retryable ``BadInput``) — never a traceback,
never a non-finite number taken."""

from __future__ import annotations

import contextlib
import io
import json
import math
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from temporalio.api.common.v1 import Payload
from temporalio.exceptions import ApplicationError

from forklab.cli.main import dispatch
from forklab.runtime import strict_json
from forklab.runtime.file_format import FormatError, parse_world_outputs
from forklab.workers.converter import strict_data_converter
from forklab.workers.runfork.effects_service import EffectsService

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=20,
)


@st.composite
def json_texts(draw: st.DrawFn) -> tuple[str, bool]:
    """JSON text of a generated object, and whether a non-finite number was planted in it
    (in place of one of its numbers or ``null``s, as a key's value or a list item)."""
    value = {"v": draw(values)}
    text = json.dumps(value)
    spots = [i for i, ch in enumerate(text) if text.startswith("null", i)]
    if not spots or not draw(st.booleans()):
        return text, False
    at = draw(st.sampled_from(spots))
    return text[:at] + draw(st.sampled_from(NON_FINITE)) + text[at + 4 :], True


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


@FUZZ
@given(case=json_texts())
def test_the_strict_reader_refuses_exactly_the_non_finite(case: tuple[str, bool]) -> None:
    text, planted = case
    if planted:
        with pytest.raises(strict_json.StrictJsonError, match="not a finite number"):
            strict_json.loads(text, "x")
    else:
        assert strict_json.loads(text, "x") == json.loads(text)


@FUZZ
@given(data=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
def test_the_strict_reader_is_total_on_any_bytes(data: bytes) -> None:
    try:
        value = strict_json.loads(data, "x")
    except strict_json.StrictJsonError as exc:
        assert str(exc).startswith("x: ") and "\n" not in str(exc)
    else:
        assert _finite(value)


@FUZZ
@given(case=json_texts())
def test_fork_intervention_refuses_a_non_finite_number_in_one_line(
    case: tuple[str, bool],
) -> None:
    text, planted = case
    out, err = io.StringIO(), io.StringIO()
    argv = ["fork", "r", "--at-step", "1", "--intervention", text, "--address", "127.0.0.1:1"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = dispatch(argv)
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and out.getvalue() == "", err.getvalue()
    if planted:
        assert code == 2 and "not a finite number" in lines[0], lines
    else:  # past its arguments: it tried the (closed) server
        assert code == 1 and "cannot reach Temporal" in lines[0], lines


@pytest.fixture(scope="module")
def effects() -> Iterator[EffectsService]:
    server = EffectsService(("127.0.0.1", 0))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@FUZZ
@given(case=json_texts())
def test_the_effects_service_charges_only_finite_bodies(
    effects: EffectsService, case: tuple[str, bool]
) -> None:
    text, planted = case
    before = len(effects.log)
    req = urllib.request.Request(
        f"http://127.0.0.1:{effects.server_port}/payments/charge", data=text.encode()
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    assert status == (400 if planted else 200)
    assert len(effects.log) == before + (0 if planted else 1)
    assert all(_finite(e["params"]) for e in effects.log)


@FUZZ
@given(case=json_texts())
def test_a_box_output_holding_a_non_finite_number_is_a_format_error(
    case: tuple[str, bool],
) -> None:
    """The runner never writes one (the workload contract refuses them), so a box that
    did is hostile: its output is garbage, the world fails."""
    text, planted = case
    output = '{"worlds": [{"seconds": 0.5, "error": ' + text + "}]}"
    if planted:
        with pytest.raises(FormatError, match="not a finite number"):
            parse_world_outputs(output.encode(), 1, 1)
    else:
        with contextlib.suppress(FormatError):  # other shapes may be refused for others
            parse_world_outputs(output.encode(), 1, 1)


@FUZZ
@given(case=json_texts())
def test_the_converter_refuses_a_non_finite_payload_as_bad_input(case: tuple[str, bool]) -> None:
    text, planted = case
    payload = Payload(metadata={"encoding": b"json/plain"}, data=text.encode())
    conv = strict_data_converter.payload_converter
    if planted:
        with pytest.raises(ApplicationError) as info:
            conv.from_payloads([payload])
        assert info.value.non_retryable and info.value.type == "BadInput"
    else:
        assert conv.from_payloads([payload]) == [json.loads(text)]
