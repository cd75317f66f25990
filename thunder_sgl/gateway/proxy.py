"""Forwarding one inference request to its worker: non-stream and stream, usage, aborts.

- The body is re-serialised without ``program_id``; ``rid`` is set (the key of SGLang's
  ``/abort_request``), ``X-SMG-Routing-Key`` carries the program id, ``X-Data-Parallel-Rank``
  the backend's DP rank. For OpenAI streams the worker is always asked for the usage chunk;
  the client gets it only if it asked (``usage.SSETap``).
- A connection failure before any byte marks the worker unhealthy, requeues the program and
  retries transparently on the backend the scheduler picks next. A stream the worker breaks
  after answering, before any event reached the client, is retried on the same worker under a
  fresh rid (``_relay``); once an event was sent, a failure ends the stream with an SSE error
  event.
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
from starlette.responses import Response

from thunder_sgl.backends.backend import Backend
from thunder_sgl.control.tickets import Ticket
from thunder_sgl.errors import ThunderError, UpstreamError
from thunder_sgl.gateway.inbound import Inbound
from thunder_sgl.gateway.runtime import Gateway
from thunder_sgl.gateway.sse import Last, SSEResponse
from thunder_sgl.gateway.upstream import Response as UpstreamResponse
from thunder_sgl.gateway.upstream import UpstreamBodyError, UpstreamConnectError
from thunder_sgl.gateway.usage import SSETap, usage_from_body

log = logging.getLogger("thunder_sgl.proxy")

CONNECT_ERRORS = (UpstreamConnectError, TimeoutError, OSError)
READ_ERRORS = (UpstreamBodyError, TimeoutError)
UPSTREAM_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "generate": "/generate"}
WATCH_AFTER_S = 0.05
"""How long a non-stream request runs before a task watches for its client leaving."""
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
    timeout = gw.cfg.gateway.upstream_timeout_seconds
    if not inbound.stream:
        return await _complete(gw, inbound, t, rid, disconnected, _open(gw, t, path, payload, headers, timeout, disconnected))
    resp = await _open(gw, t, path, payload, headers, timeout, disconnected)
    if resp.status == 200:
        return SSEResponse(_relay(gw, inbound, t, resp, path, payload, headers, timeout, rid), SSE_HEADERS)
    return await _complete(gw, inbound, t, rid, disconnected, resp)


async def _open(gw: Gateway, t: Ticket, path: str, payload: bytes, headers: dict[str, str],
                timeout: float | None, disconnected: Callable[[], Awaitable[Any]] | None) -> UpstreamResponse:
    """POST to the ticket's backend (``gw.upstream``, the lean client); on a failure before
    the worker's status line, fail over and retry."""
    attempts = gw.cfg.gateway.retries_before_first_byte + 1
    for attempt in range(attempts):
        b = t.backend
        assert b is not None
        try:
            return await gw.upstream.post(b.worker_url, path, payload, _rank_headers(headers, t), timeout)
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


async def _complete(gw: Gateway, inbound: Inbound, t: Ticket, rid: str, disconnected: Callable[[], Awaitable[Any]],
                    opening: Awaitable[UpstreamResponse] | UpstreamResponse) -> Response:
    """A whole answer: ``opening`` (the POST, failovers included, or the response it already
    opened) and the read of the body run while one watcher task waits for the client to leave;
    then both are cancelled and the upstream request aborted. The watch is not tied to the
    answer's headers: a worker sends the headers of a non-stream answer with its body, as SGLang
    does, so a watch begun at the headers would miss a client that left during the generation. It starts ``WATCH_AFTER_S``
    after the request: most short answers are back by then, and a task per request was a
    tenth of the router's CPU on them; a client that leaves sooner is seen at that time."""
    me = asyncio.current_task()
    gone: asyncio.Future[Any] | None = None

    def on_gone(f: asyncio.Future[Any]) -> None:
        if not f.cancelled() and me is not None:
            me.cancel()

    def watch() -> None:
        nonlocal gone
        gone = asyncio.ensure_future(disconnected())
        gone.add_done_callback(on_gone)

    timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, watch)
    resp: UpstreamResponse | None = None
    try:
        resp = opening if isinstance(opening, UpstreamResponse) else await opening
        data = await resp.read()
    except asyncio.CancelledError:
        if gone is not None and gone.done() and not gone.cancelled():
            if me is not None:
                me.uncancel()
            if resp is not None:
                resp.close()
            gw.spawn(abort(gw, t.backend, rid), f"abort {rid}")
            gw.finish(t, None)
        raise
    except READ_ERRORS as e:
        gw.metrics.upstream_errors.labels("read").inc()
        gw.finish(t, None)
        raise UpstreamError(f"worker failed while answering: {type(e).__name__}: {e}", code="upstream_failed") from None
    finally:
        timer.cancel()
        if gone is not None:
            gone.remove_done_callback(on_gone)
            gone.cancel()
        if resp is not None:
            resp.release()
    status = resp.status
    if status != 200:
        gw.finish(t, None)
        if status >= 500:
            gw.metrics.upstream_errors.labels(f"http_{status}").inc()
            raise UpstreamError(f"worker answered {status}: {data[:500].decode(errors='replace')}", code=f"upstream_{status}")
        return Response(openai_shaped(data, status), status_code=status, media_type="application/json")
    gw.finish(t, usage_from_body(inbound.route, data))
    return Response(data, status_code=200, media_type=resp.content_type)


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


