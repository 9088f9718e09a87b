"""Experiments over recorded agent runs: a cohort of runs forked at their decisive step
into worlds (the spec, fork points by meaning, injected faults, per-call model seeds and
the paired statistics judged against the A/A noise floor). Pure: nothing here reaches a
server, a clock or a disk; see docs/agent-experiments.md."""
