"""Majority votes over k forks of one checkpoint that stop once they are decided.

A world with ``forks`` > 1 (``analysis.forks_per_checkpoint``, a cohort's
``forks_per_world``) continues each checkpoint that many times, each replicate with its
own agent stream, and its outcome is the majority. The majority is decided before every
fork has run: after ``s`` successes and ``f`` failures of ``k`` (odd) forks, it is a
success once ``s > k / 2`` and a failure once ``f > k / 2``, whatever the forks left
would say. Forks after that point change nothing, so they are not run (at 90 %
agreement among forks, about a third of them). The outcome is exactly the full vote's.

Pure and standard library only: the runner uses it inside sandboxes and on the twin.
"""

from __future__ import annotations


def vote_decided(successes: int, failures: int, forks: int) -> bool | None:
    """The majority of ``forks`` once ``successes`` and ``failures`` of them are in: True or
    False when no fork still to run could change it, else None."""
    if successes * 2 > forks:
        return True
    if failures * 2 >= forks:  # (an even ``forks`` ties at half: not a majority of successes)
        return False
    return None
