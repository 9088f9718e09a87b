"""Reading a spec file from disk (the CLI's side of ``forklab.experiments.experiment.spec``)."""

from __future__ import annotations

import importlib
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from forklab.cli.errors import CliError
from forklab.experiments.experiment.spec import (
    MAX_SPEC_BYTES,
    ExperimentSpec,
    SpecError,
    load_spec_mapping,
    parse_spec,
)

if TYPE_CHECKING:  # (imported where read: ``forklab plan`` never needs the cohort models)
    from forklab.experiments.cohort.spec import CohortExperimentSpec

#: Exit code for a spec that cannot be run (bad input).
SPEC_EXIT = 2


#: The import path before ``add_import_roots`` first changed it (None: it never did).
_path_before_roots: list[str] | None = None


def add_import_roots(spec_file: Path) -> None:
    """Put the spec file's folder, then the current folder, first on the import path: a
    workload named by import path is found beside its spec or where forklab runs (then on
    ``PYTHONPATH``), and bundled from there for the workers (docs/workloads.md)."""
    global _path_before_roots
    if _path_before_roots is None:
        _path_before_roots = list(sys.path)
    for folder in (Path.cwd(), spec_file.resolve().parent):
        entry = str(folder)
        if entry in sys.path:
            sys.path.remove(entry)
        sys.path.insert(0, entry)
    importlib.invalidate_caches()


@contextmanager
def own_import_path() -> Iterator[None]:
    """ForkLab's own modules imported in this block see the import path as it was before
    ``add_import_roots``: a file beside the spec or in the current folder (a ``yaml.py``,
    a ``numpy.py``) cannot stand in for one of ForkLab's dependencies."""
    before = _path_before_roots
    if before is None:
        yield
        return
    current = list(sys.path)
    sys.path[:] = before
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path[:] = current
        importlib.invalidate_caches()


def load_spec(path: str) -> ExperimentSpec:
    text = read_spec_text(path)
    try:
        return parse_spec(text, path)
    except SpecError as exc:
        raise CliError(str(exc), SPEC_EXIT) from None


def names_cohort(path: str) -> bool:
    """Whether the spec file names a ``cohort:`` and no workload (False when it is not a
    readable mapping: its own reader says why)."""
    try:
        raw = load_spec_mapping(read_spec_text(path), path)
    except (CliError, SpecError):
        return False
    return "cohort" in raw and "workload" not in raw


def load_cohort_spec(path: str) -> CohortExperimentSpec:
    """A spec with a ``cohort:`` (``forklab cohort start``)."""
    # (before ``read_spec_text`` puts the spec's folder first on the import path)
    from forklab.experiments.cohort.spec import parse_cohort_spec

    text = read_spec_text(path)
    try:
        return parse_cohort_spec(text, path)
    except SpecError as exc:
        raise CliError(str(exc), SPEC_EXIT) from None


def read_spec_text(path: str) -> str:
    """The spec file's text (bounded, UTF-8), its folder first on the import path."""
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
    add_import_roots(file)
    return text
