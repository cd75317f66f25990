"""One sandbox's lifecycle: a status enum (``SandboxStatus``) plus this class, one short
method per transition::

    preparing ──prepare──▶ ready ──stop──▶ stopped ──restart──▶ preparing ──▶ ready …
        └──────────────▶ failed (owns nothing: container, process and ports are freed)
    any ──teardown──▶ removed

Transitions may interleave (a teardown while ``prepare`` awaits the provider): every step
re-checks the status after each await, and whoever sees ``removed`` frees what exists, so
a sandbox deleted mid-creation never leaks its container.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from thunder_sgl.errors import SandboxError, ThunderError
from thunder_sgl.sandboxes.base import RunState, SandboxInfo, SandboxProvider, SandboxStatus
from thunder_sgl.sandboxes.ports import PortAllocator

S = SandboxStatus


class Sandbox:
    def __init__(
        self,
        info: SandboxInfo,
        provider: SandboxProvider,
        ports: PortAllocator,
        clock: Callable[[], float],
        setup_timeout: float,
    ) -> None:
        self.info = info
        self.provider = provider
        self.ports = ports
        self.clock = clock
        self.setup_timeout = setup_timeout
        self.settled = asyncio.Event()
        """Set whenever the status is not ``preparing``."""
        self.task: asyncio.Task[None] | None = None
        """The background work in flight on this sandbox (prepare, restart or check)."""

    @property
    def status(self) -> SandboxStatus:
        return self.info.status

    @property
    def restarting(self) -> bool:
        """Preparing again after having been ready (the router's doing, not the client's)."""
        return self.info.status is S.PREPARING and self.info.ready_at is not None

    async def prepare(self) -> None:
        """preparing → ready (create, then setup commands in order) or → failed."""
        info = self.info
        await self._run(self._create_and_setup)
        if info.status is S.REMOVED and info.handle is not None:
            await self.free()  # deleted while the provider created it

    async def restart(self) -> None:
        """stopped (or exited) → preparing → ready: start the existing sandbox again."""
        self.info.status = S.PREPARING
        self.settled = asyncio.Event()
        await self._run(self._start)

    async def stop(self) -> None:
        """ready → stopped (files kept, memory and CPU given back)."""
        if self.info.status is S.READY and self.info.handle is not None:
            self.info.status = S.STOPPED
            await self.provider.stop(self.info.handle)

    async def ensure_running(self) -> None:
        """Before the program runs again: restart what is stopped or exited; a sandbox whose
        container vanished behind our back is failed."""
        info = self.info
        if info.status is S.READY and info.handle is not None:
            state = await self.provider.state(info.handle)
            if state is RunState.MISSING and info.status is S.READY:
                info.status, info.error = S.FAILED, "the sandbox disappeared outside the router"
                await self.free()
                return
            if state is RunState.RUNNING:
                return
        if info.status in (S.READY, S.STOPPED):
            await self.restart()

    async def teardown(self) -> None:
        """any → removed: kill and delete everything (a running setup command included)."""
        if self.info.status is S.REMOVED:
            return
        self.info.status = S.REMOVED
        self.settled.set()
        await self.free()
        if self.task is not None and not self.task.done():
            await asyncio.shield(self.task)  # a create in flight removes what it made
            await self.free()

    async def free(self) -> None:
        """Give back the container or process and the ports. Idempotent."""
        info = self.info
        handle, info.handle = info.handle, None
        self.ports.release(info.program_id, info.ports)
        if handle is not None:
            await self.provider.remove(handle)

    # ---- steps -------------------------------------------------------------------------
    async def _create_and_setup(self) -> None:
        info = self.info
        info.handle = await self.provider.create(info.program_id, info.id, info.spec, info.ports)
        for i, cmd in enumerate(info.spec.setup):
            if info.status is not S.PREPARING:
                return
            r = await self.provider.exec(info.handle, list(cmd), self.setup_timeout, {}, None)
            if r.exit_code != 0 and info.status is S.PREPARING:
                why = "timed out" if r.timed_out else f"exited with {r.exit_code}"
                raise SandboxError(f"setup[{i}] {list(cmd)} {why}: {r.stderr[-500:].strip()}")

    async def _start(self) -> None:
        assert self.info.handle is not None
        await self.provider.start(self.info.handle)

    async def _run(self, step: Callable[[], Awaitable[None]]) -> None:
        info = self.info
        t0 = time.perf_counter()
        try:
            await step()
            if info.status is S.PREPARING:
                info.status = S.READY
                info.ready_at = self.clock()
                info.prepare_seconds = time.perf_counter() - t0
        except Exception as e:
            if info.status is S.PREPARING:
                info.status = S.FAILED
                info.error = e.message if isinstance(e, ThunderError) else f"{type(e).__name__}: {e}"
                await self.free()
        finally:
            self.settled.set()
