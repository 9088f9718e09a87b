"""Reading a spec file from disk (the CLI's side of ``experiments.spec``)."""

from __future__ import annotations

import stat
from pathlib import Path

from experiments.spec import MAX_SPEC_BYTES, ExperimentSpec, SpecError, parse_spec
from forklab.errors import CliError

#: Exit code for a spec that cannot be run (bad input).
SPEC_EXIT = 2


def load_spec(path: str) -> ExperimentSpec:
    file = Path(path)
    try:
        if not stat.S_ISREG(file.stat().st_mode):
            raise CliError(f"{path}: not a regular file; pass a .yaml or .json spec", SPEC_EXIT)
        with file.open("rb") as handle:  # never more than a spec may weigh (/dev/zero…)
            data = handle.read(MAX_SPEC_BYTES + 1)
        if len(data) > MAX_SPEC_BYTES:
            raise CliError(
                f"{path}: larger than {MAX_SPEC_BYTES // 1024} KiB; a spec is small", SPEC_EXIT
            )
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise CliError(
            f"{path}: no such spec file; pass the path to a .yaml or .json spec", SPEC_EXIT
        ) from None
    except UnicodeDecodeError:
        raise CliError(f"{path}: not UTF-8 text; a spec is YAML or JSON", SPEC_EXIT) from None
    except OSError as exc:
        raise CliError(f"{path}: cannot read the spec ({exc.strerror})", SPEC_EXIT) from None
    try:
        return parse_spec(text, path)
    except SpecError as exc:
        raise CliError(str(exc), SPEC_EXIT) from None
