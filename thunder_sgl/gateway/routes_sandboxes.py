"""Tool routes: program-owned sandboxes and registered resources (design.md, "HTTP surface").

    POST   /programs/{id}/sandboxes               spec → 202, status "preparing" (set-up runs
                                                  in the background)
    GET    /programs/{id}/sandboxes               list
    GET    /programs/{id}/sandboxes/{sid}?wait=S  status; with wait, long-polls up to S seconds
                                                  (at most 60) until it leaves "preparing"
    POST   /programs/{id}/sandboxes/{sid}/exec    {"command", "timeout"?, "env"?, "workdir"?}
                                                  → exit_code, stdout, stderr, duration_seconds
    DELETE /programs/{id}/sandboxes/{sid}         → the sandbox, status "removed"
    POST   /programs/{id}/resources               {"kind": "container", "id"} or
                                                  {"kind": "port", "port"} → 201

Every route first asks ``hooks.require_program`` (404 for unknown or released programs),
except create, which registers an unknown program (``hooks.ensure_program``).
An exec marks the program ACTING for exactly the command's duration: ``tool_started`` just
before it runs (after validation and readiness checks, so a rejected exec costs nothing) and
``tool_finished`` with the duration reported in the response, in a ``finally``. Errors are
``ThunderError``s; the app's handler turns them into OpenAI-shaped bodies.
"""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from thunder_sgl.errors import BadRequest, GatewayTimeout
from thunder_sgl.sandboxes.base import ExecResult, ProgramHooks
from thunder_sgl.sandboxes.manager import SandboxManager
from thunder_sgl.sandboxes.spec import parse_exec

MAX_WAIT_SECONDS = 60.0


async def _json(request: Request, *, allow_empty: bool = False) -> Any:
    raw = await request.body()
    if not raw.strip():
        if allow_empty:
            return None
        raise BadRequest("request body must be a JSON object", param="body")
    try:
        return json.loads(raw)
    except ValueError as e:
        raise BadRequest(f"request body is not valid JSON: {e}", param="body") from e


def _wait_param(request: Request) -> float:
    raw = request.query_params.get("wait")
    if raw is None:
        return 0.0
    try:
        wait = float(raw)
    except ValueError:
        raise BadRequest(f"wait must be a number of seconds, got {raw!r}", param="wait") from None
    if not 0 <= wait <= MAX_WAIT_SECONDS:
        raise BadRequest(f"wait must be within 0..{MAX_WAIT_SECONDS:g} seconds, got {raw}", param="wait")
    return wait


def build_sandbox_router(manager: SandboxManager, hooks: ProgramHooks) -> APIRouter:
    router = APIRouter(tags=["sandboxes"])

    @router.post("/programs/{program_id}/sandboxes", status_code=202)
    async def create_sandbox(program_id: str, request: Request) -> JSONResponse:
        hooks.ensure_program(program_id)
        info = await manager.create(program_id, await _json(request, allow_empty=True))
        return JSONResponse(info.to_dict(), status_code=202)

    @router.get("/programs/{program_id}/sandboxes")
    async def list_sandboxes(program_id: str) -> dict[str, Any]:
        hooks.require_program(program_id)
        return {"object": "list", "data": [i.to_dict() for i in manager.list(program_id)]}

    @router.get("/programs/{program_id}/sandboxes/{sandbox_id}")
    async def get_sandbox(program_id: str, sandbox_id: str, request: Request) -> dict[str, Any]:
        hooks.require_program(program_id)
        wait = _wait_param(request)
        info = manager.get(program_id, sandbox_id)
        if wait > 0:
            try:
                info = await manager.wait_ready(program_id, sandbox_id, wait)
            except GatewayTimeout:  # long-poll: answer with the current status
                info = manager.get(program_id, sandbox_id)
        return info.to_dict()

    @router.post("/programs/{program_id}/sandboxes/{sandbox_id}/exec")
    async def exec_in_sandbox(program_id: str, sandbox_id: str, request: Request) -> dict[str, Any]:
        hooks.require_program(program_id)
        req = parse_exec(await _json(request), manager.config)
        started = False
        result: ExecResult | None = None

        def on_start() -> None:
            nonlocal started
            hooks.tool_started(program_id)
            started = True

        t0 = time.perf_counter()
        try:
            result = await manager.exec(
                program_id, sandbox_id, req.command, req.timeout, req.env, req.workdir, on_start=on_start
            )
        finally:
            if started:
                seconds = result.duration_seconds if result is not None else time.perf_counter() - t0
                hooks.tool_finished(program_id, seconds)
        return result.to_dict()

    @router.delete("/programs/{program_id}/sandboxes/{sandbox_id}")
    async def delete_sandbox(program_id: str, sandbox_id: str) -> dict[str, Any]:
        hooks.require_program(program_id)
        return (await manager.delete(program_id, sandbox_id)).to_dict()

    @router.post("/programs/{program_id}/resources", status_code=201)
    async def register_resource(program_id: str, request: Request) -> JSONResponse:
        hooks.require_program(program_id)
        body = await manager.register_resource(program_id, await _json(request))
        return JSONResponse(body, status_code=201)

    return router
