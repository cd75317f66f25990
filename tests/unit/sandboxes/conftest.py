from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from thunder_sgl.sandboxes import SandboxManager, procs
from thunder_sgl.sandboxes.base import ENV_INSTANCE
from thunder_sgl.sandboxes.config import SandboxConfig
from thunder_sgl.sandboxes.local import LocalProvider


@pytest.fixture
def instance_id() -> str:
    return "test-" + uuid.uuid4().hex[:10]


@pytest.fixture
async def local_manager(tmp_path: Path, instance_id: str) -> AsyncIterator[SandboxManager]:
    config = SandboxConfig(provider="local", max_sandboxes_per_program=4)
    manager = SandboxManager(config, LocalProvider(instance_id, tmp_path / "sandboxes"), instance_id)
    yield manager
    await manager.close()
    procs.signal_all(procs.tagged({ENV_INSTANCE: instance_id}))
