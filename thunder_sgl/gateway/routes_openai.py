"""Inference routes: ``/v1/chat/completions``, ``/v1/completions``, ``/generate``.

Each handler: read the body (size limit), parse and validate it (``inbound``), submit a
``Ticket`` to the controller and wait while the program is held, then forward (``proxy``).
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from thunder_sgl.controller import Ticket
from thunder_sgl.gateway import proxy
from thunder_sgl.gateway.http import check_key, read_body, wait_disconnect
from thunder_sgl.gateway.inbound import parse_inbound
from thunder_sgl.gateway.runtime import Gateway

_MSG = {"type": "object", "properties": {"role": {"type": "string"}, "content": {"type": ["string", "null"]}},
        "required": ["role"]}
_COMMON: dict[str, Any] = {
    "model": {"type": "string"},
    "max_tokens": {"type": "integer", "minimum": 0},
    "stream": {"type": "boolean"},
    "program_id": {"type": "string", "description": "Agent program this request belongs to (or header X-Program-Id)."},
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
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "generate": "/generate"}


def build_inference_router(gw: Gateway) -> APIRouter:
    router = APIRouter(tags=["inference"])
    forwarded = tuple(h.lower() for h in gw.settings.request_id_headers) + ("traceparent", "tracestate")

    def make(route: str):  # noqa: ANN202 - FastAPI endpoint
        async def handler(request: Request) -> Response:
            check_key(request, gw.settings.api_key, "API key")
            status = 500
            try:
                raw = await read_body(request, gw.max_body)
                headers = {k.lower(): v for k, v in request.headers.items()}
                inbound = parse_inbound(route, raw, headers)
                t = Ticket(inbound.program_id, inbound.prompt_chars, inbound.prompt_tokens,
                           inbound.prefix_key, inbound.prefix_chars)
                disconnected = partial(wait_disconnect, request)
                try:
                    await gw.acquire(t, disconnected)
                    extra = {k: v for k, v in headers.items() if k in forwarded}
                    resp = await proxy.forward(gw, inbound, t, extra, disconnected)
                except asyncio.CancelledError:
                    status = 499  # client closed the request
                    return Response(status_code=499)
                status = resp.status_code
                return resp
            except Exception as e:
                status = getattr(e, "status", 500)
                raise
            finally:
                gw.metrics.requests.labels(route, str(status)).inc()

        handler.__name__ = f"{route}_handler"
        return handler

    for route, path in PATHS.items():
        router.add_api_route(
            path, make(route), methods=["POST"], name=route,
            openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": SCHEMAS[route]}}}},
        )
    return router
