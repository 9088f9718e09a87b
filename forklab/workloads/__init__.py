"""Workloads that ship with ForkLab (standard library only: they run inside sandboxes)."""
