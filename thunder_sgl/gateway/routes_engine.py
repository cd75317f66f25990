"""Engine control routes for RL frameworks, with SGLang 0.5.23's names and bodies, plus SkyRL's
``/weight_sync/begin`` and ``/weight_sync/end`` (``engine_control`` does the work).

All need the admin key when one is configured. Bad input is a 4xx in the OpenAI error shape
before any worker is called; a call the workers refused carries the error object beside the
summary of every worker's answer. Most calls go to every worker; the single-worker ones
(``SINGLE``) name theirs with the query parameter ``worker`` (URL, id or index in
``GET /workers``), which the others refuse rather than broadcast a call meant for one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse

from thunder_sgl.errors import BadRequest
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
    "/init_weights_update_group": {"type": "object", "required": ["master_address", "master_port", "rank_offset",
                                                                   "world_size"], "properties": {
        "master_address": {"type": "string", "minLength": 1},
        "master_port": {"type": "integer", "minimum": 1, "maximum": 65535},
        "rank_offset": {"type": "integer", "minimum": 0, "maximum": B.MAX_RANK},
        "world_size": {"type": "integer", "minimum": 1, "maximum": B.MAX_RANK},
        "group_name": {"type": "string"}, "backend": {"type": "string"}}},
    "/destroy_weights_update_group": {"type": "object", "properties": {"group_name": {"type": "string"}}},
    "/update_weights_from_distributed": {"type": "object", "required": ["names", "dtypes", "shapes"], "properties": {
        "names": {"type": "array", "items": {"type": "string"}}, "dtypes": {"type": "array", "items": {"type": "string"}},
        "shapes": {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                                          "maximum": B.MAX_DIM}}},
        "group_name": {"type": "string"}, "weight_version": {"type": "string"}, "flush_cache": {"type": "boolean"},
        "abort_all_requests": {"type": "boolean"}, "load_format": {"type": "string"}}},
    "/update_weights_from_tensor": {"type": "object", "required": ["serialized_named_tensors"], "properties": {
        "serialized_named_tensors": {"type": "array", "items": {"type": "string"}},
        "weight_version": {"type": "string"}, "flush_cache": {"type": "boolean"},
        "abort_all_requests": {"type": "boolean"}, "load_format": {"type": "string"}}},
    "/update_weight_version": {"type": "object", "required": ["new_version"], "properties": {
        "new_version": {"type": "string"}, "abort_all_requests": {"type": "boolean"}}},
    "/load_lora_adapter": {"type": "object", "required": ["lora_name", "lora_path"], "properties": {
        "lora_name": {"type": "string"}, "lora_path": {"type": "string"}, "pinned": {"type": "boolean"}}},
    "/unload_lora_adapter": {"type": "object", "required": ["lora_name"], "properties": {
        "lora_name": {"type": "string"}}},
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
    "/init_weights_update_group": "Join every worker to the trainer's weight update group, each at its own rank_offset.",
    "/destroy_weights_update_group": "Destroy the weight update group on every worker.",
    "/update_weights_from_distributed": "Receive the trainer's broadcast weights on every worker, inside a window.",
    "/update_weights_from_tensor": "Load weights from tensors on the one worker named by ?worker=, inside a window.",
    "/update_weight_version": "Relabel the weight version on every worker.",
    "/load_lora_adapter": "Load a LoRA adapter on every worker.",
    "/unload_lora_adapter": "Unload a LoRA adapter from every worker.",
}
SINGLE = {"/update_weights_from_tensor"}
"""Routes that go to one worker, named by the ``worker`` query parameter."""


def build_engine_router(gw: Gateway, ctl: EngineControl) -> APIRouter:
    router = APIRouter(tags=["engine control"])

    def route(path: str, op: Callable[..., Awaitable[tuple[dict[str, Any], int]]],
              methods: tuple[str, ...] = ("POST",)) -> None:
        async def endpoint(request: Request) -> JSONResponse:
            check_key(request, gw.admin_key, "admin key")
            body = B.json_object(await read_body(request, gw.cfg.gateway.max_body_bytes))
            if path in SINGLE:
                out, status = await op(body, B.worker_ref(dict(request.query_params)))
            else:
                if "worker" in request.query_params:
                    raise BadRequest(f"{path} goes to every worker; the query parameter 'worker' is for the "
                                     f"single-worker calls ({', '.join(sorted(SINGLE))})", param="worker",
                                     code="worker_not_allowed")
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
    route("/init_weights_update_group", ctl.init_group)
    route("/destroy_weights_update_group", ctl.destroy_group)
    route("/update_weights_from_distributed", ctl.update_distributed)
    route("/update_weights_from_tensor", ctl.update_tensor)
    route("/update_weight_version", ctl.update_version)
    route("/load_lora_adapter", ctl.load_lora)
    route("/unload_lora_adapter", ctl.unload_lora)

    @router.get("/get_weight_version", summary="Every worker's weight version (read from its /model_info).")
    async def weight_version(request: Request) -> JSONResponse:
        out, status = await ctl.get_version()
        return JSONResponse(with_error(out, status), status_code=status)

    @router.get("/weight_sync", summary="The router's weight-update window and weight version.")
    async def window_state(request: Request) -> JSONResponse:
        return JSONResponse(gw.controller.windows.describe(gw.clock()))

    return router
