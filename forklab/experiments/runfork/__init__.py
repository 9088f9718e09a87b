"""Forking durable agent runs: the pure rules (no Temporal, no I/O).

- ``steps``: a run's steps and the digest of an inherited prefix
- ``receipt``: boundary modes, boundary resolution, the immutable fork receipt
- ``policy``: per-tool fork policies and their decisions
- ``effects``: the effect ledger's request digest and claim rules
- ``fencing``: fenced appends to the offset-addressed run log
- ``diff``: structural difference of two runs' final states
- ``scripted_model``: the local stand-in model's scripted, seeded policy
- ``research_score``: the example research pipeline's scorer
"""
