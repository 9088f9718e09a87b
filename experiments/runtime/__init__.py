"""The stdlib-only core that continues worlds.

Everything under this package (and ``experiments.workloads``) imports nothing but the
Python standard library, so the very same files run in-process (the local twin) and
inside a sandbox, where only the files of this bundle are present.
"""
