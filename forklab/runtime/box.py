"""The box's entry point: ``python -m forklab.runtime.box {prefix,continue} ...``.

A sandbox runs this module; it reads the request and the checkpoints, calls the runner
(``forklab.runtime.runner``, prefixes) or a world group (``forklab.runtime.world_group``,
each world in a process of its own), and writes the result. It is apart from the engine
so that the engine and the world group import each other in one direction only.
Standard library only.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from forklab.runtime.canon import canonical_json
from forklab.runtime.contract import ContractViolation, exit_with
from forklab.runtime.file_format import WorldPlan, read_request
from forklab.runtime.runner import workload_class, write_prefixes
from forklab.runtime.world_group import run_group


def _read_jsonl(path: str) -> list[Any]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


_MODES = ("prefix", "continue")
_OPTIONS = ("--request", "--checkpoints", "--out")
_USAGE = "usage: forklab-runner {prefix,continue} --request R --checkpoints C --out O"


def parse_args(argv: Sequence[str]) -> tuple[str, dict[str, str]]:
    """``(mode, {option: value})`` from ``MODE --request R --checkpoints C --out O`` (in
    any order, ``--option=value`` too); anything else exits with code 2 and the usage, as
    ``argparse`` did. Parsed by hand: ``argparse`` (with ``re``'s users, ``gettext``) was
    a tenth of every box's start-up (docs/scaling.md)."""

    def fail(why: str) -> NoReturn:
        print(f"{_USAGE}\nforklab-runner: error: {why}", file=sys.stderr)
        raise SystemExit(2)

    modes: list[str] = []
    options: dict[str, str] = {}
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("--"):
            modes.append(arg)
            continue
        name, eq, value = arg.partition("=")
        if name not in _OPTIONS:
            fail(f"unrecognized arguments: {arg}")
        if not eq:
            if not rest or rest[0].startswith("--"):
                fail(f"argument {name}: expected one argument")
            value = rest.pop(0)
        options[name.removeprefix("--")] = value
    if len(modes) != 1 or modes[0] not in _MODES:
        fail(f"give one mode of {', '.join(_MODES)}, not {' '.join(modes) or 'none'}")
    missing = [o for o in _OPTIONS if o.removeprefix("--") not in options]
    if missing:
        fail(f"the following arguments are required: {', '.join(missing)}")
    return modes[0], options


def main(argv: Sequence[str] | None = None) -> int:
    """``prefix``: request → checkpoints (JSON lines). ``continue``: request + checkpoints
    → each of the request's worlds' columns (or why not), each world in a process of its
    own (``forklab.runtime.world_group``). The request is JSON: workload, params,
    seed, episodes | worlds and their seconds, and optionally workspace (see ``_run``)."""
    mode, args = parse_args(sys.argv[1:] if argv is None else argv)
    with open(args["request"], encoding="utf-8") as fh:
        request = read_request(fh.read())
    try:
        return _run(mode, request, args["checkpoints"], args["out"])
    except ContractViolation as violation:
        return exit_with(violation)


def _run(mode: str, request: dict[str, Any], checkpoints: str, out: str) -> int:
    workload = workload_class(request["workload"])(request["params"])
    seed = int(request["seed"])
    # A workload with a workspace: one folder per episode under the request's folder (in
    # a sandbox, the workspace the activity attached; a world's is its own overlay).
    root = None
    if "workspace" in request:
        from pathlib import Path

        root = Path(request["workspace"]).absolute()  # (each world runs in a folder of its own)
    if workload.has_workspace and root is None:
        raise ValueError(f"{type(workload).__name__} has a workspace; the request names none")
    if mode == "prefix":
        write_prefixes(workload, seed, request["episodes"], root, checkpoints)
        result: Any = {"episodes": len(request["episodes"])}
    else:
        worlds = [WorldPlan.from_json(w) for w in request["worlds"]]
        seconds = [float(s) for s in request["seconds"]]
        results = run_group(workload, seed, _read_jsonl(checkpoints), worlds, seconds, root)
        result = {"worlds": results}
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(canonical_json(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
