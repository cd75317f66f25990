"""Forwarding one inference request to its worker: non-stream and stream, usage, aborts.

- The body is re-serialised without ``program_id``; ``rid`` is set (the key of SGLang's
  ``/abort_request``), ``X-SMG-Routing-Key`` carries the program id, ``X-Data-Parallel-Rank``
  the backend's DP rank. For OpenAI streams the worker is always asked for the usage chunk;
  the client gets it only if it asked (``usage.SSETap``).
- A connection failure before any byte marks the worker unhealthy, requeues the program and
  retries transparently on the backend the scheduler picks next (also for streams, as long as
  no event was sent). A failure after bytes were sent ends a stream with an SSE error event.
- A client that goes away aborts the upstream request; in every case the program's request
  is finished (usage or None), so no program stays REASONING.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from starlette.responses import Response, StreamingResponse

from thunder_sgl.controller import Ticket
from thunder_sgl.errors import UpstreamError
from thunder_sgl.gateway.inbound import Inbound
from thunder_sgl.gateway.runtime import Gateway
from thunder_sgl.gateway.usage import SSETap, usage_from_body

log = logging.getLogger("thunder_sgl.proxy")

CONNECT_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientOSError, asyncio.TimeoutError, OSError)
UPSTREAM_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "generate": "/generate"}
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


_RID_PREFIX = uuid.uuid4().hex[:12]
_rid_seq = itertools.count()


def upstream_request(gw: Gateway, inbound: Inbound, t: Ticket, extra_headers: dict[str, str]) -> tuple[bytes, dict[str, str], str]:
    body = dict(inbound.body)
    rid = body.get("rid")
    if not isinstance(rid, str) or not rid:
        rid = f"thunder-{_RID_PREFIX}-{next(_rid_seq)}"  # unique per router process; cheaper than uuid4
        body["rid"] = rid
    sid = gw.controller.session_for(t)
    if sid is not None and "session_id" not in body and body.get("session_params") is None:
        body["session_id"] = sid  # the engine keeps this program's KV referenced (kvrefs)
    if inbound.stream and inbound.route != "generate":
        opts = dict(body.get("stream_options") or {})
        opts["include_usage"] = True
        body["stream_options"] = opts
    headers = {"Content-Type": "application/json", **gw.upstream_auth(), **extra_headers}
    if t.program_id:
        headers["X-SMG-Routing-Key"] = t.program_id
    return orjson.dumps(body), headers, rid


def _rank_headers(headers: dict[str, str], t: Ticket) -> dict[str, str]:
    b = t.backend
    if b is not None and b.dp_size > 1:
        return {**headers, "X-Data-Parallel-Rank": str(b.dp_rank)}
    return headers


async def forward(
    gw: Gateway,
    inbound: Inbound,
    t: Ticket,
    extra_headers: dict[str, str],
    disconnected: Callable[[], Awaitable[Any]],
) -> Response:
    payload, headers, rid = upstream_request(gw, inbound, t, extra_headers)
    path = UPSTREAM_PATHS[inbound.route]
    timeout = aiohttp.ClientTimeout(total=gw.cfg.gateway.upstream_timeout_seconds, sock_connect=5)
    # Watch for the client leaving from the moment the request goes upstream: a real SGLang
    # server sends the headers of a non-stream answer only when it is complete, so the wait for
    # them is the whole generation. Then cancel, close upstream and abort the rid. One watcher
    # task per request (a stream's relay watches through Starlette once it is returned).
    me = asyncio.current_task()
    gone = asyncio.ensure_future(disconnected())

    def on_gone(f: asyncio.Future[Any]) -> None:
        if not f.cancelled() and me is not None:
            me.cancel()

    gone.add_done_callback(on_gone)
    resp: aiohttp.ClientResponse | None = None
    try:
        resp = await _open(gw, t, path, payload, headers, timeout, disconnected)
        if inbound.stream and resp.status == 200:
            return StreamingResponse(
                _relay(gw, inbound, t, resp, path, payload, headers, timeout, rid),
                media_type="text/event-stream", headers=SSE_HEADERS,
            )
        return await _complete(gw, inbound, t, resp)
    except asyncio.CancelledError:
        if gone.done() and not gone.cancelled():
            if me is not None:
                me.uncancel()
            if resp is not None:
                resp.close()
            gw.spawn(abort(gw, t, rid), f"abort {rid}")
            if t.backend is not None:
                gw.finish(t, None)
        raise
    finally:
        gone.remove_done_callback(on_gone)
        gone.cancel()


async def _open(gw: Gateway, t: Ticket, path: str, payload: bytes, headers: dict[str, str],
                timeout: aiohttp.ClientTimeout, disconnected: Callable[[], Awaitable[Any]] | None) -> aiohttp.ClientResponse:
    """POST to the ticket's backend; on a connection failure, fail over and retry."""
    assert gw.session is not None
    attempts = gw.cfg.gateway.retries_before_first_byte + 1
    for attempt in range(attempts):
        b = t.backend
        assert b is not None
        try:
            return await gw.session.post(b.worker_url + path, data=payload, headers=_rank_headers(headers, t), timeout=timeout)
        except CONNECT_ERRORS as e:
            gw.metrics.upstream_errors.labels("connect").inc()
            reason = f"{type(e).__name__}: {e}"
            gw.failover(t, reason)
            if attempt + 1 == attempts:
                raise UpstreamError(f"worker {b.worker_url} unreachable after {attempts} attempt(s): {reason}",
                                    code="upstream_unreachable") from None
            log.warning("retrying request of %s after %s", t.program_id or "stateless request", reason)
            await gw.acquire(t, disconnected)
    raise AssertionError("unreachable")


