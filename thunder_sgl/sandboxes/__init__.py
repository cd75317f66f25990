"""Program-owned tool sandboxes (design.md, "Parts": sandboxes; issue #5).

``open_provider`` picks the runtime named by ``SandboxConfig.provider``; ``SandboxManager``
owns sandboxes, registered containers and ports per program and reaps them.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from thunder_sgl.errors import ConfigError, SandboxError
from thunder_sgl.sandboxes.base import (
    ExecResult,
    ProgramHooks,
    RunState,
    SandboxInfo,
    SandboxProvider,
    SandboxStatus,
)
from thunder_sgl.sandboxes.config import SandboxConfig
from thunder_sgl.sandboxes.manager import SandboxManager
from thunder_sgl.sandboxes.ports import PortAllocator
from thunder_sgl.sandboxes.spec import SandboxSpec, parse_spec

log = logging.getLogger(__name__)

PROVIDERS = ("docker", "local", "none", "auto")


def open_provider(config: SandboxConfig, instance_id: str, *, local_root: Path | None = None, **docker_kw: Any) -> SandboxProvider | None:
    """The provider ``config.provider`` names (blocking: it pings the docker daemon).
    ``auto`` falls back to local processes when no daemon answers; ``docker`` fails loudly."""
    from thunder_sgl.sandboxes.docker import DockerProvider
    from thunder_sgl.sandboxes.local import LocalProvider

    kind = config.provider
    if local_root is None and config.local_root:
        local_root = Path(config.local_root)
    if kind == "none":
        return None
    if kind == "local":
        return LocalProvider(instance_id, local_root, max_output_bytes=config.max_output_bytes)
    if kind in ("docker", "auto"):
        opts = {"control_concurrency": config.docker_concurrency, "exec_concurrency": config.exec_concurrency,
                "max_output_bytes": config.max_output_bytes, "stop_timeout": config.stop_timeout_seconds, **docker_kw}
        try:
            return DockerProvider.connect(instance_id, **opts)
        except SandboxError as e:
            if kind == "docker":
                raise ConfigError(f"sandboxes.provider is docker but {e.message}") from e
            log.warning("sandboxes: %s; using local processes", e.message)
            return LocalProvider(instance_id, local_root, max_output_bytes=config.max_output_bytes)
    raise ConfigError(f"unknown sandbox provider {kind!r}; valid: {list(PROVIDERS)}")


async def open_manager(config: SandboxConfig, instance_id: str, *, local_root: Path | None = None, state_path: Path | None = None, **kw: Any) -> SandboxManager:
    """Build the router's manager without blocking the event loop."""
    provider = await asyncio.to_thread(open_provider, config, instance_id, local_root=local_root)
    return SandboxManager(config, provider, instance_id, state_path=state_path, **kw)


__all__ = [
    "ExecResult",
    "PortAllocator",
    "ProgramHooks",
    "RunState",
    "SandboxInfo",
    "SandboxManager",
    "SandboxProvider",
    "SandboxSpec",
    "SandboxStatus",
    "open_manager",
    "open_provider",
    "parse_spec",
]
