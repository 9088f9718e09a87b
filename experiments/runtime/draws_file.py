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
params and seed; each episode is ``(episode, runs)`` in the order of the workload's
``world_blocks``, and each run ``(start, stop, head, total, width, ticks)``:

- ``head``: the 64-bit words of the run's first tick, packed little-endian (what the world
  checks); ``total``: the sum (mod 2**64) of the words of the run's distinct coordinates
  (with their number, which the block and the ticks give, all its fingerprint needs; the
  other words are never read, so they are not shipped);
- what the block's ``decode`` returned for each tick: when every tick is a plain tuple of
  the same ``width``, ``ticks`` holds it by column (a column of floats packed as 64-bit
  doubles, any other column a tuple), so that reading it back makes no object per tick
  until the world preloads the episode; otherwise ``width`` is 0 and ``ticks`` is the
  tuple of decodings itself.

marshal writes an object that occurs more than once only once and then refers back to
it, so a decode that returns one shared object for equal values (as retry-cascade's does
for its patterns of arrivals) makes the file small and quick to read back. A file of
another format (a worker of another build wrote it) is not refused: the world works its
runs out itself, as without the file. Only runners in sandboxes read this file (never a
worker: ``marshal`` is no format for untrusted bytes outside a sandbox). Standard library
only.
"""

from __future__ import annotations

import hashlib
import marshal
import sys
from array import array
from collections.abc import Sequence
from typing import Any

from experiments.runtime.canon import canonical_json
from experiments.runtime.crn import Block, EpisodeDraws, Run

#: Bump when the layout changes (2: the sum instead of every word; ticks by column).
DRAWS_FORMAT = 2
MAGIC = b"forklab-draws\n"
_DIGEST_HEX = 64
_MASK64 = (1 << 64) - 1

#: A run as the file holds it: start, stop, first tick's packed words, the sum of its
#: words, and its decoded ticks (by column when the width is not 0).
RunEntry = tuple[int, int, bytes, int, int, tuple[Any, ...]]


class DrawsFormatError(ValueError):
    """The draws file is damaged, of another format, or of another experiment."""


class OtherFormatError(DrawsFormatError):
    """The draws file is of another format (another build wrote it): not an error for a
    world, which then works its runs out itself."""


def draws_key(workload: str, params: dict[str, Any], seed: int) -> str:
    """What the file's runs depend on besides the episode: workload, params and seed."""
    return canonical_json({"workload": workload, "params": params, "seed": seed})


def _pack(typecode: str, values: Sequence[Any]) -> bytes:
    """``values`` as 8-byte little-endian items (``Q``: 64-bit words, ``d``: doubles)."""
    packed = array(typecode, values)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def _unpack(typecode: str, data: bytes) -> array[Any]:
    items = array(typecode)
    if items.itemsize != 8 or len(data) % 8:
        raise DrawsFormatError(f"the packed items are not 8-byte {typecode!r} items")
    items.frombytes(data)
    if sys.byteorder != "little":
        items.byteswap()
    return items


def pack_words(words: Sequence[int]) -> bytes:
    return _pack("Q", words)


def unpack_words(data: bytes) -> array[int]:
    return _unpack("Q", data)


def _by_column(decoded: tuple[Any, ...]) -> tuple[int, tuple[Any, ...]]:
    """``(width, columns)`` for ticks that are all plain tuples of one width, each column
    of floats packed; ``(0, decoded)`` for any other."""
    if not decoded or type(decoded[0]) is not tuple or not decoded[0]:
        return 0, decoded
    width = len(decoded[0])
    if any(type(tick) is not tuple or len(tick) != width for tick in decoded):
        return 0, decoded
    columns: list[Any] = []
    for column in zip(*decoded, strict=True):
        if all(type(value) is float for value in column):
            columns.append(_pack("d", column))
        else:
            columns.append(column)
    return width, tuple(columns)


