"""Counter-based common random numbers.

A draw is a pure function of its coordinates ``(seed, episode, entity, tick, stream)``,
never of how many numbers were drawn before. Two worlds whose control flow diverges
therefore still see identical exogenous shocks: a world that draws an extra number
for its own purposes cannot shift anybody else's sequence.

Every world of an episode asks for mostly the same coordinates, so the words are kept
in one table per episode (:class:`EpisodeDraws`) that all its worlds share: each
coordinate is hashed once per episode, not once per world. A workload that draws the
same few coordinates at every tick can name them once as a :class:`Block` and draw them
together: the block's values, and a pure function of them the workload declares, are
then worked out once per episode and tick for all its worlds; a run of ticks of it
(:class:`Run`) can be worked out before the worlds that draw it are forked, as the
durable path's world groups do (``forklab.runtime.world_group``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

_SCALE = 1.0 / (1 << 53)
_MASK64 = (1 << 64) - 1

#: A coordinate of an exogenous draw: (entity, tick, stream).
Coordinate = tuple[int, int, str]

T = TypeVar("T")


def _word(seed: int, episode: int, entity: int, tick: int, stream: str) -> int:
    """The 64-bit word of a coordinate: the first 8 bytes of its BLAKE2b hash."""
    key = f"{seed}|{episode}|{entity}|{tick}|{stream}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


def uniform(seed: int, episode: int, entity: int, tick: int, stream: str) -> float:
    """A uniform draw in [0, 1) addressed by its coordinates (the top 53 bits of the word)."""
    return (_word(seed, episode, entity, tick, stream) >> 11) * _SCALE


class Block(Generic[T]):
    """Exogenous coordinates drawn together at a tick: ``(entity, stream)`` pairs, and
    ``decode``, a pure function of their values (in that order) that the workload would
    otherwise compute from them in every world (e.g. unpacking bit lanes).

    Drawing a block is drawing each of its coordinates (same values, same fingerprint);
    it only lets every world of an episode share the values and what ``decode`` made of
    them. A block is keyed by identity: make it once (e.g. when the params are checked).
    """

    __slots__ = ("decode", "members", "pairs")

    def __init__(
        self, pairs: Sequence[tuple[int, str]], decode: Callable[[tuple[float, ...]], T]
    ) -> None:
        self.pairs = tuple(pairs)
        self.members = frozenset(self.pairs)
        self.decode = decode


class Run(Generic[T]):
    """``block`` drawn at ticks ``start..stop-1``: what ``decode`` returned for each tick,
    the number and the sum (mod 2**64) of the words of its distinct coordinates (all a
    world's fingerprint needs of it, so a world that draws a run never copies its
    coordinates one by one) and its ``words`` (tick by tick, the block's pairs in order).

    A run made here holds its words. A run kept for worlds to come (``kept``, see
    ``EpisodeDraws.keep_run``) holds only its decodings and the sum: its words are worked
    out again, through the episode's table, only if asked for (the dict of coordinates a
    fingerprint makes when it must merge overlapping runs, see ``coords``).
    """

    __slots__ = (
        "_coords",
        "_table",
        "_words",
        "block",
        "count",
        "decoded",
        "start",
        "stop",
        "total",
    )

    def __init__(
        self, block: Block[T], start: int, stop: int, words: Sequence[int], decoded: tuple[T, ...]
    ) -> None:
        width = len(block.pairs)
        ticks = max(stop - start, 0)
        if len(words) != width * ticks or len(decoded) != ticks:
            raise ValueError("a run needs one word per pair and one decoding per tick")
        self.block = block
        self.start = start
        self.stop = stop
        self.decoded = decoded
        self._words: Sequence[int] | None = words
        self._table: EpisodeDraws | None = None
        self._coords: dict[Coordinate, int] | None = None
        # a pair named twice is one coordinate (the same word): counted once
        self.count = len(block.members) * ticks
        if len(block.members) == width:
            self.total = sum(words) & _MASK64
        else:
            first = [i for i, pair in enumerate(block.pairs) if block.pairs.index(pair) == i]
            self.total = sum(words[t * width + i] for t in range(ticks) for i in first) & _MASK64

    @classmethod
    def kept(
        cls,
        block: Block[T],
        start: int,
        stop: int,
        decoded: tuple[T, ...],
        total: int,
        table: EpisodeDraws,
    ) -> Run[T]:
        """A run of ``table``'s episode from its decodings and the sum of its words (their
        number is one per distinct pair and tick); ``table`` works the words out if they
        are asked for."""
        ticks = max(stop - start, 0)
        if len(decoded) != ticks:
            raise ValueError("a run needs one decoding per tick")
        run = cls.__new__(cls)
        run.block = block
        run.start = start
        run.stop = stop
        run.decoded = decoded
        run.count = len(block.members) * ticks
        run.total = total & _MASK64
        run._words = None
        run._table = table
        run._coords = None
        return run

    @property
    def words(self) -> Sequence[int]:
        """The run's words, tick by tick (worked out through the table for a kept run)."""
        if self._words is None:
            table = self._table
            if table is None:  # (``kept`` always sets one)
                raise RuntimeError("a kept run without its table")
            block = self.block
            self._words = [w for t in range(self.start, self.stop) for w in table.words(block, t)]
        return self._words

    def covers(self, coord: Coordinate) -> bool:
        entity, tick, stream = coord
        return self.start <= tick < self.stop and (entity, stream) in self.block.members

    def coords(self) -> dict[Coordinate, int]:
        """Every coordinate of the run and its word (made on first use)."""
        if self._coords is None:
            pairs = self.block.pairs
            width = len(pairs)
            words = self.words
            self._coords = {
                (entity, tick, stream): words[(tick - self.start) * width + i]
                for tick in range(self.start, self.stop)
                for i, (entity, stream) in enumerate(pairs)
            }
        return self._coords


