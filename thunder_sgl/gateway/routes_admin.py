"""Admin routes, as sglang_router serves them (sglang-surface.md §3.4), plus /metrics.

Worker management, loads and cache flush need the admin key (when one is configured);
health, model and /metrics routes are open, as in sglang_router. The cache flush goes through
``EngineControl`` with the RL control routes (``routes_engine``).
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from thunder_sgl.errors import BadRequest, NoBackend, NotFound
from thunder_sgl.gateway.engine_control import EngineControl
from thunder_sgl.gateway.http import check_key, read_body
from thunder_sgl.gateway.runtime import Gateway

WORKER_SCHEMA = {"type": "object", "required": ["url"], "properties": {"url": {"type": "string"}}}


def build_admin_router(gw: Gateway, engines: EngineControl) -> APIRouter:
    router = APIRouter(tags=["admin"])

    def monitor():  # noqa: ANN202
        assert gw.monitor is not None
        return gw.monitor

    @router.get("/health")
    @router.get("/liveness")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("OK")

    @router.get("/readiness")
    async def readiness() -> JSONResponse:
        workers = monitor().workers.values()
        healthy = sum(1 for w in workers if w.registered and w.healthy)
        if healthy == 0:
            return JSONResponse({"status": "not ready", "healthy_workers": 0, "total_workers": len(workers)},
                                status_code=503)
        return JSONResponse({"status": "ready", "healthy_workers": healthy, "total_workers": len(workers)})

    @router.get("/health_generate")
    async def health_generate() -> PlainTextResponse:
        if not monitor().healthy_workers():
            raise NoBackend("no healthy workers")
        return PlainTextResponse("At least one router has healthy workers")

    @router.get("/v1/models")
    async def models() -> JSONResponse:
        seen: dict[str, Any] = {}
        for w in monitor().workers.values():
            if w.registered and w.model_id not in seen:
                seen[w.model_id] = {"id": w.model_id, "object": "model", "created": int(gw.started_at),
                                    "owned_by": "thunder_sgl"}
        return JSONResponse({"object": "list", "data": list(seen.values())})

    @router.get("/get_model_info")
    async def model_info() -> JSONResponse:
        for w in monitor().healthy_workers():
            if w.model_info is not None:
                return JSONResponse(w.model_info)
        raise NoBackend("no healthy worker with model info")

    @router.get("/get_server_info")
    async def server_info() -> JSONResponse:
        c = gw.controller
        info: dict[str, Any] = {
            "router_manager": True, "routers_count": 1, "workers_count": len(monitor().workers),
            "policy": gw.cfg.gateway.policy, "programs": len(c.programs), "waiting_programs": c.programs.waiting_count,
            "held_requests": c.held_count, "time_scale": gw.cfg.time_scale,
        }
        m = gw.sandboxes
        if m is not None:
            live = [s for pid in m.programs() for s in m.list(pid) if s.status.value != "removed"]
            info["sandboxes"] = {"live": len(live), "programs": len(m.programs()), "releasing": m.releasing,
                                 "ports_in_use": m.ports.in_use,
                                 "provider": type(m.provider).__name__ if m.provider else None}
        return JSONResponse(info)

    @router.get("/workers")
    async def list_workers(request: Request) -> JSONResponse:
        check_key(request, gw.admin_key, "admin key")
        items = [w.describe() for w in monitor().workers.values()]
        return JSONResponse({"workers": items, "total": len(items)})

    @router.post("/workers", status_code=202, openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": WORKER_SCHEMA}}}})
    async def add_worker(request: Request) -> JSONResponse:
        check_key(request, gw.admin_key, "admin key")
        try:
            body = orjson.loads(await read_body(request, 65536))
        except orjson.JSONDecodeError as e:
            raise BadRequest(f"request body is not valid JSON: {e}", code="invalid_json") from None
        url = body.get("url") if isinstance(body, dict) else None
        if not isinstance(url, str) or not url.startswith(("http://", "https://")) or len(url) > 2048:
            raise BadRequest("'url' must be an http(s) URL of a worker", param="url")
        w = monitor().add(url)
        return JSONResponse({"status": "accepted", "worker_id": w.id, "location": f"/workers/{w.id}"}, status_code=202)

    @router.get("/workers/{worker_id}")
    async def get_worker(request: Request, worker_id: str) -> JSONResponse:
        check_key(request, gw.admin_key, "admin key")
        w = monitor().find(worker_id)
        if w is None:
            raise NotFound(f"worker {worker_id!r} not found", code="worker_not_found")
        return JSONResponse(w.describe())

    @router.delete("/workers/{worker_id}", status_code=202)
    async def delete_worker(request: Request, worker_id: str) -> JSONResponse:
        """Remove by id (as sglang_router) or by URL (query ?url= is also accepted)."""
        check_key(request, gw.admin_key, "admin key")
        w = monitor().find(worker_id)
        if w is None:
            raise NotFound(f"worker {worker_id!r} not found", code="worker_not_found")
        await monitor().remove(w.id)
        return JSONResponse({"status": "accepted", "worker_id": w.id, "message": "worker removed; its programs migrate"},
                            status_code=202)

    @router.get("/get_loads")
    async def get_loads(request: Request) -> JSONResponse:
        check_key(request, gw.admin_key, "admin key")
        out = []
        for w in monitor().workers.values():
            out.append({
                "worker": w.url,
                "load": sum(b.live.used_tokens for b in w.backends) if w.registered else -1,
                "dp_ranks": [{"dp_rank": b.dp_rank, "used_tokens": b.live.used_tokens, "running_reqs": b.live.running_reqs,
                              "waiting_reqs": b.live.waiting_reqs, "host_used_tokens": b.live.host_used_tokens,
                              "programs": len(gw.controller.programs.on_backend(b.key))} for b in w.backends],
            })
        return JSONResponse({"workers": out})

    async def flush_cache(request: Request) -> JSONResponse:
        """Flush every healthy worker's cache; the programs there lose their KV (accounting reset)."""
        check_key(request, gw.admin_key, "admin key")
        out, status = await engines.flush(request.url.query)
        return JSONResponse(out, status_code=status)

    # One route per method: a two-method route gets one operation id for both (FastAPI warns).
    router.add_api_route("/flush_cache", flush_cache, methods=["POST"], name="flush_cache")
    router.add_api_route("/flush_cache", flush_cache, methods=["GET"], name="flush_cache_get")

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(gw.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return router