async def _complete(gw: Gateway, inbound: Inbound, t: Ticket, resp: aiohttp.ClientResponse) -> Response:
    try:
        data = await resp.read()
    except (TimeoutError, aiohttp.ClientError) as e:
        gw.metrics.upstream_errors.labels("read").inc()
        gw.finish(t, None)
        raise UpstreamError(f"worker failed while answering: {type(e).__name__}: {e}", code="upstream_failed") from None
    finally:
        resp.release()
    status = resp.status
    if status != 200:
        gw.finish(t, None)
        if status >= 500:
            gw.metrics.upstream_errors.labels(f"http_{status}").inc()
            raise UpstreamError(f"worker answered {status}: {data[:500].decode(errors='replace')}", code=f"upstream_{status}")
        return Response(openai_shaped(data, status), status_code=status, media_type="application/json")
    gw.finish(t, usage_from_body(inbound.route, data))
    return Response(data, status_code=200, media_type=resp.content_type or "application/json")


def openai_shaped(data: bytes, status: int) -> bytes:
    """A worker's 4xx body in OpenAI's error shape. SGLang answers ``{"object": "error",
    "message", "type", "param", "code"}`` (no ``error`` wrapper); plain text is wrapped too."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
        return data
    if isinstance(obj, dict) and "message" in obj:
        err = {"message": str(obj["message"]), "type": str(obj.get("type") or "invalid_request_error"),
               "param": obj.get("param"), "code": obj.get("code", status)}
    else:
        err = {"message": data[:1000].decode(errors="replace") or f"worker answered {status}",
               "type": "invalid_request_error", "param": None, "code": status}
    return orjson.dumps({"error": err})


async def _relay(gw: Gateway, inbound: Inbound, t: Ticket, resp: aiohttp.ClientResponse, path: str,
                 payload: bytes, headers: dict[str, str], timeout: aiohttp.ClientTimeout, rid: str) -> AsyncIterator[bytes]:
    tap = SSETap(inbound.route, inbound.include_usage)
    sent = False
    ok = False
    attempts_left = gw.cfg.gateway.retries_before_first_byte
    try:
        while True:
            try:
                async for chunk in resp.content.iter_any():
                    out = tap.feed(chunk)
                    if out:
                        sent = True
                        yield out
                tail = tap.flush()
                if tail:
                    yield tail
                ok = True
                break
            except (TimeoutError, aiohttp.ClientError) as e:
                gw.metrics.upstream_errors.labels("stream").inc()
                resp.close()
                if sent or attempts_left <= 0:
                    err = {"error": {"message": f"worker failed mid-stream: {type(e).__name__}: {e}",
                                     "type": "upstream_error", "code": 502, "param": None}}
                    yield b"data: " + orjson.dumps(err) + b"\n\n" + b"data: [DONE]\n\n"
                    break
                # Nothing reached the client yet: retry transparently elsewhere.
                attempts_left -= 1
                gw.failover(t, f"{type(e).__name__}: {e}")
                await gw.acquire(t)
                resp = await _open(gw, t, path, payload, headers, timeout, None)
                if resp.status != 200:
                    body = await resp.read()
                    yield b"data: " + body + b"\n\ndata: [DONE]\n\n"
                    break
    finally:
        if not ok and not tap.done:
            resp.close()
            gw.spawn(abort(gw, t, rid), f"abort {rid}")
        else:
            resp.release()
        if t.backend is not None:
            gw.finish(t, tap.usage if ok else None)


async def abort(gw: Gateway, t: Ticket, rid: str) -> None:
    """Ask the worker to stop generating ``rid`` (the client is gone)."""
    b = t.backend
    if b is None or gw.session is None:
        return
    try:
        async with gw.session.post(b.worker_url + "/abort_request", json={"rid": rid},
                                   headers=gw.upstream_auth(), timeout=aiohttp.ClientTimeout(total=5)) as r:
            await r.read()
    except (TimeoutError, aiohttp.ClientError, OSError) as e:
        log.info("abort of %s on %s failed: %s", rid, b.worker_url, e)
