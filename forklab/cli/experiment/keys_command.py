"""``forklab keys``: make (once) the approver key pair in your own ForkLab home and print
the line to register in a worker's ``FORKLAB_APPROVERS_FILE``.

The private key stays owner-only in ``<home>/approver/approver.key``; only the public key
leaves it. With it, ``forklab approve`` signs approvals on a worker whose policy names
approvers, and ``forklab start`` signs your starts, so such a worker knows who requested a
plan (and, if its policy says so, keeps you from approving your own).

``forklab keys --fork-issuer`` prints instead the line that registers this home's fork
issuer key (the one ``forklab fork`` signs fork markers with, made here if there is none)
in agent workers' ``FORKLAB_FORK_ISSUERS``: needed where they do not share this home.
"""

from __future__ import annotations

import argparse
import getpass
import json
import re
import sys
from pathlib import Path

from forklab.activities.experiment.approval_keys import (
    KeyFileError,
    new_private_key,
    personal_key_path,
    public_key_hex,
    read_private_key,
    write_private_key,
)
from forklab.activities.runfork.fork_keys import issuer_key, issuer_key_path
from forklab.cli.errors import CliError
from forklab.cli.ops_common import settings_from
from forklab.contracts.fork_signature import issuer_public_key

_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,100}")


def cmd_keys(args: argparse.Namespace) -> int:
    if not _NAME.fullmatch(args.name):
        raise CliError(
            f"--name {args.name!r} is not a name an approvers file holds; use up to 100 "
            "letters, digits, _ . @ and -",
            2,
        )
    home = settings_from(args).home
    if args.fork_issuer:
        return _fork_issuer(home, args.name, as_json=args.json)
    path = personal_key_path(home)
    if path.exists():
        try:
            key = read_private_key(path)
        except KeyFileError as exc:
            raise CliError(str(exc)) from None
        made = "kept"
    else:
        key = new_private_key()
        write_private_key(path, key)
        made = "made"
    if args.json:
        print(
            json.dumps(
                {"name": args.name, "public_key": public_key_hex(key), "key_file": str(path)}
                | {"made": made == "made"},
                indent=2,
            )
        )
        return 0
    # the message on stderr, the line to register on stdout: `forklab keys >> approvers`
    print(
        f"# {made} {path} (owner-only); register this line in FORKLAB_APPROVERS_FILE:",
        file=sys.stderr,
    )
    print(f"{args.name} {public_key_hex(key)}")
    return 0


def _fork_issuer(home: Path, name: str, *, as_json: bool) -> int:
    path = issuer_key_path(home)
    try:
        key = issuer_key(home)
    except KeyFileError as exc:
        raise CliError(str(exc)) from None
    if as_json:
        print(
            json.dumps(
                {"name": name, "public_key": issuer_public_key(key), "key_file": str(path)},
                indent=2,
            )
        )
        return 0
    # as for approver keys: the note on stderr, the line to register alone on stdout
    print(
        f"# {path} (owner-only); register this line in agent workers' FORKLAB_FORK_ISSUERS:",
        file=sys.stderr,
    )
    print(f"{name} {issuer_public_key(key)}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "keys", help="make your approver key pair and print the line to register with workers"
    )
    p.add_argument("--name", default=getpass.getuser(), help="your approver name (default: you)")
    p.add_argument("--home", type=Path, help="ForkLab home folder (FORKLAB_HOME, ~/.forklab)")
    p.add_argument(
        "--fork-issuer",
        action="store_true",
        help="print this home's fork issuer key instead, for workers' FORKLAB_FORK_ISSUERS",
    )
    p.add_argument("--json", action="store_true", help="machine-readable")
    p.set_defaults(func=cmd_keys)