def _sse_error(err: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(err) + b"\n\ndata: [DONE]\n\n"


def _with_rid(payload: bytes, rid: str) -> bytes:
    return orjson.dumps({**orjson.loads(payload), "rid": rid})


async def _relay(gw: Gateway, inbound: Inbound, t: Ticket, resp: UpstreamResponse, path: str,
                 payload: bytes, headers: dict[str, str], timeout: float | None, rid: str) -> AsyncIterator[bytes]:
    """Pass the worker's SSE through the tap. A stream that breaks after an event reached the
    client ends with an SSE error event. One that breaks before is retried on the same worker
    at once, under a fresh rid (the broken request may still be in the engine's table; it is
    aborted): the worker did answer, so it is reachable, and marking it unhealthy would hold
    every request to it until its next good poll. A retry that cannot connect fails over
    (``_open``)."""
    tap = SSETap(inbound.route, inbound.include_usage)
    sent = False
    ok = False
    live = True  # the worker may still be generating the current attempt: abort it if we stop
    first_rid, retries = rid, gw.cfg.gateway.retries_before_first_byte
    try:
        for attempt in itertools.count(1):
            try:
                held = b""  # the chunk that holds [DONE] waits for the end of the body, to go out as Last
                async for chunk in resp.iter_any():
                    out = tap.feed(chunk)
                    if out:
                        sent = True
                        if tap.done:
                            held += out
                        else:
                            yield out
                ok = True
                yield Last(held + tap.flush())
                break
            except READ_ERRORS as e:
                gw.metrics.upstream_errors.labels("stream").inc()
                resp.close()
                if tap.done:  # broken after [DONE]: the answer is whole
                    ok = True
                    yield Last(held + tap.flush())
                    break
                reason = f"{type(e).__name__}: {e}"
                if sent or attempt > retries:
                    yield Last(held + _sse_error({"error": {"message": f"worker failed mid-stream: {reason}",
                                                            "type": "upstream_error", "code": 502, "param": None}}))
                    break
            log.warning("retrying the stream of %s: the worker broke it before its first event (%s)",
                        t.program_id or "a stateless request", reason)
            gw.spawn(abort(gw, t.backend, rid), f"abort {rid}")
            live = False
            rid = f"{first_rid}-retry{attempt}"
            payload = _with_rid(payload, rid)
            tap = SSETap(inbound.route, inbound.include_usage)  # forget a partial event of the broken stream
            try:
                resp = await _open(gw, t, path, payload, headers, timeout, None)
            except ThunderError as e:
                yield Last(_sse_error(e.body()))
                break
            if resp.status != 200:
                body = await resp.read()
                resp.release()
                yield Last(_sse_error(orjson.loads(openai_shaped(body, resp.status))))
                break
            live = True
    finally:
        if live and not ok and not tap.done:
            resp.close()
            gw.spawn(abort(gw, t.backend, rid), f"abort {rid}")
        else:
            resp.release()
        if t.backend is not None:
            gw.finish(t, tap.usage if ok else None)


async def abort(gw: Gateway, b: Backend | None, rid: str) -> None:
    """Ask ``b``'s worker to stop generating ``rid`` (the client is gone, or the stream broke).
    The backend is passed at the call: a retry may move the ticket before this task runs."""
    if b is None or gw.session is None:
        return
    try:
        async with gw.session.post(b.worker_url + "/abort_request", json={"rid": rid},
                                   headers=gw.upstream_auth(), timeout=aiohttp.ClientTimeout(total=5)) as r:
            await r.read()
    except (TimeoutError, aiohttp.ClientError, OSError) as e:
        log.info("abort of %s on %s failed: %s", rid, b.worker_url, e)
