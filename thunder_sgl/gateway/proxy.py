"""Forwarding one inference request to its worker: non-stream and stream, usage, aborts.

``Proxy`` (one per gateway) holds what forwarding needs; one request's state on its way out
and back is an ``Exchange``.

- The body is re-serialised without ``program_id``, with the ``rid`` the route gave it (the
  key of SGLang's ``/abort_request``) and the ``session_id`` its ticket was stamped with at
  dispatch (``kvrefs``); ``X-SMG-Routing-Key`` carries the program id,
  ``X-Data-Parallel-Rank`` the backend's DP rank. For OpenAI streams the worker is always
  asked for the usage chunk; the client gets it only if it asked (``usage.SSETap``).
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
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson
from prometheus_client import Counter
from starlette.responses import Response

from thunder_sgl.backends.backend import Backend
from thunder_sgl.config import GatewayConfig
from thunder_sgl.control.conversations import CONTEXT_OVERFLOW, answer_of, context_overflow
from thunder_sgl.control.tickets import Ticket
from thunder_sgl.errors import ThunderError, UpstreamError
from thunder_sgl.gateway.inbound import PATHS, Inbound
from thunder_sgl.gateway.sse import Last, SSEResponse
from thunder_sgl.gateway.upstream import Pool, UpstreamBodyError, UpstreamConnectError
from thunder_sgl.gateway.upstream import Response as UpstreamResponse
from thunder_sgl.gateway.usage import (
    SSETap,
    usage_from_body,
    usage_from_generate,
    usage_from_openai,
)
from thunder_sgl.programs import Usage

log = logging.getLogger("thunder_sgl.proxy")

CONNECT_ERRORS = (UpstreamConnectError, TimeoutError, OSError)
READ_ERRORS = (UpstreamBodyError, TimeoutError)
WATCH_AFTER_S = 0.05
"""How long a non-stream request runs before a task watches for its client leaving."""
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
ABORT_TIMEOUT_S = 5.0

Disconnected = Callable[[], Awaitable[Any]]
"""Returns when the client has gone away (``http.wait_disconnect``)."""


class Runtime(Protocol):
    """What the proxy asks of the gateway's runtime (``Gateway``) for a ticket it forwards."""

    async def acquire(self, t: Ticket, disconnected: Disconnected | None = None) -> Backend:
        """Dispatch ``t`` again (after a failover), waiting while it is held."""
        ...

    def failover(self, t: Ticket, reason: str) -> None:
        """``t``'s backend could not be reached before any byte: requeue its program."""
        ...

    def finish(self, t: Ticket, usage: Usage | None, answer: dict[str, Any] | None = None) -> None:
        """``t``'s request ended (usage None: failed or aborted); ``answer``: the assistant
        message relayed, for a ticket whose program was inferred."""
        ...

    def spawn(self, coro: Awaitable[Any], name: str) -> None:
        """Run a background task (an abort) whose failure is logged."""
        ...

    clock: Callable[[], float]
    """The runtime's clock (the one backends' pause times are read with)."""


@dataclass(slots=True)
class Exchange:
    """One request on its way to the worker and back: what opening, reading and relaying it share."""

    inbound: Inbound
    ticket: Ticket
    path: str
    payload: bytes
    """The body sent upstream; a stream retried before its first event gets a fresh rid in it."""
    headers: dict[str, str]
    rid: str
    """The rid of the attempt now with the worker (the one an abort names)."""
    disconnected: Disconnected
    strip_tiers: bool = False
    """The router asked the worker for the per-tier cached tokens (a HiCache worker) and the
    client did not: SGLang's ``sglext`` is read for the program table, not passed on."""


