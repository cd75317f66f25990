"""Inference routes: ``/v1/chat/completions``, ``/v1/completions``, ``/generate``.

Each handler: read the body (size limit), parse and validate it (``inbound``), build the
request's ``Ticket``, have the runtime dispatch it (``Gateway.acquire``: waits while the
program is held), then forward it (``Proxy.forward``). Every request gets its engine request
id (``rid``) here, from the one generator (``InferenceHandler.new_rid``), so that
``/abort_request`` through the router finds it (``Gateway.rids``) while it is held or in flight.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import uuid
from functools import partial
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from thunder_sgl.control.tickets import Ticket
from thunder_sgl.errors import ThunderError
from thunder_sgl.gateway.aborted import RequestAborted, aborted_response
from thunder_sgl.gateway.http import check_key, error_response, read_body, wait_disconnect
from thunder_sgl.gateway.inbound import PATHS, parse_inbound
from thunder_sgl.gateway.runtime import Gateway

_MSG = {"type": "object", "properties": {"role": {"type": "string"}, "content": {"type": ["string", "null"]}},
        "required": ["role"]}
_COMMON: dict[str, Any] = {
    "model": {"type": "string"},
    "max_tokens": {"type": "integer", "minimum": 0},
    "stream": {"type": "boolean"},
    "program_id": {"type": "string", "description": "Agent program this request belongs to (or header X-Program-Id)."},
    "group_id": {"type": "string", "description": "Group (RL task) the program is a sample of (or header X-Group-Id)."},
}
SCHEMAS: dict[str, dict[str, Any]] = {
    "chat": {"type": "object", "required": ["messages"],
             "properties": {**_COMMON, "messages": {"type": "array", "minItems": 1, "items": _MSG}}},
    "completions": {"type": "object", "required": ["prompt"],
                    "properties": {**_COMMON, "prompt": {"type": "string"}}},
    "generate": {"type": "object", "required": ["text"],
                 "properties": {"text": {"type": "string"}, "stream": {"type": "boolean"},
                                "sampling_params": {"type": "object",
                                                    "properties": {"max_new_tokens": {"type": "integer", "minimum": 0}}},
                                "program_id": {"type": "string"}}},
}
log = logging.getLogger("thunder_sgl.gateway")


class InferenceHandler:
    """The one implementation of the three inference routes, used by the fast path and by
    the (documented) FastAPI routes alike."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.proxy = gw.proxy
        self._rid_prefix = f"thunder-{uuid.uuid4().hex[:12]}-r"
        self._rid_seq = itertools.count()
        self.forwarded = frozenset(h.lower() for h in gw.cfg.gateway.request_id_headers) | {"traceparent", "tracestate"}
        self.counters: dict[tuple[str, int], Any] = {}
        pattern = gw.controller.cfg.programs.group_id_pattern
        self.group_pattern = re.compile(pattern) if pattern else None

    async def __call__(self, request: Request, route: str) -> Response:
        gw = self.gw
        status = 500
        try:
            check_key(request, gw.cfg.gateway.api_key, "API key")
            raw = await read_body(request, gw.cfg.gateway.max_body_bytes)
            # ASGI header names are lower-case already; the scope's list is cheaper than Headers
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in request.scope["headers"]}
            inbound = parse_inbound(route, raw, headers, self.group_pattern)
            rid = inbound.body.get("rid")
            if not isinstance(rid, str) or not rid:
                rid = inbound.body["rid"] = self.new_rid()
            t = Ticket(inbound.program_id, prompt_chars=inbound.prompt_chars, prompt_tokens=inbound.prompt_tokens,
                       prefix_key=inbound.prefix_key, prefix_chars=inbound.prefix_chars,
                       group_id=inbound.group_id, group_chars=inbound.group_chars, rid=rid,
                       max_output=inbound.max_output)
            if t.program_id is None:
                if route == "chat":
                    t.tools_offered = bool(inbound.body.get("tools"))
                    gw.infer(t, inbound.body["messages"])
                else:
                    gw.infer_prompt(inbound, t)
            disconnected = partial(wait_disconnect, request)
            resp: Response | None = None
            try:
                await gw.acquire(t, disconnected)
                extra = {k: v for k, v in headers.items() if k in self.forwarded}
                resp = await self.proxy.forward(inbound, t, extra, disconnected)
            except asyncio.CancelledError:
                status = 499  # client closed the request
                return Response(status_code=499)
            except RequestAborted:
                resp = aborted_response(route, inbound.stream, inbound.include_usage, rid, inbound.body.get("model"))
            finally:
                if not isinstance(resp, StreamingResponse):
                    gw.untrack(t)  # a stream's relay finishes the ticket (Gateway.finish) when it ends
            status = resp.status_code
            return resp
        except Exception as e:
            status = getattr(e, "status", 500)
            raise
        finally:
            self._count(route, status)

    def new_rid(self) -> str:
        """A request id unique to this router process (cheaper than uuid4 per request)."""
        return f"{self._rid_prefix}{next(self._rid_seq)}"

    def _count(self, route: str, status: int) -> None:
        c = self.counters.get((route, status))
        if c is None:
            c = self.counters[(route, status)] = self.gw.metrics.requests.labels(route, str(status))
        c.inc()


class FastPath:
    """ASGI front: the three inference routes go straight to ``InferenceHandler``, skipping
    FastAPI's routing, dependency and middleware layers (they cost more CPU per request than
    the proxying itself); everything else goes to the FastAPI app. Errors leave in the same
    OpenAI shape as through FastAPI."""

    def __init__(self, app: Any, handler: InferenceHandler) -> None:
        self.app = app
        self.handler = handler
        self.routes = {path: route for route, path in PATHS.items()}

    def __getattr__(self, name: str) -> Any:  # state, openapi(), routes ... of the FastAPI app
        return getattr(self.app, name)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            route = self.routes.get(scope["path"])
            if route is not None:
                request = Request(scope, receive)
                try:
                    resp = await self.handler(request, route)
                except ThunderError as e:
                    resp = error_response(e)
                except Exception:
                    log.exception("inference request failed")
                    resp = error_response(ThunderError("internal error while routing the request"))
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_inference_router(handler: InferenceHandler) -> APIRouter:
    router = APIRouter(tags=["inference"])

    def make(route: str):  # noqa: ANN202 - FastAPI endpoint
        async def endpoint(request: Request) -> Response:
            return await handler(request, route)

        endpoint.__name__ = f"{route}_handler"
        return endpoint

    for route, path in PATHS.items():
        router.add_api_route(
            path, make(route), methods=["POST"], name=route,
            openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": SCHEMAS[route]}}}},
        )
    return router
