"""What ``forklab --help`` says of each command, and the example each command's help ends
with, without importing any command's module (stdlib only).

``forklab --help`` lists every command; importing the modules that register them (Temporal's
SDK, pydantic models, the analysis) took seconds before a line was printed. The one-line
help here is the text the command's module registers (``tests/test_cli_startup.py`` checks
that the two agree), so the listing reads the same as the modules' own parsers would.
"""

from __future__ import annotations

from typing import NamedTuple


class Entry(NamedTuple):
    """A command's one-line help and a command line that shows it at work."""

    help: str
    example: str


#: Command → its help line and example, in no particular order (``forklab.cli.main.REGISTRARS``
#: gives the order of ``forklab --help``).
CATALOGUE: dict[str, Entry] = {
    "schema": Entry(
        "print the JSON Schema of an experiment spec", "forklab schema > spec.schema.json"
    ),
    "plan": Entry(
        "rehearse a spec on the local twin (free) and print the report",
        "forklab plan forklab/workloads/retry-cascade.yaml --out plan/",
    ),
    "start": Entry(
        "start an experiment's durable workflow (writes the run's approver key)",
        "forklab start forklab/workloads/retry-cascade.yaml",
    ),
    "bundle": Entry(
        "ship the spec's workload bundle to the artifact store and print its digest "
        "(the workload_bundle of a raw `temporal workflow start`)",
        "forklab bundle my-spec.yaml",
    ),
    "status": Entry(
        "an experiment's stage, plan, approval, progress and budget (no id: the local services)",
        "forklab status retry-cascade --json",
    ),
    "cancel": Entry(
        "cancel a running experiment (cleanup still runs)", "forklab cancel retry-cascade"
    ),
    "report": Entry(
        "write a finished experiment's report (.md, .json, .html); print it",
        "forklab report retry-cascade > report.md",
    ),
    "approve": Entry(
        "approve an experiment's plan, signed with the run's approver key",
        "forklab approve retry-cascade --fingerprint 3f2a…",
    ),
    "keys": Entry(
        "make your approver key pair and print the line to register with workers",
        "forklab keys",
    ),
    "cohort": Entry(
        "experiments over a cohort of recorded agent runs",
        "forklab cohort start support-fixes.yaml",
    ),
    "sign": Entry(
        "print a signed approve request (JSON) for `temporal workflow update execute`",
        "forklab sign retry-cascade > approve.json",
    ),
    "reject": Entry(
        "reject an experiment's plan; it ends without compute",
        'forklab reject retry-cascade --reason "budget too high"',
    ),
    "server": Entry("run the embedded Temporal dev server (foreground)", "forklab server"),
    "worker": Entry("run a ForkLab worker (foreground)", "forklab worker --max-sandboxes 4"),
    "up": Entry(
        "start the dev server and a worker in the background",
        "FORKLAB_ADDRESS=localhost:7256 FORKLAB_UI_PORT=8256 forklab up",
    ),
    "down": Entry("stop what `forklab up` started", "forklab down"),
    "demo": Entry(
        "run the retry-cascade experiment end to end, durably",
        "forklab demo --yes   (or: forklab demo agent, forklab demo workspace)",
    ),
    "fork": Entry(
        "fork an agent run at a step into a new workflow",
        "forklab fork support-run-1 --at-step 3 --model slow --json",
    ),
    "steps": Entry(
        "list the steps of an agent run, its other events and where it forks exactly",
        "forklab steps support-run-1",
    ),
    "diff": Entry(
        "compare two runs' final states", "forklab diff support-run-1 support-run-1--fork-ab12"
    ),
    "trail": Entry(
        "lineage, receipts, policy decisions and ledger of a run",
        "forklab trail support-run-1--fork-ab12 --json",
    ),
    "outcome": Entry(
        "record an outcome (append-only)",
        "forklab outcome support-run-1--fork-ab12 --label resolved --score 1",
    ),
    "promote": Entry(
        "promote a fork; its siblings are closed (append-only), running ones cancelled",
        "forklab promote support-run-1--fork-ab12",
    ),
    "watch": Entry(
        "print a run's event log from an offset", "forklab watch support-run-1 --follow"
    ),
    "agent-worker": Entry("run the agent-run worker (foreground)", "forklab agent-worker"),
    "team": Entry(
        "show a team of workflows, its messages and a cut",
        "forklab team researcher-1 --at-step 3",
    ),
    "fork-team": Entry(
        "fork a team of workflows at a consistent cut, as one operation",
        'forklab fork-team team-1-researcher --override-result 3=\'{"content": "…"}\'',
    ),
    "team-worker": Entry("run the worker of the example team (foreground)", "forklab team-worker"),
    "langgraph-worker": Entry(
        "run the worker of the LangGraph agent (foreground)", "forklab langgraph-worker"
    ),
    "doctor": Entry("list (or delete) leftover ForkLab sandboxes", "forklab doctor --delete"),
    "evals": Entry("run the causal, capacity and acquisition eval suites", "forklab evals --local"),
    "layers": Entry("workspace layers of the local sandboxes", "forklab layers gc --min-age 60"),
    "list": Entry(
        "list experiments, agent runs and forks (from Temporal's visibility)",
        "forklab list --kind fork --lineage support-run-1 --json",
    ),
    "config": Entry(
        "the settings in effect and where each came from (flag, environment, default)",
        "forklab config --json",
    ),
    "completion": Entry("print a shell completion script", 'eval "$(forklab completion bash)"'),
    "temporal": Entry(
        "run the temporal CLI ForkLab installed, pointed at ForkLab's server",
        "forklab temporal workflow list",
    ),
}


def epilog(command: str) -> str | None:
    """The example that ends ``forklab <command> --help``."""
    entry = CATALOGUE.get(command)
    return None if entry is None else f"example:\n  {entry.example}"
