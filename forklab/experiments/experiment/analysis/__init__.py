"""The analysis: per-episode outcomes in, a ``Report`` out (pure, deterministic).

- ``pairs``: the paired 2×2 table (``PairedTable``), its ``PairedEffect`` and raw slice counts;
- ``slices``: slices by boundary feature (values, quantile bins, interactions);
- ``checks``: the named validity checks; ``verdicts``: per-world verdicts;
- ``power``: episodes needed; ``evidence``: evidence per world-second;
- ``guard``: learning and validating a guard policy (``held_out_plan``: which episodes and
  worlds its validation runs, known from the spec alone);
- ``build``: ``build_report`` puts them together.
"""
