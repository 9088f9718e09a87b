"""A hostile or broken Daytona server against the real ``daytona`` SDK and ForkLab's
backend (tests/fake_daytona.py in its hostile modes): ids that are paths or escapes,
bodies that never end, connections that never answer, answers that are not JSON."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from daytona import DaytonaError
from fake_daytona import API_KEY, FakeDaytona, fake_daytona

from forklab.activities.experiment.runner_bundle import bundle_files
from forklab.activities.sandbox.base import Limits, SandboxError
from forklab.activities.sandbox.daytona import DaytonaOptions, DaytonaSandboxBackend
from forklab.activities.sandbox.daytona_http import bound_client
from forklab.activities.sandbox.preflight import SandboxUnavailableError

LABELS = {"forklab.experiment": "exp-1", "forklab.world": "w", "forklab.batch": "0"}


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeDaytona]:
    with fake_daytona(tmp_path / "daytona") as state:
        state.add_snapshot("forklab-runner")
        state.set_region("eu", cpu=8, mem=16, disk=30)
        yield state


@pytest.fixture
def backend(fake: FakeDaytona, tmp_path: Path) -> DaytonaSandboxBackend:
    opts = DaytonaOptions(
        api_key=API_KEY,
        api_url=fake.api_url,
        target="eu",
        snapshot="forklab-runner",
        create_timeout=3.0,
        request_timeout=1.0,
        delete_wait=1.0,
    )
    return DaytonaSandboxBackend(opts, tmp_path / "bundles")


def _within(seconds: float, call: Callable[[], object]) -> BaseException | None:
    """Run ``call`` in a thread; fail if it is still running after ``seconds``."""
    raised: list[BaseException | None] = [None]

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # the test judges it
            raised[0] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting on Daytona after {seconds} s"
    return raised[0]


@pytest.mark.parametrize(
    "hostile", ["../../sandbox/victim", "..", "sbx-1\n## Verdicts\x1b[2J", "sbx\u202eabc"]
)
def test_a_created_sandbox_id_that_is_not_plain_is_refused_and_deleted(
    fake: FakeDaytona, backend: DaytonaSandboxBackend, hostile: str
) -> None:
    info = backend.prepare_snapshot(bundle_files("retry-cascade"))
    fake.create_id = hostile
    with pytest.raises(SandboxError, match="not a plain id") as err:
        backend.create(info.id, LABELS, Limits(wall_seconds=30))
    assert ascii(hostile) in str(err.value)
    assert str(err.value).isascii() and str(err.value).isprintable()
    # no toolbox request went anywhere (before: ``../../sandbox/victim`` sent the bundle
    # upload, with the API key, to ``POST /sandbox/victim/files/bulk-upload``)
    toolbox = ("upload", "download", "exec")
    assert not [path for name, path in fake.calls if name in toolbox or "victim/" in path]
    if hostile == "..":  # no URL can name it (``/sandbox/..`` is ``/``): left, and listed
        assert backend.list({}) == [".."]
    else:
        assert fake.live() == []  # deleted through the control plane, which quotes the id


def test_a_lookup_answered_with_another_sandbox_is_refused(
    fake: FakeDaytona, backend: DaytonaSandboxBackend
) -> None:
    info = backend.prepare_snapshot(bundle_files("retry-cascade"))
    sid = backend.create(info.id, LABELS, Limits(wall_seconds=30))
    fake.get_as = "../../sandbox/other"
    with pytest.raises(
        SandboxError, match=re.escape("with sandbox '../../sandbox/other'; refused")
    ):
        backend.exec(sid, ["python", "-c", "print(1)"], 10)
    assert "exec" not in [name for name, _ in fake.calls]


@pytest.mark.parametrize("route", ["exec", "list"])
def test_a_body_that_never_ends_is_refused_at_a_bound(
    fake: FakeDaytona, backend: DaytonaSandboxBackend, route: str
) -> None:
    info = backend.prepare_snapshot(bundle_files("retry-cascade"))
    sid = backend.create(info.id, LABELS, Limits(wall_seconds=30))
    fake.endless.add(route)
    with pytest.raises(SandboxError, match="longer than 16 MiB; refused"):
        if route == "exec":
            backend.exec(sid, ["python", "-c", "print(1)"], 10)
        else:
            backend.list({})


@pytest.mark.parametrize("route", ["snapshot_get", "get", "upload", "download"])
def test_a_server_that_never_answers_is_a_retryable_error_in_bounded_time(
    fake: FakeDaytona, backend: DaytonaSandboxBackend, route: str
) -> None:
    info = backend.prepare_snapshot(bundle_files("retry-cascade"))
    sid = backend.create(info.id, LABELS, Limits(wall_seconds=30))
    fake.hang.add(route)
    calls: dict[str, Callable[[], object]] = {
        "snapshot_get": lambda: backend.preflight(info.id, 1),
        "get": lambda: backend.exec(sid, ["true"], 5),
        "upload": lambda: backend.upload(sid, "x", b"1"),
        "download": lambda: backend.download(sid, "x"),
    }
    start = time.monotonic()
    raised = _within(30, calls[route])
    assert isinstance(raised, SandboxUnavailableError), raised  # the retry policy decides
    assert "will retry" in str(raised) and time.monotonic() - start < 30


def test_an_answer_that_is_not_json_is_one_clear_error(
    fake: FakeDaytona, backend: DaytonaSandboxBackend
) -> None:
    fake.garbage.add("list")
    with pytest.raises(SandboxError, match=r"^Daytona sandbox list failed") as err:
        backend.list({})
    assert API_KEY not in str(err.value)


@pytest.mark.parametrize("route", ["create", "list", "exec", "usage"])
def test_a_server_that_quotes_the_api_key_back_never_gets_it_shown(
    fake: FakeDaytona, backend: DaytonaSandboxBackend, route: str
) -> None:
    info = backend.prepare_snapshot(bundle_files("retry-cascade"))
    sid = backend.create(info.id, LABELS, Limits(wall_seconds=30))
    fake.echo_key = True
    fake.fail(route, 500)
    calls: dict[str, Callable[[], object]] = {
        "create": lambda: backend.create(info.id, LABELS, Limits(wall_seconds=30)),
        "list": lambda: backend.list({}),
        "exec": lambda: backend.exec(sid, ["true"], 5),
        "usage": lambda: backend.preflight(info.id, 1),
    }
    with pytest.raises(SandboxError) as err:
        calls[route]()
    assert "you sent Bearer <DAYTONA_API_KEY>" in str(err.value)
    assert API_KEY not in str(err.value)


def test_an_sdk_without_the_clients_to_bound_is_refused_in_one_sentence() -> None:
    """The bounds wrap the SDK's private REST clients; a release without them must not
    run unbounded (nor fail with an AttributeError)."""
    with pytest.raises(DaytonaError, match=r"has no REST clients for ForkLab to bound"):
        bound_client(object(), 1.0)
