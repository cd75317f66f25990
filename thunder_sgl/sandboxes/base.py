"""The sandbox vocabulary: statuses, records, results, and the two Protocols of this package.

``SandboxProvider`` is the seam between the manager (ownership, ports, lifecycle) and a
runtime that actually runs things: ``docker.DockerProvider`` (the docker SDK) or
``local.LocalProvider`` (a working directory and subprocesses). ``ProgramHooks`` is the seam
between the sandbox routes and the router's program table.

Everything a provider starts carries the owner's identity, so that ownership survives a crash
of the router: docker containers carry the labels below; local processes carry the same
names as environment variables (``THUNDER_INSTANCE_ID``, ``THUNDER_PROGRAM_ID``,
``THUNDER_SANDBOX_ID``), which is how a restarted router finds and reaps orphans.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

from thunder_sgl.sandboxes.spec import SandboxSpec

LABEL_PROGRAM = "thunder_sgl.program"
LABEL_INSTANCE = "thunder_sgl.instance"
LABEL_SANDBOX = "thunder_sgl.sandbox"

ENV_PROGRAM = "THUNDER_PROGRAM_ID"
ENV_INSTANCE = "THUNDER_INSTANCE_ID"
ENV_SANDBOX = "THUNDER_SANDBOX_ID"
ENV_PORTS = "THUNDER_PORTS"

TIMEOUT_EXIT_CODE = 124
"""Exit code reported for a command killed at its timeout (the convention of ``timeout(1)``)."""


class SandboxStatus(enum.Enum):
    """preparing ─▶ ready ─▶ (stopped ─▶ preparing ─▶ ready)* ─▶ removed; preparing ─▶ failed."""

    PREPARING = "preparing"
    READY = "ready"
    STOPPED = "stopped"
    """Stopped (not removed) by the router while its program was paused; restarted on demand."""
    FAILED = "failed"
    REMOVED = "removed"


class RunState(enum.Enum):
    """What a provider sees of a sandbox it created."""

    RUNNING = "running"
    STOPPED = "stopped"
    MISSING = "missing"


@dataclass(slots=True)
class SandboxInfo:
    """Public view of one sandbox (the body of the sandbox routes)."""

    id: str
    program_id: str
    status: SandboxStatus
    provider: str
    spec: SandboxSpec
    ports: list[int] = field(default_factory=list)
    created_at: float = 0.0
    """Wall-clock time (epoch seconds) of the create request."""
    ready_at: float | None = None
    """Wall-clock time the sandbox last became ready."""
    prepare_seconds: float | None = None
    """Time from the create request (or restart) to ready: container start plus setup commands."""
    error: str | None = None
    handle: str | None = None
    """Provider handle: the container id (docker) or the working directory (local)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "sandbox",
            "program_id": self.program_id,
            "status": self.status.value,
            "provider": self.provider,
            "image": self.spec.image,
            "network": self.spec.network,
            "memory_mb": self.spec.memory_mb,
            "cpus": self.spec.cpus,
            "pids": self.spec.pids,
            "ports": list(self.ports),
            "created_at": self.created_at,
            "ready_at": self.ready_at,
            "prepare_seconds": self.prepare_seconds,
            "error": self.error,
            "handle": self.handle,
        }


@dataclass(frozen=True, slots=True)
class ExecResult:
    exit_code: int
    """The command's exit code; ``TIMEOUT_EXIT_CODE`` when it was killed at its timeout."""
    stdout: str
    stderr: str
    duration_seconds: float
    """Wall time of the command as the router saw it (what the program spent ACTING)."""
    timed_out: bool = False
    truncated: bool = False
    """Output beyond the provider's cap was dropped."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "object": "sandbox.exec",
            "exit_code": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "duration_seconds": self.duration_seconds,
            "timed_out": self.timed_out,
            "truncated": self.truncated,
        }


class SandboxProvider(Protocol):
    """A runtime for sandboxes. Every method may block on I/O only inside a worker thread or a
    subprocess: none blocks the event loop. Handles are strings the provider chose.

    Ownership: everything created carries (instance, program, sandbox) as labels or
    environment, so ``reap_program`` and ``sweep`` find it without the manager's memory.
    Removal methods are idempotent: removing what is already gone is not an error.
    """

    name: str
    """``docker`` or ``local``."""

    async def create(self, program_id: str, sandbox_id: str, spec: SandboxSpec, ports: list[int]) -> str:
        """Create and start the sandbox (no setup commands); return its handle. Raises
        ``SandboxError`` when the runtime refuses (the manager marks the sandbox failed)."""
        ...

    async def exec(
        self, handle: str, command: list[str], timeout: float, env: dict[str, str], workdir: str | None
    ) -> ExecResult:
        """Run ``command`` to completion or until ``timeout`` seconds, then kill it (and its
        children, where the provider can see them). Never raises for a non-zero exit."""
        ...

    async def start(self, handle: str) -> None:
        """Start a stopped sandbox again; no-op when it runs."""
        ...

    async def stop(self, handle: str) -> None:
        """Stop without removing (memory and CPU freed, files kept)."""
        ...

    async def state(self, handle: str) -> RunState: ...

    async def remove(self, handle: str) -> None:
        """Kill everything in the sandbox and delete it. Idempotent."""
        ...

    async def reap_program(self, program_id: str) -> int:
        """Remove whatever of this instance still carries ``program_id`` (the safety net of
        release, independent of the manager's memory). Returns how many were removed."""
        ...

    async def sweep(self, live_program_ids: Collection[str]) -> int:
        """Remove everything of this instance whose program is not in ``live_program_ids``."""
        ...

    async def adopt_container(self, ref: str, program_id: str) -> str:
        """Check an externally created container exists and may be owned by ``program_id``;
        return its canonical id. ``NotFound``/``Forbidden``/``BadRequest`` otherwise."""
        ...

    async def remove_container(self, ref: str) -> bool:
        """Force-remove an adopted container; False when it was already gone."""
        ...

    async def close(self) -> None: ...


class ProgramHooks(Protocol):
    """What the sandbox routes need from the router's program table. Implementations are
    synchronous and cheap (they only touch in-memory state)."""

    def require_program(self, program_id: str) -> None:
        """Raise ``NotFound`` when ``program_id`` is unknown or released."""
        ...

    def ensure_program(self, program_id: str) -> None:
        """Make ``program_id`` known (creating a new, queued program if needed): an agent may
        create its sandbox before its first LLM call, and preparation then overlaps the wait."""
        ...

    def tool_started(self, program_id: str) -> None:
        """A tool call of the program starts now: the program is ACTING on a tool."""
        ...

    def tool_finished(self, program_id: str, seconds: float) -> None:
        """The tool call ended after ``seconds`` (exactly the exec's reported duration)."""
        ...
