"""Program routes: inspect and release agent programs.

``GET /programs/{id}`` and the release routes need the API key (whoever knows a program id
acts for it); ``GET /programs`` and ``DELETE /programs`` (all programs) need the admin key.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse

from thunder_sgl.errors import BadRequest, NotFound
from thunder_sgl.gateway.http import check_key, read_body
from thunder_sgl.gateway.inbound import check_program_id
from thunder_sgl.gateway.runtime import Gateway
from thunder_sgl.programs import Program

RELEASE_SCHEMA = {"type": "object", "required": ["program_id"], "properties": {"program_id": {"type": "string"}}}


def describe(p: Program, now: float, wall_offset: float, sandboxes: dict[str, Any] | None = None) -> dict[str, Any]:
    paused_for = (now - p.paused_since) if p.paused_since is not None else 0.0
    return {
        "id": p.id,
        "inferred": p.inferred,
        "dormant": p.dormant,
        "end_hint": p.end_hint,
        "state": p.state.value if p.admitted else "new",
        "phase": p.phase.value,
        "group": p.group.id if p.group is not None else None,
        "backend": p.backend,
        "prev_backend": p.prev_backend,
        "context_tokens": p.context_tokens,
        "shared_prefix_tokens": p.shared_prefix_tokens,
        "expected_output_tokens": round(p.expected_output_tokens, 1),
        "steps": p.steps,
        "in_flight": p.in_flight,
        "held_requests": p.held,
        "pauses": p.pauses,
        "restores": p.restores,
        "migrations": p.migrations,
        "kv_resets": p.kv_resets,
        "time_paused_seconds": round(p.total_paused_seconds + paused_for, 3),
        "tool_seconds_total": round(p.total_tool_seconds, 3),
        "last_tool_seconds": round(p.last_tool_seconds, 3),
        "longest_tool_seconds": round(p.max_tool_seconds, 3),
        "tokens": {"prompt": p.prompt_tokens_total, "cached": p.cached_tokens_total,
                   "cached_by_tier": {"device": max(0, p.cached_tokens_total - p.cached_host_tokens_total
                                                    - p.cached_storage_tokens_total),
                                      "host": p.cached_host_tokens_total, "storage": p.cached_storage_tokens_total},
                   "completion": p.completion_tokens_total},
        "created_at": p.created_at + wall_offset,
        "last_active_at": p.last_active + wall_offset,
        "sandboxes": sandboxes if sandboxes is not None else {},
    }


def build_programs_router(gw: Gateway) -> APIRouter:
    router = APIRouter(tags=["programs"])

    def wall_offset() -> float:
        import time
        return time.time() - gw.clock()

    def sandboxes_of(pid: str) -> dict[str, Any] | None:
        return gw.sandboxes.owned(pid) if gw.sandboxes is not None else None

    @router.get("/programs")
    async def list_programs(request: Request, state: str | None = None) -> JSONResponse:
        check_key(request, gw.admin_key, "admin key")
        now, off = gw.clock(), wall_offset()
        c = gw.controller
        progs = [describe(p, now, off) for p in c.programs]
        if state:
            progs = [p for p in progs if p["state"] == state]
        return JSONResponse({
            "object": "list", "count": len(progs), "data": progs,
            "queue": [p.id for p in c.queue(now)], "held_requests": c.held_count,
        })

    @router.delete("/programs")
    async def release_all(request: Request) -> JSONResponse:
        check_key(request, gw.admin_key, "admin key")
        ids = [p.id for p in gw.controller.programs]
        for pid in ids:
            gw.release(pid)
        return JSONResponse({"released": len(ids)})

    @router.get("/programs/{program_id}")
    async def get_program(request: Request, program_id: str) -> JSONResponse:
        check_key(request, gw.cfg.gateway.api_key, "API key")
        pid = check_program_id(program_id, "program id")
        p = gw.controller.programs.get(pid)
        if p is None:
            raise NotFound(f"program {pid!r} not found (never seen, or already released)", code="program_not_found")
        return JSONResponse(describe(p, gw.clock(), wall_offset(), sandboxes_of(pid)))

    async def _release(pid: str) -> JSONResponse:
        p = gw.release(pid)
        return JSONResponse({"program_id": pid, "released": True, "steps": p.steps,
                             "time_paused_seconds": round(p.total_paused_seconds, 3)})

    @router.post("/programs/{program_id}/release")
    async def release(request: Request, program_id: str) -> JSONResponse:
        check_key(request, gw.cfg.gateway.api_key, "API key")
        return await _release(check_program_id(program_id, "program id"))

    @router.post("/programs/release", openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": RELEASE_SCHEMA}}}})
    async def release_by_body(request: Request) -> JSONResponse:
        """ThunderAgent-compatible release: ``{"program_id": ...}``."""
        check_key(request, gw.cfg.gateway.api_key, "API key")
        raw = await read_body(request, 65536)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise BadRequest(f"request body is not valid JSON: {e}", code="invalid_json") from None
        if not isinstance(body, dict) or "program_id" not in body:
            raise BadRequest("body must be a JSON object with 'program_id'", param="program_id")
        return await _release(check_program_id(body["program_id"], "'program_id'"))

    return router
