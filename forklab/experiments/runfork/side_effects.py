"""The values a workflow's own "side effects" took on the parent: its random seed and the
time of each workflow task, so that a fork's prefix draws the same ``workflow.random()``
and ``workflow.uuid4()`` and reads the same ``workflow.now()`` as the parent did there.

Temporal's SDK core seeds a run's ``workflow.random()`` with SipHash-1-3 (keys 0, 0) of the
run's ``original_execution_run_id`` as Rust hashes a ``str`` (its bytes, then ``0xff``);
``workflow.uuid4()`` draws from it. ``workflow.now()`` is the start time of the workflow
task (activation) the code runs in. Both are in the parent's history, so they are
recoverable; this module computes the seed and says which time goes with which step.
"""

from __future__ import annotations

_MASK = (1 << 64) - 1


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _MASK


def _round(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
    v0 = (v0 + v1) & _MASK
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = (v2 + v3) & _MASK
    v3 = _rotl(v3, 16) ^ v2
    v0 = (v0 + v3) & _MASK
    v3 = _rotl(v3, 21) ^ v0
    v2 = (v2 + v1) & _MASK
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def siphash13(data: bytes, k0: int = 0, k1: int = 0) -> int:
    """SipHash-1-3 of ``data`` (one compression round, three finalisation rounds)."""
    v0 = k0 ^ 0x736F6D6570736575
    v1 = k1 ^ 0x646F72616E646F6D
    v2 = k0 ^ 0x6C7967656E657261
    v3 = k1 ^ 0x7465646279746573
    tail = len(data) % 8
    for i in range(0, len(data) - tail, 8):
        m = int.from_bytes(data[i : i + 8], "little")
        v3 ^= m
        v0, v1, v2, v3 = _round(v0, v1, v2, v3)
        v0 ^= m
    b = ((len(data) & 0xFF) << 56) | int.from_bytes(data[len(data) - tail :], "little")
    v3 ^= b
    v0, v1, v2, v3 = _round(v0, v1, v2, v3)
    v0 ^= b
    v2 ^= 0xFF
    for _ in range(3):
        v0, v1, v2, v3 = _round(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


def randomness_seed(original_execution_run_id: str) -> int:
    """The seed SDK core gives the ``workflow.random()`` of a run started with this
    ``original_execution_run_id``."""
    return siphash13(original_execution_run_id.encode() + b"\xff")
