"""The providers' packages, installed with ForkLab's extras (``pyproject.toml``).

The default path (local sandboxes, the local artifact store and ledger, no Braintrust)
needs none of them, so a plain ``pip install forklab`` leaves them out. A setting that
names a provider asks for its extra here, where the setting is read: without it the
worker or command stops with one sentence naming the setting and the ``pip install``
that fixes it, rather than a ``ModuleNotFoundError`` from deep inside an activity.
"""

from __future__ import annotations

import importlib
from enum import StrEnum

from forklab.workers.config import ConfigError


class Extra(StrEnum):
    daytona = "daytona"
    braintrust = "braintrust"
    s3 = "s3"
    postgres = "postgres"


#: The top-level modules each extra installs (what its users import).
MODULES: dict[Extra, tuple[str, ...]] = {
    Extra.daytona: ("daytona",),
    Extra.braintrust: ("braintrust", "autoevals"),
    Extra.s3: ("boto3", "botocore"),
    Extra.postgres: ("psycopg",),
}


def missing_modules(extra: Extra) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (imported to find out:
    the caller is about to use them anyway)."""
    missing = []
    for module in MODULES[extra]:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError:
            missing.append(module)
    return missing


def require_extra(extra: Extra, setting: str) -> None:
    """Refuse ``setting`` (e.g. ``FORKLAB_SANDBOX=daytona``) unless ``extra`` is installed."""
    missing = missing_modules(extra)
    if missing:
        raise ConfigError(
            f"{setting} needs ForkLab's {extra.value} extra ({', '.join(missing)} is not "
            f"installed): pip install 'forklab[{extra.value}]'"
        )
