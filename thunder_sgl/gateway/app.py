"""``create_app``: builds the object graph of one thunder router and its ASGI app.

No singletons: everything hangs off the ``Gateway`` made here and is handed down to the route
modules. Errors of every kind leave as OpenAI-shaped JSON with the right status.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from thunder_sgl import __version__
from thunder_sgl.config import RouterConfig
from thunder_sgl.errors import BadRequest, ThunderError, openai_error_body
from thunder_sgl.gateway.engine_control import EngineControl
from thunder_sgl.gateway.http import BodyLimit, error_response
from thunder_sgl.gateway.routes_admin import build_admin_router
from thunder_sgl.gateway.routes_engine import build_engine_router
from thunder_sgl.gateway.routes_groups import build_groups_router
from thunder_sgl.gateway.routes_openai import FastPath, InferenceHandler, build_inference_router
from thunder_sgl.gateway.routes_programs import build_programs_router
from thunder_sgl.gateway.runtime import Gateway
from thunder_sgl.gateway.tools import attach_sandboxes

log = logging.getLogger("thunder_sgl.gateway")

STATUS_TYPES = {404: "not_found_error", 405: "invalid_request_error", 401: "authentication_error"}


def create_app(config: RouterConfig) -> FastPath:
    gw = Gateway(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gw.start()
        try:
            yield
        finally:
            await gw.stop()

    app = FastAPI(title="thunder_sgl router", version=__version__, lifespan=lifespan,
                  description="Program-aware router for agentic inference on SGLang (policy: thunder).")
    app.state.gateway = gw

    @app.exception_handler(ThunderError)
    async def thunder_error(request: Request, err: ThunderError) -> JSONResponse:
        if err.status >= 500:
            log.warning("%s %s -> %d: %s", request.method, request.url.path, err.status, err.message)
        return error_response(err)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {}
        loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        return error_response(BadRequest(f"invalid request: {loc}: {first.get('msg', 'bad input')}", param=loc or None))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        msg = err.detail if isinstance(err.detail, str) else str(err.detail)
        if err.status_code == 404:
            msg = f"no route {request.method} {request.url.path}"
        body = openai_error_body(msg, STATUS_TYPES.get(err.status_code, "invalid_request_error"), err.status_code)
        return JSONResponse(body, status_code=err.status_code)

    handler = InferenceHandler(gw)
    app.include_router(build_inference_router(handler))
    app.include_router(build_programs_router(gw))
    app.include_router(build_groups_router(gw))
    engines = EngineControl(gw)
    app.include_router(build_admin_router(gw, engines))
    app.include_router(build_engine_router(gw, engines))
    attach_sandboxes(app, gw)
    app.add_middleware(BodyLimit, limit=gw.cfg.gateway.max_body_bytes)
    return FastPath(app, handler)
