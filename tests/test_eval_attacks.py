"""``forklab evals`` against a Braintrust server that is down, or refuses the rows and
quotes the API key back: one line naming the suite and what to do, exit 1, no traceback,
no key, and never "uploaded"."""

from __future__ import annotations

import pytest
from fake_braintrust import API_KEY, fake_braintrust
from helpers import run_cli


@pytest.mark.parametrize("fault", ["down", "rows refused"])
def test_evals_say_plainly_that_braintrust_did_not_take_them(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    with fake_braintrust() as fake:
        fake.echo_key = True
        if fault == "down":
            fake.down = True
        else:
            fake.fail_logs(500, 1000)
        monkeypatch.setenv("BRAINTRUST_APP_URL", fake.url)
        monkeypatch.setenv("BRAINTRUST_API_KEY", API_KEY)
        code, out, err = run_cli(capsys, "evals")
    assert code == 1, (out, err)
    assert "uploaded to Braintrust" not in out
    # every suite still ran and is shown, each marked as not uploaded
    for suite in ("causal", "capacity", "acquisition"):
        assert f"\n{suite}: " in f"\n{out}" and "cases · ok (not uploaded)" in out
    assert "Braintrust did not take the causal, capacity, acquisition eval suites" in err
    assert "check BRAINTRUST_API_KEY and BRAINTRUST_APP_URL, or run with --local" in err
    assert "Traceback" not in err and API_KEY not in out + err
    assert len(err.strip().splitlines()) == 1, err  # the one line, no SDK output
