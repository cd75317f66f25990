"""Admin routes, as sglang_router serves them (sglang-surface.md §3.4), plus /metrics.

Worker management follows sglang_router 0.3.2 (bodies in ``worker_bodies``; replies compared
with 0.3.2's by tests/integration/test_slime_contract.py), finds a worker by id or by URL, and
keeps 0.2.x's ``/add_worker``, ``/remove_worker``, ``/list_workers`` that older slime calls
(docs/rl.md §9). Worker management, loads and cache flush need the admin key (when one is configured);
health, model and /metrics routes are open, as in sglang_router. The cache flush goes through
``EngineControl`` with the RL control routes (``routes_engine``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from thunder_sgl.backends.monitor import Worker
from thunder_sgl.errors import BadRequest, NoBackend, NotFound
from thunder_sgl.gateway.engine_control import EngineControl
from thunder_sgl.gateway.http import check_key, read_body
from thunder_sgl.gateway.runtime import Gateway
from thunder_sgl.gateway.worker_bodies import worker_config, worker_update, worker_url

WORKER_SCHEMA = {"type": "object", "required": ["url"], "properties": {"url": {"type": "string"}}}
LEGACY_ADD_WAIT_S = 300.0
"""How long ``POST /add_worker`` waits for the worker to register (sglang_router 0.2.x answered
once the worker was healthy, or 400)."""


async def json_body(request: Request) -> Any:
    try:
        return orjson.loads(await read_body(request, 65536))
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}", code="invalid_json") from None


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
        items = [w.describe(gw.clock()) for w in monitor().workers.values()]
        stats = {"prefill_count": 0, "decode_count": 0, "regular_count": len(items)}
        return JSONResponse({"workers": items, "total": len(items), "stats": stats})

    @router.post("/workers", status_code=202, openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": WORKER_SCHEMA}}}})
    async def add_worker(request: Request) -> JSONResponse:
        """sglang_router 0.3.2's ``WorkerConfigRequest`` (``worker_bodies``); registration runs
        in the background, as there. The same URL again answers its worker's id."""
        check_key(request, gw.admin_key, "admin key")
        spec = worker_config(await json_body(request), gw.cfg.gateway.api_key)
        w = monitor().add(spec.url, model_id_override=spec.model_id, priority=spec.priority, cost=spec.cost,
                          labels=spec.labels, disable_health_check=spec.disable_health_check)
        location = f"/workers/{w.id}"
        return JSONResponse({"status": "accepted", "worker_id": w.id, "url": w.url, "location": location,
                             "message": "Worker addition queued for background processing"},
                            status_code=202, headers={"Location": location})

    def find(worker_id: str) -> Worker:
        """By id (as sglang_router 0.3.x) or by URL, URL-encoded in the path (as 0.2.x)."""
        w = monitor().find(worker_id)
        if w is None:
            raise NotFound(f"worker {worker_id!r} not found", code="worker_not_found")
        return w

    @router.get("/workers/{worker_id:path}")
    async def get_worker(request: Request, worker_id: str) -> JSONResponse:
        check_key(request, gw.admin_key, "admin key")
        return JSONResponse(find(worker_id).describe(gw.clock()))

    @router.put("/workers/{worker_id:path}", status_code=202)
    async def update_worker(request: Request, worker_id: str) -> JSONResponse:
        """sglang_router's update: priority, cost, labels (shown; not used in scheduling)."""
        check_key(request, gw.admin_key, "admin key")
        w = find(worker_id)
        for name, value in worker_update(await json_body(request)).items():
            setattr(w, name, value)
        return JSONResponse({"status": "accepted", "worker_id": w.id, "message": "worker updated"}, status_code=202)

    @router.delete("/workers/{worker_id:path}", status_code=202)
    async def delete_worker(request: Request, worker_id: str) -> JSONResponse:
        """Remove by id (as sglang_router 0.3.x) or by URL-encoded URL (as 0.2.x). Done when
        answered: the worker gets no new request, and its programs migrate."""
        check_key(request, gw.admin_key, "admin key")
        w = find(worker_id)
        await monitor().remove(w.id)
        return JSONResponse({"status": "accepted", "worker_id": w.id, "message": "worker removed; its programs migrate"},
                            status_code=202)

    # sglang_router <= 0.2.1's routes (404 in 0.3.x), which slime called with such a router
    # (slime before v0.3.1): plain-text answers, /add_worker once the worker is registered.
    @router.post("/add_worker")
    async def legacy_add_worker(request: Request) -> PlainTextResponse:
        check_key(request, gw.admin_key, "admin key")
        url = worker_url(request.query_params.get("url"))
        w = monitor().add(url)
        deadline = time.monotonic() + LEGACY_ADD_WAIT_S
        while not (w.registered and w.healthy):
            if w.id not in monitor().workers:
                raise NotFound(f"worker {url!r} was removed while being added", code="worker_not_found")
            if time.monotonic() > deadline:
                await monitor().remove(w.id)
                raise BadRequest(f"worker {url} did not become healthy within {LEGACY_ADD_WAIT_S:.0f} s "
                                 f"({w.last_error})", param="url", code="worker_not_ready")
            await asyncio.sleep(0.1)
        return PlainTextResponse(f"Successfully added worker: {w.url}")

    @router.post("/remove_worker")
    async def legacy_remove_worker(request: Request) -> PlainTextResponse:
        check_key(request, gw.admin_key, "admin key")
        w = find(worker_url(request.query_params.get("url")))
        await monitor().remove(w.id)
        return PlainTextResponse(f"Successfully removed worker: {w.url}")

    @router.get("/list_workers")
    async def legacy_list_workers(request: Request) -> JSONResponse:
        check_key(request, gw.admin_key, "admin key")
        return JSONResponse({"urls": [w.url for w in monitor().workers.values() if w.registered]})

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
