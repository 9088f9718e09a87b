"""Reading a spec file from disk (the CLI's side of ``experiments.spec``)."""

from __future__ import annotations

from pathlib import Path

from experiments.spec import ExperimentSpec, SpecError, parse_spec
from forklab.errors import CliError

#: Exit code for a spec that cannot be run (bad input).
SPEC_EXIT = 2


def load_spec(path: str) -> ExperimentSpec:
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CliError(
            f"{path}: no such spec file; pass the path to a .yaml or .json spec", SPEC_EXIT
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"{path}: cannot read the spec ({exc})", SPEC_EXIT) from None
    try:
        return parse_spec(text, path)
    except SpecError as exc:
        raise CliError(str(exc), SPEC_EXIT) from None
