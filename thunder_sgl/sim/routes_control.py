"""Engine control routes of the simulated worker, with SGLang 0.5.23's names, bodies and
answers (``entrypoints/http_server.py``; ``managers/io_struct.py`` for the bodies):

- ``POST /pause_generation {"mode": "abort" | "in_place" | "retract"}`` → ``{"message", "status": "ok"}``;
  an ``abort`` pause answers once every request has left, as SGLang's does;
- ``POST /continue_generation`` → ``{"message", "status": "ok"}``;
- ``POST /update_weights_from_disk {"model_path", "weight_version"?, "flush_cache"?, "abort_all_requests"?}``
  → ``{"success", "message", "num_paused_requests"}``, 400 when ``success`` is false. Without a
  pause it waits for the requests in flight to finish (new ones wait), as SGLang's writer
  lock does; then the load takes ``control.weight_update_seconds`` of virtual time. The served
  model path, or any existing directory, loads; another path fails like a missing checkpoint;
- ``POST /update_weight_version {"new_version", "abort_all_requests"?}`` → ``{"success",
  "message", "new_version"}``: the version label only (no weights, no flush), requests aborted
  first unless ``abort_all_requests`` is false, as SGLang's;
- ``GET|POST /release_memory_occupation``, ``/resume_memory_occupation {"tags"?}`` → 200 ``null``.

The weight sync routes (update groups, distributed and tensor updates, LoRA adapters) are in
``sim.routes_weights``, on top of ``run_update``.

Bodies are validated as SGLang's pydantic models do: a bad field is a 400 with SGLang's error body.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from aiohttp import web

from thunder_sgl.sim import control
from thunder_sgl.sim import protocol as P
from thunder_sgl.sim.request import SimRequestError
from thunder_sgl.sim.server import SIM, SimServer, error_response, json_response

SETTLE_SECONDS = 120.0
"""Longest real wait for requests to leave the engines (an abort pause, a weight update)."""


async def _object(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        return {}
    body = P.loads_json(raw)
    if not isinstance(body, dict):
        raise SimRequestError("the body must be a JSON object")
    return body


def _tags(body: dict[str, Any]) -> list[str] | None:
    tags = body.get("tags")
    if tags is None:
        return None
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise SimRequestError("tags: Input should be a valid list of strings")
    unknown = sorted(set(tags) - set(control.MEMORY_TAGS))
    if unknown:
        raise SimRequestError(f"tags: unknown memory tags {unknown}; valid: {list(control.MEMORY_TAGS)}")
    return tags


def _ok(message: str) -> web.Response:
    return json_response({"message": message, "status": "ok"})


async def pause_generation(request: web.Request) -> web.Response:
    srv = request.app[SIM]
    try:
        mode = (await _object(request)).get("mode", "abort")
    except SimRequestError as e:
        return error_response(str(e), 400)
    if mode not in control.PAUSE_MODES:
        return error_response(f"mode: Input should be 'abort', 'retract' or 'in_place' (got {mode!r})", 400)
    srv.sync()
    control.pause(srv.worker, mode, srv.clock.now())
    srv.refresh_gate()
    srv.kick()
    if mode == "abort":
        await srv.settle(lambda: not control.has_requests(srv.worker), SETTLE_SECONDS)
    return _ok("Generation paused successfully.")


async def continue_generation(request: web.Request) -> web.Response:
    srv = request.app[SIM]
    srv.sync()
    control.resume_generation(srv.worker, srv.clock.now())
    srv.refresh_gate()
    srv.kick()
    return _ok("Generation continued successfully.")


async def update_weight_version(request: web.Request) -> web.Response:
    srv = request.app[SIM]
    try:
        body = await _object(request)
        version = body.get("new_version")
        if not isinstance(version, str):
            raise SimRequestError("new_version: Field required (a string)")
        abort = body.get("abort_all_requests", True)
        if not isinstance(abort, bool):
            raise SimRequestError("abort_all_requests: Input should be a valid boolean")
    except SimRequestError as e:
        return error_response(str(e), 400)
    if abort:
        srv.worker.abort_all(srv.clock.now())
        srv.kick()
    srv.worker.weight_version = version
    return json_response({"success": True, "message": f"Weight version updated to {version}", "new_version": version})


def _loadable(srv: SimServer, path: str) -> bool:
    return path == srv.worker.cfg.model.model_path or os.path.isdir(path)


async def update_weights_from_disk(request: web.Request) -> web.Response:
    srv = request.app[SIM]
    try:
        body = await _object(request)
        path = body.get("model_path")
        if not isinstance(path, str):
            raise SimRequestError("model_path: Field required (a string)")
        version, flush = update_fields(body)
    except SimRequestError as e:
        return error_response(str(e), 400)

    def load() -> str | None:
        if _loadable(srv, path):
            return None
        return f"Failed to get weights iterator: no checkpoint at {path!r}."

    return await run_update(srv, body, version, flush, load, {"num_paused_requests": 0})


def update_fields(body: dict[str, Any]) -> tuple[str | None, bool]:
    """``weight_version``, ``flush_cache`` and ``abort_all_requests``, the fields every weight
    update of SGLang has (``UpdateWeightFromDiskReqInput`` and friends)."""
    version = body.get("weight_version")
    if version is not None and not isinstance(version, str):
        raise SimRequestError("weight_version: Input should be a valid string")
    flush = body.get("flush_cache", True)
    if not isinstance(flush, bool) or not isinstance(body.get("abort_all_requests", False), bool):
        raise SimRequestError("flush_cache / abort_all_requests: Input should be a valid boolean")
    return version, flush


async def run_update(srv: SimServer, body: dict[str, Any], version: str | None, flush: bool,
                     load: Callable[[], str | None], extra: dict[str, Any]) -> web.Response:
    """A weight update as SGLang's tokenizer manager runs it: requests aborted first when
    asked; without a pause, the requests in flight finish first (its writer lock); then
    ``load()`` (None, or why the weights could not be loaded) and the new version and flush.
    Answers ``{"success", "message", **extra}``, 400 when ``success`` is false."""
    w = srv.worker
    if w.updating:
        return error_response("a weight update is already in progress", 400)
    w.updating = True
    srv.refresh_gate()
    try:
        if body.get("abort_all_requests"):
            w.abort_all(srv.clock.now())
            srv.kick()
        if w.paused is None:  # SGLang's writer lock: the requests in flight finish first
            await srv.settle(lambda: not control.has_requests(w), SETTLE_SECONDS)
        failed = load()
        if failed is not None:
            return json_response({"success": False, "message": failed, **extra}, 400)
        delay = getattr(srv.clock, "real_delay", None)
        if delay is not None and w.cfg.control.weight_update_seconds > 0:
            await asyncio.sleep(delay(w.cfg.control.weight_update_seconds))
        srv.sync()
        ok, message = control.update_weights(w, version, flush)
        return json_response({"success": ok, "message": message, **extra}, 200 if ok else 400)
    finally:
        w.updating = False
        srv.refresh_gate()
        srv.kick()


async def release_memory_occupation(request: web.Request) -> web.Response:
    return await _memory(request, control.release)


async def resume_memory_occupation(request: web.Request) -> web.Response:
    return await _memory(request, control.resume)


async def _memory(request: web.Request, op: Any) -> web.Response:
    srv = request.app[SIM]
    try:
        tags = _tags(await _object(request))
    except SimRequestError as e:
        return error_response(str(e), 400)
    srv.sync()
    err = op(srv.worker, tags)
    srv.refresh_gate()
    srv.kick()
    if err is not None:
        return error_response(err, 400)
    return json_response(None)


def add_control_routes(r: web.UrlDispatcher) -> None:
    r.add_post("/pause_generation", pause_generation)
    r.add_post("/continue_generation", continue_generation)
    r.add_post("/update_weights_from_disk", update_weights_from_disk)
    r.add_post("/update_weight_version", update_weight_version)
    from thunder_sgl.sim.routes_weights import add_weight_routes

    add_weight_routes(r)
    for path, handler in (("/release_memory_occupation", release_memory_occupation),
                          ("/resume_memory_occupation", resume_memory_occupation)):
        r.add_get(path, handler)
        r.add_post(path, handler)