#: The key bytes of each coordinate met so far (``entity|tick|stream``): every episode
#: asks for the same few coordinates, and formatting and encoding them is a sixth of a
#: word's cost. A pure cache of a pure function, bounded; kept for exact ints and strs only
#: (``True`` equals ``1`` as a key but formats as ``True``).
_SUFFIXES: dict[Coordinate, bytes] = {}
_SUFFIXES_KEPT = 65_536


class EpisodeDraws:
    """The words of one episode, shared by its prefix and every world (and replicate).

    A pure cache: a word is a function of its coordinates alone, so sharing it cannot
    change a value; it only spares each world hashing the same coordinates again.
    """

    __slots__ = ("_prefix", "agent", "blocks", "episode", "exogenous", "runs", "seed", "values")

    def __init__(self, seed: int, episode: int) -> None:
        self.seed = seed
        self.episode = episode
        self.exogenous: dict[Coordinate, int] = {}
        # the value of each coordinate in ``exogenous`` an ``UntrackedShocks`` drew (the
        # top 53 bits of its word): what such a run reads, with no arithmetic per draw
        self.values: dict[Coordinate, float] = {}
        self.agent: dict[tuple[int, int, str], float] = {}
        # (block, tick) -> (the block's words in pair order, what its decode returned)
        self.blocks: dict[tuple[Block[Any], int], tuple[list[int], Any]] = {}
        # (block, start, stop) -> that run; also filled ahead of the worlds by ``keep_run``
        self.runs: dict[tuple[Block[Any], int, int], Run[Any]] = {}
        self._prefix: Any = None  # BLAKE2b state after "seed|episode|", made on first use

    def word(self, entity: int, tick: int, stream: str) -> int:
        """``_word(seed, episode, entity, tick, stream)``: BLAKE2b is a streaming hash, so
        the episode's part of the key is hashed once and each coordinate continues a copy
        of that state (a copy costs less than setting up a new hash)."""
        prefix = self._prefix
        if prefix is None:
            prefix = self._prefix = hashlib.blake2b(
                f"{self.seed}|{self.episode}|".encode(), digest_size=8
            )
        if type(entity) is int and type(tick) is int and type(stream) is str:
            coord = (entity, tick, stream)
            suffix = _SUFFIXES.get(coord)
            if suffix is None:
                suffix = f"{entity}|{tick}|{stream}".encode()
                if len(_SUFFIXES) < _SUFFIXES_KEPT:
                    _SUFFIXES[coord] = suffix
        else:
            suffix = f"{entity}|{tick}|{stream}".encode()
        h = prefix.copy()
        h.update(suffix)
        return int.from_bytes(h.digest(), "little")

    def words(self, block: Block[Any], tick: int) -> list[int]:
        """The words of ``block``'s coordinates at ``tick``, in pair order, through the same
        table as single draws."""
        words: list[int] = []
        exogenous = self.exogenous
        for entity, stream in block.pairs:
            coord = (entity, tick, stream)
            word = exogenous.get(coord)
            if word is None:
                word = exogenous[coord] = self.word(entity, tick, stream)
            words.append(word)
        return words

    def block(self, block: Block[Any], tick: int) -> tuple[list[int], Any]:
        """The words of ``block``'s coordinates at ``tick`` (in pair order) and its decoded
        values, made on first use."""
        words = self.words(block, tick)
        values = tuple([(word >> 11) * _SCALE for word in words])
        entry = self.blocks[(block, tick)] = (words, block.decode(values))
        return entry

    def run(self, block: Block[T], start: int, stop: int) -> Run[T]:
        """``block`` at ticks ``start..stop-1``, made on first use (tick by tick through
        ``block``), or the run ``keep_run`` put here."""
        key = (block, start, stop)
        found = self.runs.get(key)
        if found is None:
            words: list[int] = []
            decoded: list[T] = []
            blocks = self.blocks
            for tick in range(start, stop):
                entry = blocks.get((block, tick))
                if entry is None:
                    entry = self.block(block, tick)
                words += entry[0]
                decoded.append(entry[1])
            found = self.runs[key] = Run(block, start, stop, words, tuple(decoded))
        return found

    def keep_run(self, block: Block[Any], start: int, stop: int) -> None:
        """Work ``block`` out at ticks ``start..stop-1`` for the worlds to come, and keep
        only what a world reads of it: its decodings and the number and sum of its words
        (their coordinates would be most of the table's memory, worked out again through
        the table only if a world asks for them, see ``Run.kept``)."""
        run = self.run(block, start, stop)
        self.runs[(block, start, stop)] = Run.kept(block, start, stop, run.decoded, run.total, self)
        self.exogenous.clear()
        self.values.clear()
        self.blocks.clear()


