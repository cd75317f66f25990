"""Helpers shared by the docker tests (a module, not conftest, so tests can import it)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import docker

from thunder_sgl.sandboxes import SandboxManager
from thunder_sgl.sandboxes.base import LABEL_INSTANCE

IMAGE = "thunder-sandbox:latest"

ManagerFactory = Callable[..., Awaitable[SandboxManager]]
"""``await make_manager(config=None, *, instance=None, **manager_kwargs)``"""


def labelled(client: docker.DockerClient, instance: str) -> list[dict[str, Any]]:
    """Containers (running or not) carrying the router instance label."""
    return list(client.api.containers(all=True, filters={"label": f"{LABEL_INSTANCE}={instance}"}))
