"""Settings of the optional providers, read from the environment (this module and
``forklab.workers.config`` are the worker's only readers of it). Each provider is off unless its
variables are set, and then the local default is used.

- sandboxes: ``FORKLAB_SANDBOX`` = ``local`` (default) or ``daytona``; Daytona reads
  ``DAYTONA_API_KEY``, ``DAYTONA_API_URL``, ``DAYTONA_TARGET`` (region),
  ``FORKLAB_DAYTONA_SNAPSHOT`` (the snapshot every world starts from) and optionally
  ``DAYTONA_ORGANIZATION_ID`` and ``FORKLAB_DAYTONA_TTL_MINUTES``.
- evidence log: ``BRAINTRUST_API_KEY`` switches Braintrust on (``BRAINTRUST_APP_URL`` for
  another deployment; the SDK itself honours ``BRAINTRUST_API_URL``),
  ``FORKLAB_BRAINTRUST_PROJECT`` names the project (default ``forklab``); any of these
  without the key is refused.
- readout model: ``FORKLAB_READOUT_BASE_URL`` (any OpenAI-compatible ``/v1`` URL),
  ``FORKLAB_READOUT_API_KEY`` (else ``OPENAI_API_KEY``), ``FORKLAB_READOUT_MODEL``,
  ``FORKLAB_READOUT_TIMEOUT`` (seconds, default 30).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pydantic import ValidationError

from forklab.activities.experiment.evidence_log import BraintrustConfig
from forklab.activities.experiment.readout import ReadoutConfig
from forklab.activities.sandbox.base import SandboxBackend, SandboxError
from forklab.activities.sandbox.local import LocalSandboxBackend
from forklab.workers.config import ConfigError, Settings
from forklab.workers.extras import Extra, require_extra

if TYPE_CHECKING:
    from forklab.activities.sandbox.daytona import DaytonaOptions

#: Daytona option → environment variable.
DAYTONA_ENV = {
    "api_key": "DAYTONA_API_KEY",
    "api_url": "DAYTONA_API_URL",
    "target": "DAYTONA_TARGET",
    "snapshot": "FORKLAB_DAYTONA_SNAPSHOT",
    "organization_id": "DAYTONA_ORGANIZATION_ID",
    "ttl_minutes": "FORKLAB_DAYTONA_TTL_MINUTES",
}


def daytona_options(env: Mapping[str, str]) -> DaytonaOptions:
    # imported on use: the SDK's HTTP stack must stay out of Temporal's workflow sandbox,
    # which imports this module with the worker's
    require_extra(Extra.daytona, "FORKLAB_SANDBOX=daytona")
    from forklab.activities.sandbox.daytona import DaytonaOptions

    values = {field: env[var] for field, var in DAYTONA_ENV.items() if env.get(var)}
    try:
        return DaytonaOptions.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        var = DAYTONA_ENV.get(str(err["loc"][0]), str(err["loc"][0]))
        raise ConfigError(
            f"FORKLAB_SANDBOX=daytona needs {var}: {err['msg'].lower()}; set it (see "
            "docs/providers.md) or unset FORKLAB_SANDBOX to use local sandboxes"
        ) from None


def sandbox_backend(settings: Settings, env: Mapping[str, str] | None = None) -> SandboxBackend:
    """The backend ``FORKLAB_SANDBOX`` names: local processes, or Daytona sandboxes."""
    env = os.environ if env is None else env
    kind = env.get("FORKLAB_SANDBOX", "local").strip() or "local"
    if kind == "local":
        return LocalSandboxBackend(settings.sandboxes_dir)
    if kind != "daytona":
        raise ConfigError(f"FORKLAB_SANDBOX is {kind!r}; use local or daytona")
    require_extra(Extra.daytona, "FORKLAB_SANDBOX=daytona")
    from forklab.activities.sandbox.daytona import DaytonaSandboxBackend

    try:
        return DaytonaSandboxBackend(daytona_options(env), settings.home / "daytona-bundles")
    except SandboxError as exc:
        raise ConfigError(str(exc)) from None


def readout_config(env: Mapping[str, str] | None = None) -> ReadoutConfig | None:
    env = os.environ if env is None else env
    base_url = env.get("FORKLAB_READOUT_BASE_URL", "").strip()
    if not base_url:
        return None
    model = env.get("FORKLAB_READOUT_MODEL", "").strip()
    if not model:
        raise ConfigError(
            "FORKLAB_READOUT_BASE_URL is set but FORKLAB_READOUT_MODEL is not; name the model "
            "to ask (or unset the URL to use the deterministic readout)"
        )
    key = env.get("FORKLAB_READOUT_API_KEY") or env.get("OPENAI_API_KEY") or ""
    try:
        return ReadoutConfig(
            base_url=base_url,
            api_key=key or "none",  # local servers need no key; the client insists on one
            model=model,
            timeout_seconds=env.get("FORKLAB_READOUT_TIMEOUT") or 30.0,
        )
    except ValidationError as exc:
        raise ConfigError(
            f"FORKLAB_READOUT_TIMEOUT is invalid: {exc.errors()[0]['msg']}; use seconds "
            "between 0 and 600"
        ) from None


#: Braintrust settings that mean nothing without ``BRAINTRUST_API_KEY``.
BRAINTRUST_WITH_KEY = ("BRAINTRUST_APP_URL", "BRAINTRUST_API_URL", "FORKLAB_BRAINTRUST_PROJECT")


def braintrust_config(env: Mapping[str, str] | None = None) -> BraintrustConfig | None:
    """None when Braintrust is off (no variable set). A URL or project without the key is
    refused: an operator who set them meant to log, and a silent "off" would lose every
    trace until somebody noticed."""
    env = os.environ if env is None else env
    key = env.get("BRAINTRUST_API_KEY", "").strip()
    if not key:
        meant = [var for var in BRAINTRUST_WITH_KEY if env.get(var, "").strip()]
        if meant:
            raise ConfigError(
                f"{meant[0]} is set but BRAINTRUST_API_KEY is not; set the key to log "
                f"evidence to Braintrust (docs/providers.md), or unset {', '.join(meant)} "
                "to log nothing"
            )
        return None
    require_extra(Extra.braintrust, "BRAINTRUST_API_KEY")
    values = {"api_key": key}
    if env.get("BRAINTRUST_APP_URL"):
        values["app_url"] = env["BRAINTRUST_APP_URL"]
    if env.get("FORKLAB_BRAINTRUST_PROJECT"):
        values["project"] = env["FORKLAB_BRAINTRUST_PROJECT"]
    return BraintrustConfig.model_validate(values)
