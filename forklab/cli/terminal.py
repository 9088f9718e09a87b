"""The CLI's output streams, with ``forklab.experiments.visible_text.visible`` applied to
everything written to them (see there for why): every command, its errors, argparse's
messages and the worker's log lines print through them, so no command has to remember
which of its strings came from an untrusted place."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from typing import TextIO, cast

from forklab.experiments.visible_text import visible


class VisibleStream(io.TextIOBase):
    """A text stream that writes to ``raw`` what ``visible`` makes of each string."""

    def __init__(self, raw: TextIO) -> None:
        super().__init__()
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(visible(text))
        return len(text)

    def flush(self) -> None:
        self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def isatty(self) -> bool:
        return self.raw.isatty()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.raw.encoding


@contextlib.contextmanager
def visible_output() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` as ``VisibleStream`` while the block runs."""
    saved = sys.stdout, sys.stderr
    sys.stdout = cast(TextIO, VisibleStream(saved[0]))
    sys.stderr = cast(TextIO, VisibleStream(saved[1]))
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
