"""``forklab doctor``: an account-wide sweep for ForkLab sandboxes left by earlier runs.

Each experiment's cleanup deletes the sandboxes labelled with its own id; a run whose
worker and server both died can leave some behind (for Daytona, until their TTL). The
doctor lists every sandbox the configured backend (``FORKLAB_SANDBOX``) holds for ForkLab,
and with ``--delete`` removes them. Exit status 1 while any is left.
"""

from __future__ import annotations

import argparse

from activities.sandbox.base import SandboxError
from forklab.errors import CliError
from forklab.ops_common import add_connection_flags, settings_from
from workers.config import ConfigError
from workers.providers import sandbox_backend


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("doctor", help="list (or delete) leftover ForkLab sandboxes")
    add_connection_flags(p)
    p.add_argument(
        "--delete",
        action="store_true",
        help="delete every leftover sandbox (only when no experiment is running)",
    )
    p.set_defaults(func=doctor)


def doctor(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    try:
        backend = sandbox_backend(settings)
        found = backend.list({})
        print(f"{backend.name} sandboxes: {len(found)} ForkLab sandbox(es) found")
        for sandbox_id in found:
            print(f"  {sandbox_id}")
        if args.delete and found:
            for sandbox_id in found:
                backend.delete(sandbox_id)
            left = backend.list({})
            print(f"removed {len(found) - len(left)}, left {len(left)}")
            found = left
    except ConfigError as exc:
        raise CliError(str(exc), code=2) from None
    except SandboxError as exc:
        raise CliError(f"cannot list sandboxes: {exc}", code=1) from None
    return 1 if found else 0
