"""Small HTTP helpers shared by the route modules: body reading with a limit, auth, errors."""

from __future__ import annotations

import hmac
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from thunder_sgl.errors import PayloadTooLarge, ThunderError, Unauthorized


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) anything larger than ``limit`` bytes."""
    cl = request.headers.get("content-length")
    if cl is not None and cl.isdigit() and int(cl) > limit:
        raise PayloadTooLarge(f"request body of {int(cl)} bytes exceeds the limit of {limit} bytes")
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


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
