"""HTTP front end of a simulated worker (aiohttp), with SGLang 0.5.23's routes.

``create_app(worker, clock)`` builds the application. One asyncio task per worker drives the
engines: it advances them to ``clock.now()``, answers the requests that finished by then, pushes
new tokens to open streams, and sleeps (in real time) until the next engine event, or until a
new request wakes it. With a ``ScaledClock`` the virtual clock runs ``time_scale`` × real time; a
clock without ``real_delay`` (a ``ManualClock``) is advanced by its owner, who calls
``app[SIM].kick()`` after moving it.

aiohttp sets TCP_NODELAY on every accepted socket (``BaseProtocol.connection_made``), so streams
on keep-alive connections do not stall on Nagle's algorithm.

Engine control for RL (pause, continue, weight updates, memory release) is in
``routes_control`` over ``control``; while generation is paused, weights load or memory is
released, new requests wait at the front end (``admitted``), as SGLang's tokenizer manager
holds them.

Admin additions of the simulator: ``GET/POST /sim/faults`` (fault knobs, answered even while
``stop_answering`` or starting) and ``GET /sim/state`` (engine snapshots as JSON).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from array import array
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from thunder_sgl.sim import protocol as P
from thunder_sgl.sim.clock import ScaledClock, VirtualClock
from thunder_sgl.sim.config import SimConfig
from thunder_sgl.sim.request import Completion, SimRequest
from thunder_sgl.sim.worker import SimWorker

log = logging.getLogger("thunder_sgl.sim")
INFERENCE_PATHS = frozenset({"/generate", "/v1/chat/completions", "/v1/completions"})


class Pending:
    """A request in flight: its answer, its completion, and the tokens a stream has been told
    about.

    ``answer`` is taken at submission, while the request is certainly in the engine's table:
    by the time a stream handler runs, its request may have finished inside another request's
    submit or abort (which step the engine) and left the table, its completion not handed out
    yet. Every output id a stream can ever send is in ``answer``.
    """

    __slots__ = ("rid", "stream", "answer", "event", "visible", "_waiter")

    def __init__(self, rid: str, stream: bool, answer: array) -> None:
        self.rid = rid
        self.stream = stream
        self.answer = answer
        self.event: Completion | None = None
        self.visible = 0
        self._waiter: asyncio.Future[None] | None = None

    def poke(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self) -> None:
        """Until something changed (new tokens or completion)."""
        if self.event is not None:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


class SimServer:
    """The driving loop of one worker and its requests in flight."""

    def __init__(self, worker: SimWorker, clock: VirtualClock) -> None:
        self.worker = worker
        self.clock = clock
        self.pending: dict[str, Pending] = {}
        self.streams: dict[str, Pending] = {}
        self.poll_s = worker.cfg.http.stream_poll_ms / 1000.0
        self._wake: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._accepting = asyncio.Event()
        self._accepting.set()
        self.client_disconnects = 0
        """Requests whose client left before their answer ended (``sim:client_disconnects_total``)."""

    def refresh_gate(self) -> None:
        """Open or close the front door after an engine control call (``sim.control``)."""
        if self.worker.accepting:
            self._accepting.set()
        else:
            self._accepting.clear()

    async def admitted(self) -> None:
        """Returns when new requests may enter the engines."""
        while not self.worker.accepting:
            self.refresh_gate()
            await self._accepting.wait()

    async def settle(self, done: Callable[[], bool], timeout: float) -> bool:
        """Drive the engines until ``done()`` (True) or ``timeout`` real seconds (False)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            self.sync()
            if done():
                return True
            if loop.time() >= deadline:
                return False
            self.kick()
            await asyncio.sleep(self.poll_s)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"sim-worker-{self.worker.worker_id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def kick(self) -> None:
        w = self._wake
        if w is not None and not w.done():
            w.set_result(None)

    def submit(self, req: SimRequest, stream: bool) -> Pending:
        self.worker.submit(req, self.clock.now())
        answer = self.worker.output_ids(req.rid)
        assert answer is not None  # just queued: nothing stepped the engine since
        p = Pending(req.rid, stream, answer)
        self.pending[req.rid] = p
        if stream:
            self.streams[req.rid] = p
        self.kick()
        return p

    def abort(self, rid: str) -> None:
        if self.worker.abort(rid, self.clock.now()):
            self.kick()

    def client_left(self, rid: str) -> None:
        """The client of ``rid`` went away before its answer ended: ordinary traffic (an agent
        cancelled, a router gave up), not a server error. The request is aborted, as SGLang does,
        so its KV is released, and counted."""
        self.client_disconnects += 1
        log.debug("client left before the end of %s: aborted", rid)
        self.abort(rid)

    def sync(self) -> None:
        """Advance the engines to now and hand out what finished (reports call this first)."""
        for ev in self.worker.advance(self.clock.now()):
            p = self.pending.pop(ev.rid, None)
            if p is not None:
                self.streams.pop(ev.rid, None)
                p.event = ev
                p.poke()
        for p in self.streams.values():
            v = self.worker.visible_tokens(p.rid)
            if v is not None and v > p.visible:
                p.visible = v
                p.poke()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        real_delay: Callable[[float], float] | None = getattr(self.clock, "real_delay", None)
        while True:
            try:
                self.sync()
            except Exception:  # pragma: no cover - a bug must not silently stop the worker
                log.exception("simulated worker loop failed")
                raise
            delay: float | None = None
            nxt = self.worker.next_event_time()
            if nxt is not None and real_delay is not None:
                delay = real_delay(nxt - self.clock.now())
            if self.streams:
                delay = self.poll_s if delay is None else min(delay, self.poll_s)
            self._wake = loop.create_future()
            handle = loop.call_later(delay, self.kick) if delay is not None else None
            try:
                await self._wake
            finally:
                if handle is not None:
                    handle.cancel()


