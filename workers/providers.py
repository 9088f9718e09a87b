"""Settings of the optional providers, read from the environment (this module and
``workers.config`` are the worker's only readers of it). Each provider is off unless its
variables are set, and then the local default is used.

- readout model: ``FORKLAB_READOUT_BASE_URL`` (any OpenAI-compatible ``/v1`` URL),
  ``FORKLAB_READOUT_API_KEY`` (else ``OPENAI_API_KEY``), ``FORKLAB_READOUT_MODEL``,
  ``FORKLAB_READOUT_TIMEOUT`` (seconds, default 30).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import ValidationError

from activities.readout import ReadoutConfig
from workers.config import ConfigError


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
