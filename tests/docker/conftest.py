"""Docker tests run against a real daemon and the tiny ``thunder-sandbox:latest`` image
(``.ci/docker-up.sh`` provides both). Without a daemon they skip, unless
``THUNDER_REQUIRE_DOCKER=1`` (set by ``.ci/run``): then they fail, so CI cannot go green by
silently skipping them."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from docker_helpers import IMAGE, ManagerFactory

from thunder_sgl.sandboxes import SandboxManager
from thunder_sgl.sandboxes.base import LABEL_INSTANCE
from thunder_sgl.sandboxes.config import SandboxConfig
from thunder_sgl.sandboxes.docker import DockerProvider

# The stand-in router process and its helpers live with the unit tests (shared with them).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "sandboxes"))

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.docker)


def _unavailable(why: str) -> None:
    if os.environ.get("THUNDER_REQUIRE_DOCKER") == "1":
        pytest.fail(f"THUNDER_REQUIRE_DOCKER=1 but {why} (run .ci/docker-up.sh)", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    """The one place that decides between run, skip and fail for every docker test."""
    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as e:
        _unavailable(f"no docker daemon answers ({type(e).__name__})")
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        client.close()
        _unavailable(f"image {IMAGE} is missing")
    yield client
    client.close()


@pytest.fixture(autouse=True)
def _needs_docker(docker_client: docker.DockerClient) -> None:
    """Every test in this directory needs the daemon."""


@pytest.fixture
def instance_id(docker_client: docker.DockerClient) -> Iterator[str]:
    """A fresh router instance id; every container labelled with it is removed afterwards."""
    inst = "test-" + uuid.uuid4().hex[:10]
    yield inst
    for c in docker_client.api.containers(all=True, filters={"label": f"{LABEL_INSTANCE}={inst}"}):
        docker_client.api.remove_container(c["Id"], force=True)
    for c in docker_client.api.containers(all=True, filters={"name": f"ext-{inst}"}):
        docker_client.api.remove_container(c["Id"], force=True)


@pytest.fixture
async def make_manager(instance_id: str) -> AsyncIterator[ManagerFactory]:
    """Build docker-backed managers for ``instance_id``; all are closed (releasing) at the end."""
    made: list[SandboxManager] = []

    async def make(config: SandboxConfig | None = None, *, instance: str | None = None, **kw: Any) -> SandboxManager:
        inst = instance or instance_id
        provider = DockerProvider.connect(inst)
        m = SandboxManager(config or SandboxConfig(provider="docker"), provider, inst, **kw)
        made.append(m)
        return m

    yield make
    for m in made:
        await m.close()
