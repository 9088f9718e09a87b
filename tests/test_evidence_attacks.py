"""What a hostile workload can put on the evidence path (a reviewer's attacks): feature
text that breaks a chart or forges a report line, files a box leaves that would hang or
crash the worker reading them. Real `forklab plan` runs of real workload files, real
FIFOs, real local sandboxes."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest
from helpers import CliResult, forklab_in_process

from forklab.activities.experiment.runner_bundle import bundle_files
from forklab.activities.sandbox import Limits
from forklab.activities.sandbox.base import SandboxError, read_box_file
from forklab.activities.sandbox.local import LocalSandboxBackend
from forklab.experiments.experiment.analysis.slices import MAX_CATEGORIES
from forklab.runtime.canon import sha256_hex
from forklab.runtime.file_format import FormatError, parse_checkpoints, parse_world_outputs

ROOT = Path(__file__).resolve().parent.parent

HOSTILE = '''
from flaky_tool import FlakyTool


class Tagged(FlakyTool):
    """FlakyTool with a text feature that takes TAG in half the episodes."""

    feature_types = {**FlakyTool.feature_types, "tag": str}
    TAG = "x"

    def features(self, state):
        tag = self.TAG if state["items_done"] % 2 else "plain"
        return {**super().features(state), "tag": tag}


class Dollar(Tagged):
    TAG = "a$\\\\foo{$"


class Forge(Tagged):
    TAG = "x\\n\\n## Verdicts\\n\\n| backup | **supported** |"


class Surrogate(Tagged):
    TAG = "x\\ud800"


class Escape(Tagged):
    TAG = "x\\x1b[2J"


class Huge(FlakyTool):
    feature_types = {**FlakyTool.feature_types, "big": int}

    def features(self, state):
        return {**super().features(state), "big": 10**5000}


class Ticketed(FlakyTool):
    """A distinct ticket id in every episode, as a str feature."""

    feature_types = {**FlakyTool.feature_types, "ticket": str}

    def initial_state(self, episode_seed, shocks):
        return {**super().initial_state(episode_seed, shocks), "ticket": f"T{episode_seed}"}

    def features(self, state):
        return {**super().features(state), "ticket": state["ticket"]}


class ManyFeatures(FlakyTool):
    feature_types = {f"f{k}": bool for k in range(33)}

    def features(self, state):
        return {f"f{k}": state["failed_last"] for k in range(33)}


class ForgedName(Tagged):
    feature_types = {**FlakyTool.feature_types, "tag\\n## Verdicts": str}

    def features(self, state):
        return {**FlakyTool.features(self, state), "tag\\n## Verdicts": "x"}
'''


def _plan(tmp_path: Path, workload: str, *extra: str) -> CliResult:
    shutil.copy(ROOT / "examples" / "flaky_tool.py", tmp_path)
    (tmp_path / "hostile.py").write_text(HOSTILE)
    spec = (ROOT / "examples" / "flaky-tool.yaml").read_text()
    spec = spec.replace("name: flaky_tool:FlakyTool", f"name: hostile:{workload}")
    spec = spec.replace("episodes: 500", "episodes: 200")
    path = tmp_path / f"{workload}.yaml"
    path.write_text(spec)
    return forklab_in_process(None, "plan", str(path), *extra, cwd=ROOT)


def test_a_dollar_in_a_feature_is_text_in_the_charts(tmp_path: Path) -> None:
    """matplotlib read `$…$` in a slice's label as mathtext and raised on `\\foo`: the
    HTML report (and on the durable path, the analysis) failed."""
    out = _plan(tmp_path, "Dollar", "--out", str(tmp_path / "report"))
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "report" / "report.html").read_text()
    assert "foo{$" in page


@pytest.mark.parametrize(
    ("workload", "said"),
    [
        ("Forge", "a str feature must be printable text on one line"),
        ("Surrogate", "a str feature must be printable text on one line"),
        ("Escape", "a str feature must be printable text on one line"),
        ("ForgedName", "name a feature with 1 to 100 printable characters on one line"),
        ("Huge", "= an int of 16610 bits; an int feature must fit in 64 bits"),
        ("ManyFeatures", "ManyFeatures.feature_types declares 33 features; declare at most 32"),
    ],
)
def test_feature_text_that_is_not_one_printable_line_breaks_the_contract(
    tmp_path: Path, workload: str, said: str
) -> None:
    """A feature value or name with a line break forged a `## Verdicts` table in report.md
    (through the guard's rule); a lone surrogate crashed the report JSON and the
    terminal; an escape reached report.md raw."""
    out = _plan(tmp_path, workload, "--out", str(tmp_path / "report"))
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert said in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "report").exists()


def _reads_within(seconds: float, read: object) -> BaseException | bytes | None:
    """What ``read()`` returned or raised, or None if it was still blocked after
    ``seconds`` (the thread is left behind: a FIFO nobody writes blocks for ever)."""
    box: list[BaseException | bytes] = []

    def run() -> None:
        try:
            box.append(read())  # type: ignore[operator]
        except BaseException as exc:
            box.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    return box[0] if box else None


def test_a_fifo_a_box_leaves_is_refused_not_read_for_ever(tmp_path: Path) -> None:
    """A workload replaced its answer file with a FIFO as it exited: the worker's read
    blocked for ever (the box had exited, so its wall limit stopped nothing)."""
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    outcome = _reads_within(10, lambda: read_box_file(fifo))
    assert isinstance(outcome, OSError) and "not a regular file" in str(outcome), outcome
    (tmp_path / "real.json").write_bytes(b"{}")
    assert read_box_file(tmp_path / "real.json") == b"{}"
    os.symlink(tmp_path / "real.json", tmp_path / "link.json")
    assert isinstance(_reads_within(10, lambda: read_box_file(tmp_path / "link.json")), OSError)

    backend = LocalSandboxBackend(tmp_path / "sandboxes")
    snapshot = backend.prepare_snapshot(bundle_files("counter-recovery"))
    box = backend.create(snapshot.id, {"forklab.experiment": "fifo"}, Limits())
    try:
        backend.exec(box, ["python", "-c", "import os; os.mkfifo('columns.json')"], 60)
        outcome = _reads_within(10, lambda: backend.download(box, "columns.json"))
        assert isinstance(outcome, SandboxError) and "cannot be read" in str(outcome), outcome
    finally:
        backend.delete(box)


def test_deeply_nested_box_output_is_a_format_error() -> None:
    """`[` × 100,000 escaped the parsers as a RecursionError: the batch's attempt failed
    and was retried, each charged, instead of failing that world."""
    nested = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(FormatError, match="not JSON"):
        parse_world_outputs(nested, 1, 1)
    with pytest.raises(FormatError, match="is not JSON"):
        parse_checkpoints(nested, 0, 1)


@pytest.mark.parametrize(
    "features",
    [{"tag": {"nested": 1}}, {"tag": "x\n## Verdicts"}, {"t\nag": 1}, {"n": 10**400}, []],
)
def test_a_checkpoint_with_features_no_runner_writes_is_refused(features: object) -> None:
    """The box is not trusted to have checked the workload's features: the worker checks
    what the analysis and the reports will read."""
    import json

    state = json.dumps({"step": 1})
    line = {
        "episode": 0,
        "requested": 1,
        "resolved": 1,
        "sha256": sha256_hex(state),
        "state": state,
        "features": features,
    }
    data = (json.dumps(line) + "\n").encode()
    with pytest.raises(FormatError, match="its features are not a mapping of names"):
        parse_checkpoints(data, 0, 1)
    line["features"] = {"tag": "x", "n": 3, "ok": True, "r": 0.5, "none": None}
    assert parse_checkpoints((json.dumps(line) + "\n").encode(), 0, 1)[0]["features"]["n"] == 3


def test_an_id_feature_makes_at_most_max_categories_slices(tmp_path: Path) -> None:
    """A str feature with a distinct value per episode made a slice per value: 3,000
    episodes took 17.1 s and 632 MiB (the chart), 12,000 took 2.2 GiB. Now its rare values
    are one slice, "other", in every table, chart and rule."""
    out = _plan(tmp_path, "Ticketed", "--json", "--out", str(tmp_path / "report"))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    [comparison] = report["comparisons"]
    tickets = [s for s in comparison["slice_effects"] if s["feature"] == "ticket"]
    assert len(tickets) == MAX_CATEGORIES
    other = tickets[-1]
    assert other["value"] == f"other ({200 - (MAX_CATEGORIES - 1)} values)"
    assert list(other["clause"]["ticket"]) == ["not_in"]
    assert sum(s["n"] for s in tickets) == 200
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert markdown.count("| ticket |") == MAX_CATEGORIES
    page = (tmp_path / "report" / "report.html").read_text()
    assert "other (181 values)" in page
