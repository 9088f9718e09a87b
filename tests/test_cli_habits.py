"""The CLI habits that need no server: ``forklab config`` says where each setting came from,
``forklab completion bash`` completes the commands, ``forklab temporal`` adds ForkLab's
address, ``forklab list`` keeps quotes out of its queries, and ``forklab demo`` without a
terminal or ``--yes`` stops before any work."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest
from free_ports import free_port

from forklab.cli.catalogue import CATALOGUE
from forklab.cli.errors import CliError
from forklab.cli.habits import temporal_argv
from forklab.cli.list_command import Kind, queries
from tests.helpers import forklab_in_process, run_cli


def test_config_names_the_source_of_each_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("FORKLAB_ADDRESS", "127.0.0.1:7256")
    monkeypatch.setenv("FORKLAB_MODEL_PORT", "8361")
    monkeypatch.setenv("FORKLAB_MODEL_API_KEY", "sk-secret")
    monkeypatch.delenv("FORKLAB_NAMESPACE", raising=False)
    code, out, err = run_cli(capsys, "config", "--json", "--home", str(tmp_path))
    assert (code, err) == (0, "")
    view = json.loads(out)
    assert view["address"] == {"value": "127.0.0.1:7256", "source": "env FORKLAB_ADDRESS"}
    assert view["home"] == {"value": str(tmp_path.resolve()), "source": "flag"}
    assert view["namespace"] == {"value": "default", "source": "default"}
    assert view["http_port"]["value"] == 7266
    assert view["model_port"] == {"value": 8361, "source": "env FORKLAB_MODEL_PORT"}
    assert "sk-secret" not in out and view["model_api_key"]["value"] == "(set)"


def test_bash_completion_completes_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, script, _ = run_cli(capsys, "completion", "bash")
    assert code == 0
    done = subprocess.run(
        [
            "bash",
            "-c",
            script + '\nCOMP_WORDS=(forklab sta); COMP_CWORD=1; _forklab; echo "${COMPREPLY[@]}"',
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == sorted(n for n in CATALOGUE if n.startswith("sta"))


def test_temporal_gets_forklabs_address_unless_the_words_give_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FORKLAB_ADDRESS", "127.0.0.1:7256")
    monkeypatch.setenv("FORKLAB_NAMESPACE", "lab")
    argv = temporal_argv(argparse.Namespace(words=["--", "workflow", "list"]))
    assert argv[0].endswith("temporal")
    assert argv[1:] == ["workflow", "list", "--address", "127.0.0.1:7256", "--namespace", "lab"]
    own = temporal_argv(argparse.Namespace(words=["workflow", "list", "--address=h:1", "-n", "x"]))
    assert own[1:] == ["workflow", "list", "--address=h:1", "-n", "x"]


def _args(**given: object) -> argparse.Namespace:
    base: dict[str, object] = {"kind": None, "status": None, "stage": None, "lineage": None}
    return argparse.Namespace(**{**base, **given})


def test_list_queries_filter_by_kind_status_stage_and_lineage() -> None:
    asked = queries(_args(), "forklab-agents")
    assert set(asked) == set(Kind)
    assert asked[Kind.run] == "TaskQueue = 'forklab-agents' AND ForkLabParent IS NULL"
    staged = queries(_args(stage="awaiting_approval", status="Running"), "q")
    assert staged == {
        Kind.experiment: "ForkLabExperiment IS NOT NULL AND ExecutionStatus = 'Running' "
        "AND ForkLabStage = 'awaiting_approval'"
    }
    # a fork records its lineage root as `<root workflow id>@<first run id>`: a workflow id
    # matches every root of that id, a whole root exactly that one
    lineage = queries(_args(lineage="run-1"), "q")
    assert lineage[Kind.fork].endswith("ForkLabLineageRoot STARTS_WITH 'run-1@'")
    assert lineage[Kind.run].endswith("WorkflowId = 'run-1'")
    root = "run-1@01a243a8-14bd-71bc-9954-0feb09e93ad6"
    whole = queries(_args(lineage=root), "q")
    assert whole[Kind.fork].endswith(f"ForkLabLineageRoot = '{root}'")
    assert whole[Kind.run].endswith("WorkflowId = 'run-1'")


@pytest.mark.parametrize("bad", ["x' OR 'a'='a", "a b", ""])
def test_a_list_filter_that_is_not_an_id_never_reaches_the_query(bad: str) -> None:
    with pytest.raises(CliError) as refused:
        queries(_args(lineage=bad), "q")
    assert refused.value.code == 2 and str(refused.value).startswith("--lineage ")


def test_demo_without_a_terminal_or_yes_stops_before_any_work(tmp_path: Path) -> None:
    env_home = tmp_path / "home"
    done = forklab_in_process(
        {
            "PATH": "/usr/bin:/bin",
            "FORKLAB_HOME": str(env_home),
            "FORKLAB_ADDRESS": f"127.0.0.1:{free_port()}",
        },
        "demo",
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "forklab: error: no terminal to ask for approval; pass --yes to approve non-interactively\n"
    )
    assert not env_home.exists()  # no server, no worker, no experiment
