"""The draws file: each episode's exogenous block runs, worked out once by the prefix.

On the durable path every world of a chunk runs in a sandbox of its own, so each would
work out the episode's block runs (hash every coordinate, decode every tick) again; the
local twin does that once per episode for all its worlds. A workload that names the runs
its worlds will draw (``Workload.world_blocks``) lets the prefix's sandbox make them
once and write them here; each world's sandbox preloads them (``runner.preload_draws``).

Trust: the prefix's sandbox already decides every world's starting state (the
checkpoints), and this file comes from the same sandbox, through the same store. It is no
security boundary: the world checks it only for honest mistakes (a damaged file, one of
another experiment, a misaligned run), by a checksum, the experiment it names, and by
working out the first tick of every run it uses again.

Layout: ``MAGIC``, the BLAKE2b-256 of the payload in hex and a newline, then the payload,
``marshal`` (version 4) of ``(DRAWS_FORMAT, key, episodes)``: ``key`` names workload,
params and seed; each episode is ``(episode, runs)`` and each run ``(start, stop, words,
decoded)`` in the order of the workload's ``world_blocks``, with ``words`` the run's
64-bit words packed little-endian and ``decoded`` what the block's ``decode`` returned
for each tick. marshal writes an object that occurs more than once only once and then
refers back to it, so a decode that returns one shared object for equal values (as
retry-cascade's does for its patterns of arrivals) makes the file small and quick to read
back: a small share of working the runs out again. Only runners in sandboxes read this
file (never a worker: ``marshal`` is no format for untrusted bytes outside a sandbox).
Standard library only.
"""

from __future__ import annotations

import hashlib
import marshal
import sys
from array import array
from collections.abc import Sequence
from typing import Any

from experiments.runtime.canon import canonical_json
from experiments.runtime.crn import Block, Run

#: Bump when the layout changes.
DRAWS_FORMAT = 1
MAGIC = b"forklab-draws\n"
_DIGEST_HEX = 64

#: A run as the file holds it: start, stop, packed words, decoded ticks.
RunEntry = tuple[int, int, bytes, tuple[Any, ...]]


class DrawsFormatError(ValueError):
    """The draws file is damaged, of another format, or of another experiment."""


def draws_key(workload: str, params: dict[str, Any], seed: int) -> str:
    """What the file's runs depend on besides the episode: workload, params and seed."""
    return canonical_json({"workload": workload, "params": params, "seed": seed})


def pack_words(words: Sequence[int]) -> bytes:
    packed = array("Q", words)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def unpack_words(data: bytes) -> array[int]:
    words = array("Q")
    if words.itemsize != 8 or len(data) % 8:
        raise DrawsFormatError("the packed words are not 64-bit words")
    words.frombytes(data)
    if sys.byteorder != "little":
        words.byteswap()
    return words


class DrawsWriter:
    """Collects the runs of a chunk's episodes, then writes the file (``data``)."""

    def __init__(self, key: str) -> None:
        self._key = key
        self._episodes: list[tuple[int, tuple[RunEntry, ...]]] = []
        self.runs = 0

    def add(self, episode: int, runs: Sequence[Run[Any]]) -> None:
        """The runs of ``episode``, in the order ``world_blocks`` named them."""
        entries = tuple((run.start, run.stop, pack_words(run.words), run.decoded) for run in runs)
        self._episodes.append((episode, entries))
        self.runs += len(entries)

    def data(self) -> bytes:
        payload = marshal.dumps((DRAWS_FORMAT, self._key, self._episodes), 4)
        check = hashlib.blake2b(payload, digest_size=32).hexdigest().encode()
        return MAGIC + check + b"\n" + payload


def read_draws(data: bytes, key: str) -> dict[int, tuple[RunEntry, ...]]:
    """Each episode's runs, checked for shape; raises ``DrawsFormatError`` with the reason."""
    head = len(MAGIC) + _DIGEST_HEX + 1
    if not data.startswith(MAGIC) or len(data) < head or data[head - 1 : head] != b"\n":
        raise DrawsFormatError("it is no draws file")
    payload = data[head:]
    if hashlib.blake2b(payload, digest_size=32).hexdigest().encode() != data[len(MAGIC) : head - 1]:
        raise DrawsFormatError("it fails its checksum (damaged)")
    try:
        value = marshal.loads(payload)
    except (EOFError, ValueError, TypeError) as exc:
        raise DrawsFormatError(f"it cannot be read ({exc})") from None
    if not (isinstance(value, tuple) and len(value) == 3 and value[0] == DRAWS_FORMAT):
        raise DrawsFormatError(f"it is not in draws format {DRAWS_FORMAT}")
    if value[1] != key:
        raise DrawsFormatError("it belongs to another workload, params or seed")
    episodes: dict[int, tuple[RunEntry, ...]] = {}
    try:
        for episode, runs in value[2]:
            for start, stop, words, decoded in runs:
                if not (type(start) is int and type(stop) is int and type(words) is bytes):
                    raise TypeError
                if type(decoded) is not tuple or len(decoded) != max(stop - start, 0):
                    raise TypeError
            if type(episode) is not int or type(runs) is not tuple:
                raise TypeError
            episodes[episode] = runs
    except (TypeError, ValueError):
        raise DrawsFormatError("its runs are not (start, stop, words, decoded ticks)") from None
    return episodes


def to_run(block: Block[Any], entry: RunEntry) -> Run[Any]:
    """A file's run entry as a ``Run`` of ``block`` (``ValueError`` if it does not fit)."""
    start, stop, words, decoded = entry
    return Run(block, start, stop, unpack_words(words), decoded)
