"""Small HTTP helpers shared by the route modules: body reading with a limit, auth, errors."""

from __future__ import annotations

import hmac
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

from thunder_sgl.errors import PayloadTooLarge, ThunderError, Unauthorized


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) anything larger than ``limit`` bytes."""
    cl = request.headers.get("content-length")
    if cl is not None and cl.isdigit() and int(cl) > limit:
        raise PayloadTooLarge(f"request body of {int(cl)} bytes exceeds the limit of {limit} bytes")
    chunks, n = [], 0
    while True:  # the ASGI messages themselves: Request.stream() costs more than the proxying
        msg = await request.receive()
        if msg["type"] != "http.request":
            raise ClientDisconnect()
        chunk = msg.get("body", b"")
        n += len(chunk)
        if n > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
        if not msg.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def wait_disconnect(request: Request) -> None:
    """Returns when the client disconnects (call only after the body was read)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


def check_key(request: Request, key: str | None, what: str) -> None:
    """Require ``Authorization: Bearer <key>`` when ``key`` is set (constant-time compare)."""
    if not key:
        return
    auth = request.headers.get("authorization", "")
    scheme, _, given = auth.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
        raise Unauthorized(f"missing or invalid {what} (send 'Authorization: Bearer <key>')")


def error_response(err: ThunderError) -> JSONResponse:
    headers: dict[str, Any] = {}
    if err.retry_after is not None:
        headers["Retry-After"] = str(max(1, int(round(err.retry_after))))
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


class BodyLimit:
    """ASGI middleware: refuse (413, OpenAI-shaped) any request body over ``limit`` bytes, on
    every route, whether announced by Content-Length or streamed in chunks."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for k, v in scope.get("headers", ()):
            if k == b"content-length" and v.isdigit() and int(v) > self.limit:
                await self._refuse(send, f"request body of {int(v)} bytes exceeds the limit of {self.limit} bytes")
                return
        seen = 0
        limit = self.limit

        async def counted() -> Any:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
            return msg

        await self.app(scope, counted, send)

    @staticmethod
    async def _refuse(send: Any, message: str) -> None:
        resp = error_response(PayloadTooLarge(message))
        await send({"type": "http.response.start", "status": resp.status_code,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(resp.body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": resp.body})
