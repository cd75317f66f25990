"""Wiring of program-owned sandboxes into the gateway.

``attach_sandboxes`` builds the provider and the ``SandboxManager``, mounts the tool routes
(API key required), and ties the sandboxes' lifecycle to the programs': released programs
(explicitly or by the idle timeout) have everything reaped; at start-up and then periodically
the manager sweeps sandboxes of this router instance whose program is not live (after a
crash and restart, every one of them); the programs at the head of the waiting queue get
their environment readied before they are restored; long-paused programs' containers stop.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from fastapi import Depends, FastAPI
from starlette.requests import Request

from thunder_sgl.control.tickets import TickResult
from thunder_sgl.gateway.http import check_key
from thunder_sgl.gateway.inbound import check_program_id
from thunder_sgl.gateway.routes_sandboxes import build_sandbox_router
from thunder_sgl.gateway.runtime import Gateway
from thunder_sgl.programs import Program
from thunder_sgl.sandboxes import SandboxManager, open_provider

log = logging.getLogger("thunder_sgl.tools")
SWEEP_EVERY_SECONDS = 60.0
IN_PROCESS_INSTANCE = "thunder-router"
"""The instance id of a router built in process with none configured (``thunder-router``
names its own: ``gateway.instance_id``)."""


class GatewayHooks:
    """``ProgramHooks`` over the gateway's controller (tool time feeds the decay)."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw

    def require_program(self, program_id: str) -> None:
        self.gw.controller._require(program_id)

    def ensure_program(self, program_id: str) -> None:
        self.gw.controller.ensure_program(check_program_id(program_id, "program id"), self.gw.clock())

    def tool_started(self, program_id: str) -> None:
        self.gw.controller.tool_started(program_id, self.gw.clock())

    def tool_finished(self, program_id: str, seconds: float) -> None:
        self.gw.controller.tool_finished(program_id, self.gw.clock(), seconds)


def attach_sandboxes(app: FastAPI, gw: Gateway) -> SandboxManager | None:
    cfg = gw.cfg.sandboxes
    state = Path(gw.cfg.gateway.state_dir) if gw.cfg.gateway.state_dir else None
    instance = gw.cfg.gateway.instance_id or IN_PROCESS_INSTANCE
    provider = open_provider(cfg, instance)
    if provider is None and cfg.provider == "none":
        log.info("sandboxes disabled (sandboxes.provider: none)")
    manager = SandboxManager(cfg, provider, instance,
                             state_path=state / "sandbox-resources.json" if state else None)
    gw.sandboxes = manager

    def api_key(request: Request) -> None:
        check_key(request, gw.cfg.gateway.api_key, "API key")

    app.include_router(build_sandbox_router(manager, GatewayHooks(gw)), dependencies=[Depends(api_key)])

    async def reap(p: Program) -> None:
        await manager.release_program(p.id)

    gw.on_release.append(reap)
    prepared: dict[str, int] = {}
    stopped: set[str] = set()

    def on_tick(res: TickResult) -> None:
        now = gw.clock()
        c = gw.controller
        if cfg.prepare_ahead and cfg.prepare_ahead_count and manager.provider is not None:
            for p in c.queue(now)[: cfg.prepare_ahead_count]:
                if p.admitted and prepared.get(p.id) != p.pauses and manager.list(p.id):
                    prepared[p.id] = p.pauses
                    stopped.discard(p.id)
                    gw.spawn(manager.prepare_ahead(p.id), f"prepare {p.id}")
        if cfg.stop_paused_after_seconds > 0:
            for p in c.programs.waiting():
                if (p.admitted and p.paused_since is not None and p.id not in stopped
                        and now - p.paused_since > cfg.stop_paused_after_seconds and manager.list(p.id)):
                    stopped.add(p.id)
                    gw.spawn(manager.stop_program(p.id), f"stop {p.id}")
        for p in res.placed:
            stopped.discard(p.id)
        live = c.programs
        for pid in [k for k in prepared if k not in live]:
            del prepared[pid]

    gw.on_tick.append(on_tick)

    async def sweeper() -> None:
        while True:
            try:
                n = await manager.sweep_orphans([p.id for p in gw.controller.programs])
                if n:
                    log.warning("swept %d orphaned sandbox resource(s) of instance %s", n, instance)
            except Exception:
                log.exception("sandbox sweep failed")
            await asyncio.sleep(SWEEP_EVERY_SECONDS)

    gw.on_start.append(lambda: gw.spawn(sweeper(), "sandbox sweeper"))
    gw.on_stop.append(manager.close)
    return manager