class Shocks:
    """The random numbers one world (or the prefix) sees in one episode.

    ``exogenous`` draws are the shocks of the environment: identical in every world and
    every replicate. Each world remembers which coordinates it drew (and their words), so
    that it can report a fingerprint of the shocks it saw. ``agent`` draws are the agent's
    own randomness (e.g. a noisy model); they are common across worlds too, but each
    replicate of a majority vote gets its own stream, and they are not part of the
    fingerprint.
    """

    __slots__ = (
        "_agent_drawn",
        "_draws",
        "_labels",
        "_runs",
        "_seen",
        "_source",
        "episode",
        "replicate",
        "seed",
    )

    def __init__(
        self,
        seed: int,
        episode: int,
        replicate: int = 0,
        draws: EpisodeDraws | None = None,
        source: Shocks | None = None,
    ) -> None:
        """``draws``: the episode's table to use; ``source``: another run of the episode
        whose table to share, made (for both) only when one of them first draws."""
        if draws is not None and (draws.seed != seed or draws.episode != episode):
            raise ValueError("the draw table belongs to another (seed, episode)")
        if source is not None and (source.seed != seed or source.episode != episode):
            raise ValueError("the source run belongs to another (seed, episode)")
        self.seed: int = seed
        self.episode: int = episode
        self.replicate = replicate
        self._draws = draws  # made on the first draw: many runs never draw at all
        self._source = source
        self._seen: dict[Coordinate, int] = {}  # coordinate -> its word (single draws)
        self._runs: list[Run[Any]] = []  # the block runs drawn, each once
        self._labels: dict[str, str] = {}  # agent stream -> its label for this replicate
        self._agent_drawn = False

    def exogenous(self, entity: int, tick: int, stream: str) -> float:
        coord = (entity, tick, stream)
        word = self._seen.get(coord)
        if word is None:
            table = self._draws
            if table is None:
                table = self.draws
            words = table.exogenous
            word = words.get(coord)
            if word is None:
                word = words[coord] = table.word(entity, tick, stream)
            self._seen[coord] = word
        return (word >> 11) * _SCALE

    def exogenous_blocks(self, block: Block[T], start: int, stop: int) -> tuple[T, ...]:
        """Draw every coordinate of ``block`` at each tick of ``start..stop-1`` (exactly
        as ``exogenous`` would, one by one) and return its ``decode`` of each tick's
        values. The worlds of an episode that ask for the same ticks share the result;
        the world only notes the run (its coordinates count in ``fingerprint``)."""
        table = self._draws
        if table is None:
            table = self.draws
        run = table.runs.get((block, start, stop))
        if run is None:
            run = table.run(block, start, stop)
        if run.count and run not in self._runs:
            self._runs.append(run)
        ticks: tuple[T, ...] = run.decoded
        return ticks

    def agent(self, entity: int, tick: int, stream: str) -> float:
        self._agent_drawn = True
        label = self._labels.get(stream)
        if label is None:
            label = self._labels[stream] = f"{stream}#r{self.replicate}"
        table = self._draws
        if table is None:
            table = self.draws
        key = (entity, tick, label)
        value = table.agent.get(key)
        if value is None:
            value = table.agent[key] = (table.word(entity, tick, label) >> 11) * _SCALE
        return value

    @property
    def draws(self) -> EpisodeDraws:
        """The episode's table of words (to share with the other runs of the episode)."""
        if self._draws is None:
            source = self._source
            self._draws = (
                source.draws if source is not None else EpisodeDraws(self.seed, self.episode)
            )
        return self._draws

    @property
    def drawn(self) -> bool:
        """Whether anything was drawn: a run that drew nothing is a pure function of its
        starting state, which lets the engine reuse its result for an identical state."""
        return self._agent_drawn or bool(self._seen) or bool(self._runs)

    def fingerprint(self) -> str:
        """An order-free fingerprint of every exogenous draw this world made.

        Each coordinate's 64-bit word is a hash of the coordinate whose top 53 bits are
        the value drawn, so the sum of the words (mod 2**64) changes when a world draws
        another set of coordinates or another value for one of them, whatever the order
        of the draws. Two worlds with equal fingerprints saw the same shocks, up to a
        2**-64 collision; nothing here needs to resist a forger (workload code could
        report anything it likes; the check catches honest mistakes in the randomness).
        """
        seen = self._seen
        runs = self._runs
        if not runs:
            if not seen:
                return NO_SHOCKS
            return f"{len(seen):x}:{sum(seen.values()) & _MASK64:016x}"
        if len(runs) == 1:
            # One run (the usual case): its own count and sum, plus the single draws that
            # lie outside it (one that lies inside is one of its coordinates already).
            (run,) = runs
            alone = [word for coord, word in seen.items() if not run.covers(coord)]
            count = run.count + len(alone)
            total = run.total + sum(alone)
        else:  # runs may overlap each other: count their union, coordinate by coordinate
            union = dict(seen)
            for run in runs:
                union.update(run.coords())
            count, total = len(union), sum(union.values())
        return f"{count:x}:{total & _MASK64:016x}"