class Proxy:
    """Forwards inference requests to their ticket's backend over the lean client
    (``upstream.Pool``). Holds what it needs: the pool, the limits and the upstream key of
    ``gateway`` config, the upstream error counter, the aiohttp session of the aborts, and
    the runtime's ticket calls (``Runtime``)."""

    def __init__(self, runtime: Runtime, pool: Pool, cfg: GatewayConfig, auth: dict[str, str],
                 upstream_errors: Counter, session: Callable[[], aiohttp.ClientSession | None]) -> None:
        self.acquire = runtime.acquire
        self.failover = runtime.failover
        self.finish = runtime.finish
        self.spawn = runtime.spawn
        self.clock = runtime.clock
        self.pool = pool
        self.timeout = cfg.upstream_timeout_seconds
        self.retries = cfg.retries_before_first_byte
        self.auth = auth
        self.headers = {"Content-Type": "application/json", **auth}
        self.errors = upstream_errors
        self._session = session

    async def forward(self, inbound: Inbound, t: Ticket, extra_headers: dict[str, str],
                      disconnected: Disconnected) -> Response:
        """Send the dispatched ticket's request and answer the client: whole, or as a stream."""
        x = self._exchange(inbound, t, extra_headers, disconnected)
        if not inbound.stream:
            return await self._complete(x, self._open(x, disconnected))
        resp = await self._open(x, disconnected)
        if resp.status == 200:
            return SSEResponse(self._relay(x, resp), SSE_HEADERS)
        return await self._complete(x, resp)

    def _exchange(self, inbound: Inbound, t: Ticket, extra_headers: dict[str, str],
                  disconnected: Disconnected) -> Exchange:
        rid = t.rid
        assert rid is not None, "the route gives every request its rid"
        body = dict(inbound.body)
        sid = t.session_id
        if sid is not None and "session_id" not in body and body.get("session_params") is None:
            body["session_id"] = sid  # the engine keeps this program's KV referenced (kvrefs)
        if inbound.stream and inbound.route != "generate":
            opts = dict(body.get("stream_options") or {})
            opts["include_usage"] = True
            body["stream_options"] = opts
        strip = False
        if t.backend is not None and t.backend.tiers.host_tokens > 0 and "return_cached_tokens_details" not in body:
            body["return_cached_tokens_details"] = True  # per-tier hits for the program table
            strip = inbound.route != "generate"  # /generate's meta_info has the field anyway
        headers = {**self.headers, **extra_headers}
        if t.program_id:
            headers["X-SMG-Routing-Key"] = t.program_id
        return Exchange(inbound, t, PATHS[inbound.route], orjson.dumps(body), headers, rid, disconnected, strip)

    def _grace(self, b: Backend) -> Callable[[], float]:
        """What a request on ``b`` is granted when its upstream timeout runs out: the time the
        engine was paused behind the router since it was sent (or last granted), at least a
        second while it is still paused (``backends.pause``); 0 otherwise — it times out."""
        clock = self.clock
        mark = b.paused_seconds(clock())

        def grace() -> float:
            nonlocal mark
            now_paused = b.paused_seconds(clock())
            more, mark = now_paused - mark, now_paused
            return max(more, 1.0) if b.engine_paused else more

        return grace

    async def _open(self, x: Exchange, disconnected: Disconnected | None) -> UpstreamResponse:
        """POST to the ticket's backend; on a failure before the worker's status line, fail
        over and retry (held again meanwhile, ``disconnected`` watching the client)."""
        t = x.ticket
        attempts = self.retries + 1
        for attempt in range(attempts):
            b = t.backend
            assert b is not None
            try:
                return await self.pool.post(b.worker_url, x.path, x.payload, _rank_headers(x.headers, b), self.timeout,
                                            self._grace(b))
            except CONNECT_ERRORS as e:
                self.errors.labels("connect").inc()
                reason = f"{type(e).__name__}: {e}"
                self.failover(t, reason)
                if attempt + 1 == attempts:
                    raise UpstreamError(f"worker {b.worker_url} unreachable after {attempts} attempt(s): {reason}",
                                        code="upstream_unreachable") from None
                log.warning("retrying request of %s after %s", t.program_id or "stateless request", reason)
                await self.acquire(t, disconnected)
        raise AssertionError("unreachable")

    async def _complete(self, x: Exchange, opening: Awaitable[UpstreamResponse] | UpstreamResponse) -> Response:
        """A whole answer: ``opening`` (the POST, failovers included, or the response it already
        opened) and the read of the body run while one watcher task waits for the client to leave;
        then both are cancelled and the upstream request aborted. The watch is not tied to the
        answer's headers: a worker sends the headers of a non-stream answer with its body, as SGLang
        does, so a watch begun at the headers would miss a client that left during the generation. It starts ``WATCH_AFTER_S``
        after the request: most short answers are back by then, and a task per request was a
        tenth of the router's CPU on them; a client that leaves sooner is seen at that time."""
        t = x.ticket
        me = asyncio.current_task()
        gone: asyncio.Future[Any] | None = None

        def on_gone(f: asyncio.Future[Any]) -> None:
            if not f.cancelled() and me is not None:
                me.cancel()

        def watch() -> None:
            nonlocal gone
            gone = asyncio.ensure_future(x.disconnected())
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
                self.spawn(self.abort(t.backend, x.rid), f"abort {x.rid}")
                self.finish(t, None)
            raise
        except READ_ERRORS as e:
            self.errors.labels("read").inc()
            self.finish(t, None)
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
            if t.inferred and context_overflow(status, data):
                t.end_hint = CONTEXT_OVERFLOW  # its agent most likely stops here (conversations rule 7)
            self.finish(t, None)
            if status >= 500:
                self.errors.labels(f"http_{status}").inc()
                raise UpstreamError(f"worker answered {status}: {data[:500].decode(errors='replace')}", code=f"upstream_{status}")
            return Response(openai_shaped(data, status), status_code=status, media_type="application/json")
        if t.conversation_id is None and not x.strip_tiers:
            self.finish(t, usage_from_body(x.inbound.route, data))
        else:  # a tracked conversation (its answer extends it, ``conversations``), or sglext to strip
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                obj = None
            usage = usage_from_generate(obj) if x.inbound.route == "generate" else usage_from_openai(obj)
            if x.strip_tiers and isinstance(obj, dict) and obj.pop("sglext", None) is not None:
                data = orjson.dumps(obj)
            self.finish(t, usage, answer_of(x.inbound.route, obj) if t.conversation_id is not None else None)
        return Response(data, status_code=200, media_type=resp.content_type)

    async def _relay(self, x: Exchange, resp: UpstreamResponse) -> AsyncIterator[bytes]:
        """Pass the worker's SSE through the tap. A stream that breaks after an event reached the
        client ends with an SSE error event. One that breaks before is retried on the same worker
        at once, under a fresh rid (the broken request may still be in the engine's table; it is
        aborted): the worker did answer, so it is reachable, and marking it unhealthy would hold
        every request to it until its next good poll. A retry that cannot connect fails over
        (``_open``)."""
        t, inbound = x.ticket, x.inbound
        collect = t.conversation_id is not None
        tap = SSETap(inbound.route, inbound.include_usage, collect, x.strip_tiers)
        sent = False
        ok = False
        live = True  # the worker may still be generating the current attempt: abort it if we stop
        first_rid = x.rid
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
                    self.errors.labels("stream").inc()
                    resp.close()
                    if tap.done:  # broken after [DONE]: the answer is whole
                        ok = True
                        yield Last(held + tap.flush())
                        break
                    reason = f"{type(e).__name__}: {e}"
                    if sent or attempt > self.retries:
                        yield Last(held + _sse_error({"error": {"message": f"worker failed mid-stream: {reason}",
                                                                "type": "upstream_error", "code": 502, "param": None}}))
                        break
                log.warning("retrying the stream of %s: the worker broke it before its first event (%s)",
                            t.program_id or "a stateless request", reason)
                self.spawn(self.abort(t.backend, x.rid), f"abort {x.rid}")
                live = False
                x.rid = f"{first_rid}-retry{attempt}"
                x.payload = _with_rid(x.payload, x.rid)
                tap = SSETap(inbound.route, inbound.include_usage, collect, x.strip_tiers)  # forget a partial event of the broken stream
                try:
                    resp = await self._open(x, None)
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
                self.spawn(self.abort(t.backend, x.rid), f"abort {x.rid}")
            else:
                resp.release()
            if t.backend is not None:
                self.finish(t, tap.usage if ok else None, tap.answer.message() if ok and tap.answer else None)

    async def abort(self, b: Backend | None, rid: str) -> None:
        """Ask ``b``'s worker to stop generating ``rid`` (the client is gone, or the stream broke).
        The backend is passed at the call: a retry may move the ticket before this task runs."""
        session = self._session()
        if b is None or session is None:
            return
        try:
            async with session.post(b.worker_url + "/abort_request", json={"rid": rid}, headers=self.auth,
                                    timeout=aiohttp.ClientTimeout(total=ABORT_TIMEOUT_S)) as r:
                await r.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            log.info("abort of %s on %s failed: %s", rid, b.worker_url, e)


def _rank_headers(headers: dict[str, str], b: Backend) -> dict[str, str]:
    if b.dp_size > 1:
        return {**headers, "X-Data-Parallel-Rank": str(b.dp_rank)}
    return headers


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
