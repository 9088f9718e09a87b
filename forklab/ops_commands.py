"""The durable path's operator commands, registered with ``forklab`` in one call.

Experiment commands live in ``experiment_commands``, the embedded server and worker in
``service_commands``, the newcomer's tour in ``demo_command``.
"""

from __future__ import annotations

import argparse

from forklab import demo_command, doctor_command, experiment_commands, service_commands


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    experiment_commands.register(sub)
    service_commands.register(sub)
    demo_command.register(sub)
    doctor_command.register(sub)
