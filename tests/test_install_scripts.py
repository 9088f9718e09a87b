"""The install speaks (issue 36, point 1): one line per phase with its elapsed time, what
is installed and why, and nothing of pip's own output (its ``BuildBackendWarning:
Editable installation`` banner) on the terminal; `make demo` builds the runtime only.

The scripts run for real under bash; the Python they are given is a stand-in that makes a
venv folder and prints what pip prints, so the test takes a second, not a pip install
(the real install is measured in docs/benchmarks/install.md)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

from tests.helpers import ROOT

BANNER = "BuildBackendWarning: Editable installation of forklab"

#: A python that answers --version, makes `-m venv DIR` (with itself as DIR/bin/python)
#: and, as pip, prints pip's noise; FAIL_PIP=1 makes the install fail.
FAKE_PYTHON = f"""#!/usr/bin/env bash
if [ "$1" = --version ]; then echo "Python 3.11.7"; exit 0; fi
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; exit 0; fi
echo "Collecting forklab"; echo "{BANNER}" >&2
if [ "${{FAIL_PIP:-0}}" = 1 ] && [ "$4" != --upgrade ]; then echo "ERROR: no wheel" >&2; exit 3; fi
exit 0
"""


def _python(tmp_path: Path) -> Path:
    python = tmp_path / "python3"
    python.write_text(FAKE_PYTHON)
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return python


def _install(tmp_path: Path, what: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "install.sh"), what],
        cwd=tmp_path,
        env={**os.environ, "PY": str(_python(tmp_path)), "VENV": str(tmp_path / "v"), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_install_says_each_phase_and_keeps_pips_output_in_its_log(tmp_path: Path) -> None:
    done = _install(tmp_path, "runtime")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert BANNER not in done.stdout + done.stderr and "Collecting" not in done.stdout
    assert BANNER in (tmp_path / "v" / "install.log").read_text()
    assert re.fullmatch(
        r"install: 1/3 creating .*v with Python 3\.11\.7 … done \(\d+ s\)", lines[1]
    )
    assert re.fullmatch(r"install: 2/3 upgrading pip … done \(\d+ s\)", lines[2])
    assert lines[3].startswith("install: 3/3 installing ForkLab and its runtime dependencies (")
    assert re.search(r"… done \(\d+ s\)$", lines[3])
    assert re.fullmatch(r"install: .*v ready for runtime in \d+ s \(.+\)", lines[4])
    again = _install(tmp_path, "dev")  # the same folder: reused, now with every extra
    assert again.returncode == 0 and "1/3 " in again.stdout and "exists; reusing it" in again.stdout
    assert "with every extra (Daytona, Braintrust, boto3, psycopg, LangGraph)" in again.stdout


def test_a_failed_phase_shows_the_end_of_the_log_and_its_exit_code(tmp_path: Path) -> None:
    done = _install(tmp_path, "runtime", FAIL_PIP="1")
    assert done.returncode == 3
    assert re.search(r"install: 3/3 installing .* failed \(exit 3\) after \d+ s", done.stdout)
    assert "ERROR: no wheel" in done.stderr and "ready" not in done.stdout
    assert _install(tmp_path, "everything").returncode == 2


def test_make_demo_builds_the_runtime_and_make_test_everything() -> None:
    def recipe(target: str) -> str:
        made = subprocess.run(
            ["make", "-n", "-B", target], cwd=ROOT, capture_output=True, text=True, check=False
        )
        assert made.returncode == 0, made.stderr
        return made.stdout

    demo = recipe("demo")
    assert "install.sh runtime" in demo and "install.sh dev" not in demo
    assert "ensure-bubblewrap.sh" in demo and "forklab demo --yes" in demo
    test = recipe("test")
    assert "install.sh dev" in test
    for script in ("ensure-chromium.sh", "ensure-bubblewrap.sh", "ensure-postgres.sh"):
        assert script in test


def test_each_ensure_script_says_what_it_installs_and_why() -> None:
    why = {
        "ensure-bubblewrap.sh": "confines the workload code",
        "ensure-chromium.sh": "screenshot test",
        "ensure-postgres.sh": "shared-store tests",
    }
    for script, reason in why.items():
        text = (ROOT / "scripts" / script).read_text()
        assert reason in text and "phase " in text, script
        assert not re.search(r"apt-get (update|install)[^\n]*>/dev/null", text), script
