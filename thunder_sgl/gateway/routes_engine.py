"""Engine control routes for RL frameworks, with SGLang 0.5.23's names and bodies, plus SkyRL's
``/weight_sync/begin`` and ``/weight_sync/end`` (``engine_control`` does the work).

All need the admin key when one is configured. Bad input is a 4xx in the OpenAI error shape
before any worker is called; a call the workers refused carries the error object beside the
summary of every worker's answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse

from thunder_sgl.gateway import engine_bodies as B
from thunder_sgl.gateway.engine_control import EngineControl, with_error
from thunder_sgl.gateway.http import check_key, read_body
from thunder_sgl.gateway.runtime import Gateway

_TAGS = {"type": "array", "items": {"type": "string", "enum": list(B.MEMORY_TAGS)}}
SCHEMAS: dict[str, dict[str, Any]] = {
    "/pause_generation": {"type": "object", "properties": {"mode": {"type": "string", "enum": list(B.PAUSE_MODES)}}},
    "/continue_generation": {"type": "object", "properties": {"torch_empty_cache": {"type": "boolean"}}},
    "/abort_request": {"type": "object", "properties": {"rid": {"type": "string", "minLength": 1},
                                                        "abort_all": {"type": "boolean"}}},
    "/update_weights_from_disk": {"type": "object", "required": ["model_path"], "properties": {
        "model_path": {"type": "string", "minLength": 1}, "weight_version": {"type": "string", "minLength": 1},
        "flush_cache": {"type": "boolean"}, "abort_all_requests": {"type": "boolean"},
        "load_format": {"type": "string"}}},
    "/release_memory_occupation": {"type": "object", "properties": {"tags": _TAGS}},
    "/resume_memory_occupation": {"type": "object", "properties": {"tags": _TAGS}},
    "/weight_sync/begin": {"type": "object"},
    "/weight_sync/end": {"type": "object"},
}
DOCS = {
    "/pause_generation": "Pause generation on every worker (mode abort, in_place or retract); the router holds new requests.",
    "/continue_generation": "Continue generation on every worker; held requests go out.",
    "/abort_request": "Abort one request by rid (on the worker that holds it, or while the router holds it), or all.",
    "/update_weights_from_disk": "Load new weights on every worker; the router holds requests meanwhile and resets KV accounting.",
    "/release_memory_occupation": "Release engine memory (colocated training); the router holds requests until resumed.",
    "/resume_memory_occupation": "Resume the memory released through the router.",
    "/weight_sync/begin": "Open a weight-sync window (SkyRL's ThunderAgent integration): hold new requests and restores.",
    "/weight_sync/end": "Close the weight-sync window: held requests go out.",
}


def build_engine_router(gw: Gateway, ctl: EngineControl) -> APIRouter:
    router = APIRouter(tags=["engine control"])

    def route(path: str, op: Callable[[dict[str, Any]], Awaitable[tuple[dict[str, Any], int]]],
              methods: tuple[str, ...] = ("POST",)) -> None:
        async def endpoint(request: Request) -> JSONResponse:
            check_key(request, gw.admin_key, "admin key")
            body = B.json_object(await read_body(request, gw.cfg.gateway.max_body_bytes))
            out, status = await op(body)
            return JSONResponse(with_error(out, status), status_code=status)

        # One route per method: a two-method route gets one operation id for both (FastAPI warns).
        for m in methods:
            name = f"{path.strip('/').replace('/', '_')}" + ("" if m == "POST" else f"_{m.lower()}")
            extra = {"requestBody": {"required": False, "content": {"application/json": {"schema": SCHEMAS[path]}}}}
            router.add_api_route(path, endpoint, methods=[m], name=name, summary=DOCS[path],
                                 openapi_extra=extra if m == "POST" else None)

    async def begin(_: dict[str, Any]) -> tuple[dict[str, Any], int]:
        return ctl.begin_sync()

    async def end(_: dict[str, Any]) -> tuple[dict[str, Any], int]:
        return ctl.end_sync()

    route("/pause_generation", ctl.pause)
    route("/continue_generation", ctl.resume_generation)
    route("/abort_request", ctl.abort)
    route("/update_weights_from_disk", ctl.update_weights)
    route("/release_memory_occupation", ctl.release_memory, ("POST", "GET"))
    route("/resume_memory_occupation", ctl.resume_memory, ("POST", "GET"))
    route("/weight_sync/begin", begin)
    route("/weight_sync/end", end)

    @router.get("/weight_sync", summary="The router's weight-update window and weight version.")
    async def window_state(request: Request) -> JSONResponse:
        return JSONResponse(gw.controller.windows.describe(gw.clock()))

    return router
