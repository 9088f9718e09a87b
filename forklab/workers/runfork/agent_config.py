"""Settings of the agent-run side of ForkLab: the model endpoint, the side-effect service,
the agents' task queue and where the effect ledger and run log live.

Read from ``FORKLAB_*`` variables (and ``OPENAI_API_KEY``), like ``forklab.workers.config``.
With no model URL set, ``forklab up`` starts the local stand-in model server and the
local payments/mail service on the ports below.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from forklab.workers.config import ConfigError, Settings

AGENT_ENV = {
    "model_base_url": "FORKLAB_MODEL_BASE_URL",
    "model_api_key": "FORKLAB_MODEL_API_KEY",
    "effects_url": "FORKLAB_EFFECTS_URL",
    "agent_task_queue": "FORKLAB_AGENT_TASK_QUEUE",
    "model_port": "FORKLAB_MODEL_PORT",
    "effects_port": "FORKLAB_EFFECTS_PORT",
    "model_seed": "FORKLAB_MODEL_SEED",
}


class AgentSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: an OpenAI-compatible base URL (OpenAI, vLLM, Ollama…); empty: the local server
    model_base_url: str = ""
    model_api_key: str = "local"
    #: the payments/mail service; empty: the local one
    effects_url: str = ""
    agent_task_queue: str = "forklab-agents"
    model_port: int = Field(default=8300, ge=1, le=65535)
    effects_port: int = Field(default=8301, ge=1, le=65535)
    model_seed: int = 0
    home: Path = Path("~/.forklab")
    #: the effect ledger's PostgreSQL database: ``FORKLAB_LEDGER`` when that is a
    #: postgresql:// URL (the experiment ledger's database, shared by every worker);
    #: empty: ``<home>/effects.sqlite``
    effects_database: str = ""
    store_retry_seconds: float = Field(default=60.0, gt=0, le=600)

    @classmethod
    def load(cls, settings: Settings, env: Mapping[str, str] | None = None) -> AgentSettings:
        env = os.environ if env is None else env
        values: dict[str, object] = {
            "home": settings.home,
            "effects_database": settings.ledger if settings.shared_ledger else "",
            "store_retry_seconds": settings.store_retry_seconds,
        }
        for field, var in AGENT_ENV.items():
            if env.get(var):
                values[field] = env[var]
        if "model_api_key" not in values and env.get("OPENAI_API_KEY"):
            values["model_api_key"] = env["OPENAI_API_KEY"]
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = str(err["loc"][0])
            raise ConfigError(
                f"setting {field} ({AGENT_ENV.get(field, field)}) is invalid: {err['msg']}"
            ) from None

    @property
    def local_model(self) -> bool:
        return not self.model_base_url

    @property
    def local_effects(self) -> bool:
        return not self.effects_url

    @property
    def resolved_model_url(self) -> str:
        return self.model_base_url or f"http://127.0.0.1:{self.model_port}/v1"

    @property
    def resolved_effects_url(self) -> str:
        return self.effects_url or f"http://127.0.0.1:{self.effects_port}"

    @property
    def effect_ledger_path(self) -> Path:
        """The SQLite effect ledger (when ``effects_database`` is empty)."""
        return self.home / "effects.sqlite"

    @property
    def run_log_path(self) -> Path:
        return self.home / "runlog.sqlite"

    @property
    def forks_path(self) -> Path:
        """Receipts, outcomes and promotions (append-only)."""
        return self.home / "forks.sqlite"
