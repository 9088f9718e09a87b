"""Per-call model seeds: the run-level analogue of the engine's common random numbers.

Every live model call of an experiment's fork is sent a ``seed`` that is a pure function
of (experiment seed, run, fork index, call index) and of nothing else, in particular not
of the world. The baseline fork #f of a run and treatment fork #f of the same run
therefore ask the model for the same randomness call by call, until their calls diverge
(a different prompt, a different step). Two baseline forks (#0 and #1) get different
seeds, so the A/A noise floor measures a sampled model's own variation.

Best-effort on real providers: OpenAI documents ``seed`` as making sampling "mostly"
deterministic (a change of ``system_fingerprint`` breaks it) and some servers ignore it;
the local stand-in honours it exactly. The analysis stays valid either way: it is paired
per run and needs no equal draws, they only shrink the variance.
"""

from __future__ import annotations

import hashlib

#: Seeds are kept below 2**31: the widest range every OpenAI-compatible server we know
#: accepts (some parse ``seed`` as a 32-bit signed integer).
SEED_BOUND = 2**31


def model_call_seed(experiment_seed: int, run: int, fork: int, call: int) -> int:
    """The seed of model call ``call`` (its step index) of fork ``fork`` of run ``run``."""
    for name, value in (("run", run), ("fork", fork), ("call", call)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    key = f"forklab-model-seed|{experiment_seed}|{run}|{fork}|{call}".encode()
    word = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return word % SEED_BOUND