class UntrackedShocks(Shocks):
    """The same draws as ``Shocks`` (the same table, the same values), without the record of
    which coordinates this run drew: for a run whose fingerprint nobody will compare (a
    prefix, or a world of an episode the local twin does not fingerprint, see
    ``forklab.runtime.runner.run_batch``). Keeping that record is a dict lookup and a store
    per coordinate and a sum per world, about a seventh of a world's time in a workload
    that does little else than draw. ``fingerprint`` says ``UNCHECKED``.

    ``drawn`` stays exact: the run's table is made (or taken from ``source``) on its first
    draw of any kind, so a run made without a table drew something exactly when it has
    one."""

    __slots__ = ("_values",)

    def __init__(
        self, seed: int, episode: int, replicate: int = 0, source: Shocks | None = None
    ) -> None:
        # (made once per world and episode: only what this class reads is set)
        if source is not None and (source.seed != seed or source.episode != episode):
            raise ValueError("the source run belongs to another (seed, episode)")
        self.seed = seed
        self.episode = episode
        self.replicate = replicate
        self._draws = None
        self._source = source
        self._labels = {}
        self._agent_drawn = False
        self._values = _NO_VALUES

    def exogenous(self, entity: int, tick: int, stream: str) -> float:
        # The episode's table of values, once this run drew (until then an empty dict of
        # its own that is never written to): a draw another world already made is one
        # lookup, and the table is made, as ``drawn`` needs, on this run's first draw.
        value = self._values.get((entity, tick, stream))
        if value is None:
            return self._draw(entity, tick, stream)
        return value

    def _draw(self, entity: int, tick: int, stream: str) -> float:
        table = self._draws
        if table is None:
            table = self.draws
        values = self._values = table.values
        coord = (entity, tick, stream)
        words = table.exogenous
        word = words.get(coord)
        if word is None:
            word = words[coord] = table.word(entity, tick, stream)
        value = values[coord] = (word >> 11) * _SCALE
        return value

    def exogenous_blocks(self, block: Block[T], start: int, stop: int) -> tuple[T, ...]:
        table = self._draws
        if table is None:
            table = self.draws
        run = table.runs.get((block, start, stop))
        if run is None:
            run = table.run(block, start, stop)
        ticks: tuple[T, ...] = run.decoded
        return ticks

    @property
    def drawn(self) -> bool:
        return self._draws is not None

    def fingerprint(self) -> str:
        """``UNCHECKED``, or ``NO_SHOCKS`` for a run that drew nothing (as ``Shocks`` says:
        a result the memo reuses reads the same in a fingerprinted episode)."""
        return UNCHECKED if self._draws is not None else NO_SHOCKS


#: What an ``UntrackedShocks`` reads its values from before its first draw: always empty.
_NO_VALUES: dict[Coordinate, float] = {}

#: The fingerprint of a run that drew no exogenous shock.
NO_SHOCKS = "0:0000000000000000"
#: What an ``UntrackedShocks`` run reports instead of a fingerprint.
UNCHECKED = ""