SIM = web.AppKey("sim", SimServer)


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def error_response(message: str, status: int, kind: str = "BadRequestError") -> web.Response:
    return json_response(P.error_body(message, status, kind), status)


@web.middleware
async def _gate(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Fault injection and start-up gating, in front of every route but /sim/*."""
    if request.path.startswith("/sim/"):
        return await handler(request)
    faults = request.app[SIM].worker.faults
    while faults.state.stop_answering:  # hold the request (health included) until the fault is cleared
        await asyncio.sleep(0.05)
    if faults.starting():
        return error_response("The server is starting up.", 503, "ServiceUnavailableError")
    if request.path in INFERENCE_PATHS:
        if faults.state.added_latency_ms > 0:
            await asyncio.sleep(faults.state.added_latency_ms / 1000.0)
        if faults.draw_failure():
            return error_response("Internal server error (injected by thunder_sgl.sim faults).", 500, "InternalServerError")
    return await handler(request)


def create_app(worker: SimWorker, clock: VirtualClock) -> web.Application:
    """The aiohttp application of one simulated worker; its loop runs while the app runs."""
    app = web.Application(client_max_size=1 << 30, middlewares=[_gate])
    srv = SimServer(worker, clock)
    app[SIM] = srv

    async def on_startup(_: web.Application) -> None:
        await srv.start()

    async def on_cleanup(_: web.Application) -> None:
        await srv.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    from thunder_sgl.sim.routes import add_routes

    add_routes(app)
    return app


@dataclass
class RunningWorker:
    """A worker served on a TCP port (in this process)."""

    worker: SimWorker
    app: web.Application
    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def server(self) -> SimServer:
        return self.app[SIM]


class _QuietH2Probe(logging.Filter):
    """Routers probe a worker's port for gRPC (HTTP/2 prior knowledge) before settling on HTTP;
    aiohttp answers 400 and logs a traceback per probe. Keep that out of the logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (exc is not None and "PRI/Upgrade" in str(exc))


_H2_FILTER = _QuietH2Probe()


async def serve(worker: SimWorker, clock: VirtualClock, host: str = "127.0.0.1", port: int = 0) -> RunningWorker:
    """Serve ``worker`` on ``host:port`` (0 picks a free port); stop it with ``runner.cleanup()``."""
    server_log = logging.getLogger("aiohttp.server")
    if _H2_FILTER not in server_log.filters:
        server_log.addFilter(_H2_FILTER)
    app = create_app(worker, clock)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    return RunningWorker(worker, app, runner, host, bound)


async def start_workers(
    cfg: SimConfig,
    n: int = 1,
    host: str = "127.0.0.1",
    base_port: int = 0,
    clock: VirtualClock | None = None,
    time_scale: float = 1.0,
) -> list[RunningWorker]:
    """Start ``n`` workers of ``cfg`` in this event loop, sharing one clock.

    Ports are ``base_port + i``, or free ports when ``base_port`` is 0.
    """
    clock = clock or ScaledClock(time_scale)
    out: list[RunningWorker] = []
    try:
        for i in range(n):
            out.append(await serve(SimWorker(cfg, i), clock, host, base_port + i if base_port else 0))
    except BaseException:
        await stop_workers(out)
        raise
    return out


async def stop_workers(workers: list[RunningWorker]) -> None:
    for w in workers:
        await w.runner.cleanup()


__all__ = [
    "SIM", "Pending", "RunningWorker", "SimServer", "create_app", "error_response", "json_response",
    "serve", "start_workers", "stop_workers",
]
