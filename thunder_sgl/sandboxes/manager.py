"""SandboxManager: ties sandboxes, registered containers and ports to programs, and reaps them.

The router holds one manager. ``create`` validates a spec, allocates ports and returns at
once with status ``preparing``; a background task creates the sandbox and runs its setup
commands, so set-up overlaps whatever else the program waits for (admission, in particular).
Everything a program owns is reclaimed by ``release_program`` (on release, idle timeout,
or when ``sweep_orphans`` finds its program gone). Release first tears down what the manager
knows, then asks the provider to reap whatever still carries the program's identity (a
safety net that does not depend on the manager's memory), then reclaims the ports.

One sandbox's states and transitions live in ``lifecycle.Sandbox``; the manager finds
sandboxes by program, runs their transitions as background tasks and owns the ports.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thunder_sgl.errors import Conflict, Forbidden, GatewayTimeout, NotFound
from thunder_sgl.sandboxes.base import ExecResult, SandboxInfo, SandboxProvider, SandboxStatus
from thunder_sgl.sandboxes.config import SandboxConfig
from thunder_sgl.sandboxes.journal import ResourceJournal
from thunder_sgl.sandboxes.lifecycle import Sandbox
from thunder_sgl.sandboxes.ports import PortAllocator
from thunder_sgl.sandboxes.spec import (
    parse_command,
    parse_env,
    parse_resource,
    parse_spec,
    parse_timeout,
    parse_workdir,
)

log = logging.getLogger(__name__)
REMOVED_KEPT = 32
"""Removed sandboxes remembered per program (so GET answers ``removed``, not 404)."""

S = SandboxStatus


@dataclass
class _Owned:
    sandboxes: dict[str, Sandbox] = field(default_factory=dict)
    containers: set[str] = field(default_factory=set)


class SandboxManager:
    def __init__(
        self,
        config: SandboxConfig,
        provider: SandboxProvider | None,
        instance_id: str,
        *,
        ports: PortAllocator | None = None,
        max_ports_per_sandbox: int | None = None,
        state_path: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.provider = provider
        self.instance_id = instance_id
        self.ports = ports or PortAllocator(config.port_range)
        self.max_ports_per_sandbox = config.max_ports_per_sandbox if max_ports_per_sandbox is None else max_ports_per_sandbox
        self.journal = ResourceJournal(state_path)
        self.clock = clock
        self._owned: dict[str, _Owned] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._releasing: dict[str, asyncio.Task[dict[str, Any]]] = {}

    # ---- create / inspect --------------------------------------------------------------
    async def create(self, program_id: str, spec: Any) -> SandboxInfo:
        """Validate ``spec`` (400 naming the field), allocate its ports and return at once with
        status ``preparing``; preparation continues in the background."""
        provider = self._provider()
        parsed = parse_spec(spec, self.config, max_ports=self.max_ports_per_sandbox)
        await self._after_release(program_id)
        owned = self._owned.setdefault(program_id, _Owned())
        alive = [e for e in owned.sandboxes.values() if e.info.status is not S.REMOVED]
        if len(alive) >= self.config.max_sandboxes_per_program:
            raise Conflict(
                f"program already owns {len(alive)} sandboxes (sandboxes.max_sandboxes_per_program)",
                code="too_many_sandboxes",
            )
        sid = "sb-" + secrets.token_hex(6)
        ports = self.ports.allocate(program_id, parsed.ports)
        info = SandboxInfo(sid, program_id, S.PREPARING, provider.name, parsed, ports, created_at=self.clock())
        entry = Sandbox(info, provider, self.ports, self.clock, self.config.setup_timeout_seconds)
        owned.sandboxes[sid] = entry
        self._prune(owned)
        self._spawn(entry, entry.prepare())
        return self._snapshot(entry)

    def get(self, program_id: str, sid: str) -> SandboxInfo:
        return self._snapshot(self._entry(program_id, sid))

    async def wait_ready(self, program_id: str, sid: str, timeout: float) -> SandboxInfo:
        """Wait until the sandbox leaves ``preparing`` (ready, failed or removed) and return it;
        ``GatewayTimeout`` (504) when it is still preparing after ``timeout`` seconds."""
        entry = self._entry(program_id, sid)
        try:
            await asyncio.wait_for(entry.settled.wait(), timeout)
        except TimeoutError:
            raise GatewayTimeout(f"sandbox {sid} is still preparing after {timeout:g} s", code="sandbox_not_ready") from None
        return self._snapshot(entry)

    def owned(self, program_id: str) -> dict[str, Any]:
        """What the program owns, for ``GET /programs/{id}``."""
        owned = self._owned.get(program_id, _Owned())
        return {
            "sandboxes": [self._snapshot(e).to_dict() for e in owned.sandboxes.values() if e.info.status is not S.REMOVED],
            "containers": sorted(owned.containers),
            "ports": self.ports.owned(program_id),
        }

    def programs(self) -> builtins.list[str]:
        """Programs that own anything."""
        return builtins.list(self._owned)

    # ---- exec --------------------------------------------------------------------------
    async def exec(
        self,
        program_id: str,
        sid: str,
        command: str | builtins.list[str],
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        *,
        on_start: Callable[[], None] | None = None,
    ) -> ExecResult:
        """Run a command in a ready sandbox. A sandbox the router stopped is restarted first
        (the client did not stop it). ``on_start`` is called right before the command starts,
        after every check passed: the router marks the program ACTING there."""
        argv = parse_command(command, "command")
        seconds = parse_timeout(timeout, self.config)
        extra_env = parse_env(env, "env")
        wd = parse_workdir(workdir, "workdir")
        entry = self._entry(program_id, sid)
        if entry.status is S.STOPPED:
            await entry.restart()
        if entry.restarting:
            await self.wait_ready(program_id, sid, seconds)
        info = entry.info
        if info.status is not S.READY or info.handle is None:
            detail = f": {info.error}" if info.error else ""
            raise Conflict(
                f"sandbox {sid} is {info.status.value}{detail}; exec needs status ready",
                code=f"sandbox_{info.status.value}",
            )
        if on_start is not None:
            on_start()
        return await self._provider().exec(info.handle, argv, seconds, extra_env, wd)

    # ---- removal -----------------------------------------------------------------------
    async def delete(self, program_id: str, sid: str) -> SandboxInfo:
        entry = self._entry(program_id, sid)
        await entry.teardown()
        return self._snapshot(entry)

    async def release_program(self, program_id: str) -> dict[str, Any]:
        """Reap everything the program owns: sandboxes, registered containers, ports.
        Idempotent, and concurrent calls share one release. Errors are logged and returned in
        the summary, never raised: a release always finishes."""
        task = self._releasing.get(program_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._release(program_id))
            self._releasing[program_id] = task
            task.add_done_callback(lambda _: self._releasing.pop(program_id, None))
        return await asyncio.shield(task)

    async def _release(self, program_id: str) -> dict[str, Any]:
        owned = self._owned.pop(program_id, _Owned())
        doomed = [e for e in owned.sandboxes.values() if e.info.status is not S.REMOVED]
        results = await asyncio.gather(
            *(e.teardown() for e in doomed),
            *(self._remove_container(c) for c in owned.containers),
            return_exceptions=True,
        )
        errors = [str(r) for r in results if isinstance(r, BaseException)]
        reaped = 0
        if self.provider is not None:
            try:
                reaped = await self.provider.reap_program(program_id)
            except Exception as e:
                errors.append(str(e))
        self.journal.discard(builtins.list(owned.containers))
        ports = self.ports.release_owner(program_id)
        for err in errors:
            log.warning("release of program %s: %s", program_id, err)
        return {
            "program_id": program_id,
            "sandboxes": len(doomed),
            "containers": len(owned.containers),
            "stray": reaped,
            "ports": ports,
            "errors": errors,
        }

    async def sweep_orphans(self, live_program_ids: Collection[str]) -> int:
        """Remove everything of this instance whose program is not live: programs this manager
        knows (released here), labelled containers and local sandboxes (left by a previous
        process with the same instance id) and journaled registered containers. Returns how
        many sandboxes and containers were removed."""
        live = set(live_program_ids)
        n = 0
        for pid in [p for p in self._owned if p not in live]:
            summary = await self.release_program(pid)
            n += summary["sandboxes"] + summary["containers"] + summary["stray"]
        if self.provider is not None:
            n += await self.provider.sweep(live | set(self._owned))
            stale = [c for c, p in self.journal.containers().items() if p not in live]
            n += sum(await asyncio.gather(*(self.provider.remove_container(c) for c in stale)))
            self.journal.discard(stale)
        return n

    # ---- resources registered by the agent ----------------------------------------------
    async def register_resource(self, program_id: str, resource: Any) -> dict[str, Any]:
        res = parse_resource(resource)
        await self._after_release(program_id)
        if res["kind"] == "port":
            self.ports.reserve(program_id, res["port"])
            self._owned.setdefault(program_id, _Owned())
            return {"object": "resource", "program_id": program_id, **res}
        cid = await self._provider().adopt_container(res["id"], program_id)
        self._owned.setdefault(program_id, _Owned()).containers.add(cid)
        self.journal.add(cid, program_id)
        return {"object": "resource", "program_id": program_id, "kind": "container", "id": cid}

    # ---- ahead-of-time preparation -------------------------------------------------------
    async def prepare_ahead(self, program_id: str, *, wait: bool = False) -> int:
        """Ready the program's environment before it runs again: restart sandboxes the router
        stopped, and those whose container exited behind our back. Starts the work in the
        background and returns how many sandboxes it looks at; ``wait=True`` awaits it.
        A no-op when ``sandboxes.prepare_ahead`` is off (an exec still restarts on demand)."""
        owned = self._owned.get(program_id)
        if owned is None or self.provider is None or not self.config.prepare_ahead:
            return 0
        entries = [e for e in owned.sandboxes.values() if e.info.status in (S.STOPPED, S.READY)]
        tasks = [self._spawn(e, e.ensure_running()) for e in entries]
        if wait and tasks:
            await asyncio.gather(*tasks)
        return len(entries)

    async def stop_program(self, program_id: str) -> int:
        """Stop (not remove) the ready sandboxes of a long-paused program; returns how many."""
        owned = self._owned.get(program_id)
        if owned is None:
            return 0
        entries = [e for e in owned.sandboxes.values() if e.status is S.READY]
        results = await asyncio.gather(*(e.stop() for e in entries), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                log.warning("stopping a sandbox of program %s: %s", program_id, r)
        return len(entries)

    @property
    def releasing(self) -> int:
        """Programs whose release is still tearing sandboxes down (no longer in ``programs``)."""
        return len(self._releasing)

    async def close(self, *, release: bool = True, timeout: float = 60.0) -> None:
        """Shut down. ``release=True`` (default) reaps everything first: a router's program
        table dies with it, so its sandboxes would be orphans anyway. Releases already in
        flight are awaited too (a create still running in a worker thread would otherwise
        finish after the loop is gone and leave its container), for at most ``timeout``
        seconds; what is left then is an orphan for the next start's sweep, and logged."""
        if release:
            pending: builtins.list[Awaitable[dict[str, Any]]] = [
                self.release_program(pid) for pid in builtins.list(self._owned)
            ]
            pending += [asyncio.shield(t) for t in self._releasing.values()]
            if pending:
                try:
                    await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), timeout)
                except TimeoutError:
                    log.warning("shutdown: %d program release(s) unfinished after %g s; the next start "
                                "with instance id %s sweeps what they leave", self.releasing, timeout,
                                self.instance_id)
        for t in builtins.list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.provider is not None:
            await self.provider.close()

    def list(self, program_id: str) -> builtins.list[SandboxInfo]:
        owned = self._owned.get(program_id, _Owned())
        return [self._snapshot(e) for e in owned.sandboxes.values()]

    # ---- internals ---------------------------------------------------------------------
    async def _remove_container(self, cid: str) -> None:
        await self._provider().remove_container(cid)

    async def _after_release(self, program_id: str) -> None:
        """A program id reused while its previous life is being released waits for the
        release, so that the release cannot reap what the new life creates."""
        task = self._releasing.get(program_id)
        if task is not None:
            await asyncio.shield(task)

    def _spawn(self, entry: Sandbox, coro: Any) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        entry.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _entry(self, program_id: str, sid: str) -> Sandbox:
        owned = self._owned.get(program_id)
        entry = owned.sandboxes.get(sid) if owned else None
        if entry is None:
            raise NotFound(f"program {program_id!r} has no sandbox {sid!r}", param="sandbox_id", code="sandbox_not_found")
        return entry

    def _provider(self) -> SandboxProvider:
        if self.provider is None:
            raise Forbidden("sandboxes are disabled on this router (sandboxes.provider = none)", code="sandboxes_disabled")
        return self.provider

    @staticmethod
    def _snapshot(entry: Sandbox) -> SandboxInfo:
        return dataclasses.replace(entry.info, ports=builtins.list(entry.info.ports))

    @staticmethod
    def _prune(owned: _Owned) -> None:
        removed = [k for k, e in owned.sandboxes.items() if e.info.status is S.REMOVED]
        for k in removed[: max(0, len(removed) - REMOVED_KEPT)]:
            del owned.sandboxes[k]
