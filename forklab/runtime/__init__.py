"""The stdlib-only core that continues worlds.

Everything under this package (and ``forklab.workloads``) imports nothing but the
Python standard library, so the very same files run in-process (the local twin) and
inside a sandbox, where only the files of this bundle are present.

- ``workload``: the ``Workload`` contract; ``crn``: common random numbers (``Shocks``);
- ``runner``: prefixes, forks and continuations (also the sandbox entry point);
- ``file_format``: every shape the runner reads or writes, and its version;
- ``canon``: canonical JSON and sha256.
"""
