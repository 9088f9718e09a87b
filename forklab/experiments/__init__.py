"""The science: pure and deterministic (no Temporal, no I/O side effects).

- ``spec``: the experiment spec; ``plan``: rehearsal on the local twin;
- ``engine``: the local twin; ``bundle``: the files a sandbox runs and their digest;
- ``outcomes``: per-episode outcomes wherever they ran; ``stats``: the statistical primitives;
- ``runtime``: the stdlib-only runner and its file format; ``workloads``: built-in workloads;
- ``analysis``: outcomes to verdicts; ``report``: the report and its renderings.

This file ships inside every sandbox bundle: it imports nothing.
"""
