"""Which fork issuers a worker trusts, read from the environment when the worker starts.

- ``FORKLAB_FORK_ISSUERS_FILE``: one ``<name> <Ed25519 public key, hex>`` per line (the
  format of ``FORKLAB_APPROVERS_FILE``), or ``FORKLAB_FORK_ISSUERS``: the same entries
  separated by ``;``. Only markers signed by those keys are served.
- Neither: the worker trusts its own home's issuer key, the one ``forklab fork`` on the
  same ``FORKLAB_HOME`` signs with (``forklab.activities.runfork.fork_keys``); with no
  such key yet it serves no fork at all.

A setting that cannot be read stops the worker with one sentence, as the approvers do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from forklab.workers.config import ConfigError
from forklab.workers.experiment.approvers import MAX_FILE_BYTES, parse_approvers, read_approvers

FORK_ISSUERS_FILE = "FORKLAB_FORK_ISSUERS_FILE"
FORK_ISSUERS = "FORKLAB_FORK_ISSUERS"
_ROLE = "fork issuer"


def registered_issuers(env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The registered issuers (public key → name), or None when the policy names none."""
    env = os.environ if env is None else env
    file = env.get(FORK_ISSUERS_FILE, "").strip()
    inline = env.get(FORK_ISSUERS, "").strip()
    if file and inline:
        raise ConfigError(f"both {FORK_ISSUERS_FILE} and {FORK_ISSUERS} are set; keep one")
    if inline:
        if len(inline) > MAX_FILE_BYTES:
            raise ConfigError(f"{FORK_ISSUERS} is longer than {MAX_FILE_BYTES} characters")
        issuers = parse_approvers(inline.split(";"), FORK_ISSUERS, "entry", _ROLE)
    elif file:
        issuers = read_approvers(Path(file).expanduser(), FORK_ISSUERS_FILE, _ROLE)
    else:
        return None
    return {i.public_key: i.name for i in issuers}
