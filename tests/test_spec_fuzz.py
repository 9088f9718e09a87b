"""Bad specs never crash the CLI: ``hypothesis`` feeds generated specs (mutated types,
bounds, unicode, YAML aliases and bombs, deep nesting, huge files, binary) to
``forklab plan`` and ``forklab start``. Every run ends with exit 0 (a valid spec), 2 (one
line naming the field or the file) or, for ``start`` of a valid spec with no server, 1;
never a traceback, never a hang. A few nasty files also go through the real executable."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from orchestration_lab import FORKLAB, ROOT

from forklab.cli.experiment.plan_commands import UNCONFINED_WARNING
from forklab.cli.main import dispatch

#: Seconds one example may take before it counts as a hang.
HANG_SECONDS = 60
#: Specs tried per run: 1000 in ``make test``; ``make test-fast`` (the inner loop) sets
#: ``FORKLAB_FUZZ_EXAMPLES=200``, a fifth of the time this one test takes.
EXAMPLES = int(os.environ.get("FORKLAB_FUZZ_EXAMPLES", "1000"))

BASE: dict[str, Any] = yaml.safe_load(
    (ROOT / "forklab" / "workloads" / "recovery-counter.yaml").read_text()
)
BASE.update({"id": "fuzz", "episodes": 20})
BASE["analysis"]["guard"] = {"holdout_episodes": 4}


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in the base spec a mutation can hit."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield (*prefix, i)
            yield from _paths(v, (*prefix, i))


PATHS = list(_paths(BASE))


def _nest(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


#: Values of every shape and size a field may be given.
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([10**4000, -1, 0, 2**63, 10_000_001, 1_000_001, 10**9]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.inf, -math.inf, math.nan, 1e12, 1e308, -0.0, 5e-324]),
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=20),
    st.integers(min_value=1, max_value=200_000).map(lambda n: "é" * n),
    st.lists(st.integers(), max_size=4),
    st.dictionaries(st.text(max_size=6), st.integers() | st.text(max_size=6), max_size=4),
    st.integers(min_value=1, max_value=400).map(_nest),
    st.integers(min_value=0, max_value=300),  # small numbers: valid ones must run fast
    st.floats(min_value=0, max_value=100),
)


def _set(spec: Any, path: tuple[Any, ...], value: Any, action: str) -> None:
    node = spec
    for part in path[:-1]:
        node = node[part]
    last = path[-1]
    if action == "delete":
        del node[last]
    elif action == "extra" and isinstance(node, dict):
        node[f"{last}_extra"] = value
    else:
        node[last] = value


@st.composite
def mutated_spec(draw: st.DrawFn) -> bytes:
    spec = json.loads(json.dumps(BASE))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(PATHS))
        action = draw(st.sampled_from(["set", "set", "delete", "extra"]))
        with contextlib.suppress(KeyError, IndexError, TypeError):  # an earlier mutation
            _set(spec, path, draw(JUNK), action)  # may have removed or replaced the path
    if draw(st.booleans()):
        return json.dumps(spec, allow_nan=True, ensure_ascii=draw(st.booleans())).encode()
    try:
        return yaml.safe_dump(spec, allow_unicode=True).encode()
    except (yaml.YAMLError, RecursionError):
        return json.dumps(spec).encode()


ALIAS_BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}] " for i in range(10)]
    + ["id: bomb", "workload: {name: counter-recovery, params: {target: *k}}"]
)
RAW = st.one_of(
    st.binary(max_size=3000),
    st.text(max_size=500).map(str.encode),
    st.sampled_from(
        [
            ALIAS_BOMB.encode(),
            b"[" * 100_000,
            b"a: " + b"{b: " * 5000 + b"1" + b"}" * 5000,
            b"- " * 20_000 + b"1",
            b"seed: " + b"9" * 5000,
            b"!!python/object/apply:os.system ['echo owned']",
            b"id: x\x00y",
            b"\xff\xfe\x00\x00",
            b"",
            b"null",
            b"[1, 2]",
            b"x: " + b"y" * 3_000_000,
            yaml.safe_dump(BASE).encode() + b"\nextra: " + b"z" * 1_000_000,
        ]
    ),
)


def _one_run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = dispatch(argv)
    return code, out.getvalue(), err.getvalue()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _hang(signum: int, frame: Any) -> None:
    raise TimeoutError(f"a spec took longer than {HANG_SECONDS} s")


def _check(data: bytes, folder: Path, port: int) -> None:
    path = folder / "spec.yaml"
    path.write_bytes(data)
    signal.signal(signal.SIGALRM, _hang)
    signal.alarm(HANG_SECONDS)
    try:
        plan = _one_run(["plan", str(path)])
        start = _one_run(
            ["start", str(path), "--address", f"127.0.0.1:{port}", "--home", str(folder / "h")]
        )
    finally:
        signal.alarm(0)
    event(f"plan exit {plan[0]}, start exit {start[0]}")
    for command, (code, _, err) in (("plan", plan), ("start", start)):
        if code == 0:
            assert command == "plan" and err == "", err
            continue
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("forklab: error: "), (command, err)
        if code == 2:
            assert "field " in err or str(path) in err, err
            assert plan[0] == 2, (plan, start)  # what start refuses, plan refuses too
        else:  # a spec start accepts (plan may still find that its rehearsal cannot run)
            assert command == "start" and code == 1, (command, code, err)
            assert "cannot reach Temporal" in err, err


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as folder:
        yield Path(folder)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.one_of(mutated_spec(), mutated_spec(), mutated_spec(), RAW))
def test_plan_and_start_refuse_every_bad_spec_in_one_line(data: bytes) -> None:
    folder = Path(tempfile.mkdtemp(dir=os.environ.get("FORKLAB_FUZZ_TMP")))
    _check(data, folder, _FUZZ_PORT)


_FUZZ_PORT = _closed_port()


def _base_yaml() -> bytes:
    return yaml.safe_dump(BASE).encode()


@pytest.mark.parametrize(
    "name, data",
    [
        ("alias-bomb", ALIAS_BOMB.encode()),
        ("deep", b"[" * 100_000),
        ("binary", bytes(range(256)) * 8),
        ("long-seed", _base_yaml().replace(b"seed: 0", b"seed: " + b"9" * 5000)),
        ("inf-budget", _base_yaml().replace(b"max_world_seconds: 600", b"max_world_seconds: .inf")),
        ("expiry", _base_yaml().replace(b"expiry_minutes: 60", b"expiry_minutes: 1e12")),
        ("holdout", _base_yaml().replace(b"holdout_episodes: 4", b"holdout_episodes: 1e9")),
    ],
)
def test_the_real_executable_refuses_nasty_specs_without_a_traceback(
    name: str, data: bytes, tmp_path: Path
) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(data)
    for command in ("plan", "start"):
        done = subprocess.run(
            [FORKLAB, command, str(path), "--address" if command == "start" else "--json"]
            + ([f"127.0.0.1:{_closed_port()}"] if command == "start" else []),
            capture_output=True,
            text=True,
            timeout=HANG_SECONDS,
            check=False,
            env={**os.environ, "FORKLAB_HOME": str(tmp_path / "home")},
        )
        assert done.returncode == 2, (command, done.stderr)
        assert done.stdout == "" and "Traceback" not in done.stderr
        assert len(done.stderr.splitlines()) == 1, done.stderr


def test_dev_zero_is_refused_not_read_forever() -> None:
    # a process, so that a command that did read for ever is ended by the timeout
    done = subprocess.run(
        [FORKLAB, "plan", "/dev/zero"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2 and "not a regular file" in done.stderr, done.stderr


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """`forklab plan … | head -1` (and any reader that stops reading) must not print a
    BrokenPipeError traceback."""
    spec = ROOT / "forklab" / "workloads" / "recovery-counter.yaml"
    for command in (f"{FORKLAB} plan {spec} --json | head -1", f"{FORKLAB} schema | true"):
        done = subprocess.run(
            ["bash", "-c", f"set -o pipefail; {command}"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        # nothing but `plan --json`'s unconfined warning (its stdout is the report's)
        assert done.stderr.replace(UNCONFINED_WARNING + "\n", "") == "", (command, done.stderr)
        assert done.returncode in (0, 141), (command, done.returncode)


def _with_param(text: bytes, value: bytes) -> bytes:
    return text.replace(b"target: 6", b"target: 6\n    extra_knob: " + value)


@pytest.mark.parametrize(
    ("name", "data", "where"),
    [
        ("yaml-nan-param", _with_param(_base_yaml(), b".nan"), "workload.params.extra_knob"),
        ("yaml-inf-param", _with_param(_base_yaml(), b"-.inf"), "workload.params.extra_knob"),
        ("yaml-nan-list", _base_yaml().replace(b"- 0\n", b"- .NaN\n", 1), "slack_choices"),
        ("yaml-overflow", _with_param(_base_yaml(), b"1.0e+999"), "workload.params.extra_knob"),
],
)  # fmt: skip
def test_non_finite_numbers_are_refused_anywhere_in_a_spec(
    name: str, data: bytes, where: str, tmp_path: Path
) -> None:
    """YAML's ``.nan``/``.inf`` (and a float too large, ``1.0e+999``) have no canonical JSON
    form: a workload parameter holding one was accepted. (JSON's ``NaN`` read as YAML is
    the string ``'NaN'``, refused by any number field.)"""
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(data)
    code, out, err = _one_run(["plan", str(path)])
    assert code == 2 and out == "", (code, err)
    assert len(err.splitlines()) == 1 and "not a finite number" in err and where in err, err


def test_a_cohort_spec_refuses_a_non_finite_override() -> None:
    from forklab.experiments.cohort.spec import parse_cohort_spec
    from forklab.experiments.experiment.spec import SpecError

    spec = (ROOT / "tests" / "test_cohort_spec.py").read_text()
    text = spec.split('SPEC = """', 1)[1].split('"""', 1)[0]
    hostile = text.replace(
        "  - {name: baseline, role: baseline}",
        "  - {name: baseline, role: baseline}\n"
        "  - {name: patched, role: treatment, override: {value: {refund: .inf}}}",
    )
    with pytest.raises(SpecError, match=r"worlds\[1\]\.override\.value\.refund: inf is not"):
        parse_cohort_spec(hostile, "cohort.yaml")
