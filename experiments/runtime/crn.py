"""Counter-based common random numbers.

A draw is a pure function of its coordinates ``(seed, episode, entity, tick, stream)``,
never of how many numbers were drawn before. Two worlds whose control flow diverges
therefore still see identical exogenous shocks: a world that draws an extra number
for its own purposes cannot shift anybody else's sequence.
"""

from __future__ import annotations

import hashlib
from typing import Any

from experiments.runtime.canon import sha256_hex

_SCALE = 1.0 / (1 << 53)


def uniform(seed: int, episode: int, entity: int, tick: int, stream: str) -> float:
    """A uniform draw in [0, 1) addressed by its coordinates."""
    key = f"{seed}|{episode}|{entity}|{tick}|{stream}".encode()
    word = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return (word >> 11) * _SCALE


class Shocks:
    """The random numbers one world sees in one episode.

    ``exogenous`` draws are the shocks of the environment: identical in every world and
    every replicate. They are memoised and remembered so that each world can report a
    fingerprint of the shocks it saw. ``agent`` draws are the agent's own randomness
    (e.g. a noisy model); they are common across worlds too, but each replicate of a
    majority vote gets its own stream.
    """

    __slots__ = ("_agent_drawn", "_seen", "episode", "replicate", "seed")

    def __init__(self, seed: int, episode: int, replicate: int = 0) -> None:
        self.seed = seed
        self.episode = episode
        self.replicate = replicate
        self._seen: dict[tuple[int, int, str], float] = {}
        self._agent_drawn = False

    def exogenous(self, entity: int, tick: int, stream: str) -> float:
        coord = (entity, tick, stream)
        value = self._seen.get(coord)
        if value is None:
            value = uniform(self.seed, self.episode, entity, tick, stream)
            self._seen[coord] = value
        return value

    def agent(self, entity: int, tick: int, stream: str) -> float:
        self._agent_drawn = True
        return uniform(self.seed, self.episode, entity, tick, f"{stream}#r{self.replicate}")

    @property
    def drawn(self) -> bool:
        """Whether anything was drawn: a run that drew nothing is a pure function of its
        starting state, which lets the engine reuse its result for an identical state."""
        return self._agent_drawn or bool(self._seen)

    def fingerprint(self) -> str:
        """sha256 over every exogenous (coordinate, value) this world drew, order-free."""
        if not self._seen:
            return NO_SHOCKS
        items: list[Any] = sorted(self._seen.items())
        return sha256_hex(repr(items))


#: The fingerprint of a run that drew no exogenous shock.
NO_SHOCKS = sha256_hex(repr([]))