def _by_tick(width: int, ticks: tuple[Any, ...], length: int) -> tuple[Any, ...]:
    """The decodings of ``length`` ticks back from ``_by_column``; ``ValueError`` if they
    do not fit."""
    if not width:
        if len(ticks) != length:
            raise ValueError("one decoding per tick")
        return ticks
    if len(ticks) != width:
        raise ValueError(f"{width} columns")
    columns: list[Sequence[Any]] = []
    for column in ticks:
        if type(column) is bytes:
            if len(column) != 8 * length:
                raise ValueError("one float per tick")
            columns.append(_unpack("d", column).tolist())
        elif type(column) is tuple and len(column) == length:
            columns.append(column)
        else:
            raise ValueError("one value per tick in each column")
    return tuple(zip(*columns, strict=True))


def run_entry(run: Run[Any]) -> RunEntry:
    """What the file holds of ``run`` (made in this process, with its words)."""
    head = pack_words(run.words[: len(run.block.pairs)])
    width, ticks = _by_column(run.decoded)
    return (run.start, run.stop, head, run.total, width, ticks)


def encode(key: str, episodes: Sequence[tuple[int, Sequence[RunEntry]]]) -> bytes:
    """The file holding each ``(episode, runs)``."""
    payload = marshal.dumps((DRAWS_FORMAT, key, [(e, tuple(r)) for e, r in episodes]), 4)
    check = hashlib.blake2b(payload, digest_size=32).hexdigest().encode()
    return MAGIC + check + b"\n" + payload


class DrawsWriter:
    """Collects the runs of a chunk's episodes, then writes the file (``data``)."""

    def __init__(self, key: str) -> None:
        self._key = key
        self._episodes: list[tuple[int, tuple[RunEntry, ...]]] = []
        self.runs = 0

    def add(self, episode: int, runs: Sequence[Run[Any]]) -> None:
        """The runs of ``episode``, in the order ``world_blocks`` named them."""
        entries = tuple(run_entry(run) for run in runs)
        self._episodes.append((episode, entries))
        self.runs += len(entries)

    def data(self) -> bytes:
        return encode(self._key, self._episodes)


def read_draws(data: bytes, key: str) -> dict[int, tuple[RunEntry, ...]]:
    """Each episode's runs, checked for shape (each run's ticks are checked when it is
    taken, ``shipped_run``); raises ``DrawsFormatError`` with the reason, and
    ``OtherFormatError`` for a file of another format."""
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
        raise OtherFormatError(f"it is not in draws format {DRAWS_FORMAT}")
    if value[1] != key:
        raise DrawsFormatError("it belongs to another workload, params or seed")
    episodes: dict[int, tuple[RunEntry, ...]] = {}
    try:
        for episode, runs in value[2]:
            if type(episode) is not int or type(runs) is not tuple:
                raise TypeError
            for run in runs:
                start, stop, head, total, width, _ = run
                if not (
                    type(start) is int
                    and type(stop) is int
                    and type(head) is bytes
                    and type(total) is int
                    and type(width) is int
                ):
                    raise TypeError
            episodes[episode] = runs
    except (TypeError, ValueError):
        raise DrawsFormatError(
            "its runs are not (start, stop, head, total, width, ticks)"
        ) from None
    return episodes


def shipped_run(
    block: Block[Any], entry: RunEntry, table: EpisodeDraws
) -> tuple[Run[Any], array[int]]:
    """A file's run entry as a ``Run`` of ``block`` for ``table``'s episode, and the words
    of its first tick (to check); ``ValueError`` if it does not fit."""
    start, stop, head, total, width, ticks = entry
    length = max(stop - start, 0)
    words = unpack_words(head)
    if len(words) != (len(block.pairs) if length else 0):
        raise ValueError("one word per pair of the first tick")
    if not 0 <= total <= _MASK64:
        raise ValueError("a sum of 64-bit words")
    decoded = _by_tick(width, ticks, length)
    return Run.shipped(block, start, stop, decoded, total, table), words
