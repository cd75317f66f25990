"""The client side of a relayed stream: an ASGI response that sends the relay's SSE chunks.

Starlette's ``StreamingResponse`` opens an anyio task group per response to listen for the
client leaving (under uvicorn, which speaks ASGI 2.3); on 8-token streams that task group was
a fifth of the router's CPU (issue 15). Here one future waits on ``receive`` instead, as the
non-stream path does: when the client leaves it cancels the send loop, and closing the relay
runs its ``finally`` (upstream aborted, the program's request finished). The relay marks its
last chunk (``Last``) so that it leaves with the end of the chunked body in one write.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.responses import Response


class Last(bytes):
    """The stream's final chunk: sent together with the end of the body."""


class SSEResponse(Response):
    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncIterator[bytes], headers: Mapping[str, str] | None = None) -> None:
        self.chunks = chunks
        self.status_code = 200
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        me = asyncio.current_task()
        gone = asyncio.ensure_future(_disconnect(receive))

        def on_gone(f: asyncio.Future[None]) -> None:
            if not f.cancelled() and me is not None:
                me.cancel()

        gone.add_done_callback(on_gone)
        ended = False
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self.chunks:
                if isinstance(chunk, Last):
                    ended = True
                    # the server answers a pending receive with http.disconnect once the
                    # response is complete: stop watching first
                    gone.remove_done_callback(on_gone)
                await send({"type": "http.response.body", "body": bytes(chunk), "more_body": not ended})
                if ended:
                    break
            if not ended:
                gone.remove_done_callback(on_gone)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if me is not None and gone.done() and not gone.cancelled():
                me.uncancel()  # the client left; the relay's finally has run
                return
            raise
        finally:
            gone.remove_done_callback(on_gone)
            gone.cancel()
            await self.chunks.aclose()  # type: ignore[attr-defined]


async def _disconnect(receive: Any) -> None:
    """Returns when the client disconnects (the request body was read before)."""
    while (await receive())["type"] != "http.disconnect":
        pass
