"""The gateway's runtime: controller + monitor + scheduler loop + held-request waiting.

One ``Gateway`` per app (no module globals). It owns the inference path's connection pool to
the workers (``upstream``) and the ``Proxy`` that forwards over it, the aiohttp session of the
other calls to them, the
``Controller`` (programs, backends, policy), the ``Monitor`` and the scheduler loop task, which
runs the policy's tick every Δt and, sooner, when a held or new program needs it. Held requests
wait on futures that the loop resolves when their program is restored. ``rids`` indexes the
requests held or in flight by their engine request id, for ``/abort_request``; calls to the
workers outside the inference path go through ``workers`` (``WorkersClient``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import aiohttp

from thunder_sgl.backends.backend import Backend
from thunder_sgl.backends.monitor import Monitor, Worker
from thunder_sgl.config import RouterConfig
from thunder_sgl.control.controller import Controller
from thunder_sgl.control.conversations import (
    Conversations,
    Match,
    PromptHead,
    end_hint,
    prompt_bytes,
)
from thunder_sgl.control.tickets import Ticket, TickResult
from thunder_sgl.errors import NotFound, Overloaded, ThunderError
from thunder_sgl.gateway.aborted import RequestAborted
from thunder_sgl.gateway.inbound import Inbound
from thunder_sgl.gateway.metrics import GatewayMetrics
from thunder_sgl.gateway.proxy import Proxy
from thunder_sgl.gateway.upstream import Pool
from thunder_sgl.gateway.workers_client import WorkersClient
from thunder_sgl.programs import Program, Usage

if TYPE_CHECKING:
    from thunder_sgl.sandboxes import SandboxManager

UPSTREAM_KEEPALIVE_S = 4.0
"""Below SGLang's 5 s server keep-alive."""

log = logging.getLogger("thunder_sgl.gateway")


class Gateway:
    def __init__(self, config: RouterConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = config
        self.clock = clock
        self.controller = Controller(config, config.gateway.policy)
        self.metrics = GatewayMetrics(self)
        self.session: aiohttp.ClientSession | None = None  # health polls, engine control, aborts
        self.upstream = Pool(keepalive=UPSTREAM_KEEPALIVE_S)  # the inference requests (``upstream``)
        self.monitor: Monitor | None = None
        self.sandboxes: SandboxManager | None = None
        self.on_release: list[Callable[[Program], Awaitable[None]]] = []
        self.on_tick: list[Callable[[TickResult], None]] = []
        self.on_start: list[Callable[[], None]] = []
        self.on_stop: list[Callable[[], Awaitable[None]]] = []
        self._kick = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._bg: set[asyncio.Task[Any]] = set()
        self.started_at = time.time()
        self.workers = WorkersClient(lambda: self.session, self.upstream_auth(), config.windows.control_timeout_seconds)
        self.proxy = Proxy(self, self.upstream, config.gateway, self.upstream_auth(), self.metrics.upstream_errors,
                           lambda: self.session)
        self.rids: dict[str, Ticket] = {}
        pc = config.programs
        self.conversations = Conversations(pc.idle_timeout_seconds, pc.max_programs) if pc.infer_ids else None
        self._end_tools = frozenset(pc.inferred_end_tools)

    # ---- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        # Idle upstream connections are dropped before the worker drops them: SGLang's uvicorn
        # closes a keep-alive connection after 5 s idle (SGLANG_TIMEOUT_KEEP_ALIVE), and a POST
        # sent on a connection the worker is closing fails before any byte, which the proxy
        # takes for a dead worker (failover, worker marked unhealthy).
        conn = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=UPSTREAM_KEEPALIVE_S)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
        self.session = aiohttp.ClientSession(connector=conn, timeout=timeout, auto_decompress=False)
        self.monitor = Monitor(
            self.cfg.monitor, self.session, self._on_worker_ready, self._on_worker_removed,
            headers=self.upstream_auth(), clock=self.clock, on_health=self._on_worker_health,
            on_version=self._on_worker_version, on_pause=self._on_worker_pause,
            pause_limit=self.cfg.windows.max_window_seconds,
        )
        for url in self.cfg.gateway.worker_urls:
            self.monitor.add(url)
        self._loop_task = asyncio.get_running_loop().create_task(self._scheduler_loop(), name="thunder tick")
        for hook in self.on_start:
            hook()

    async def stop(self) -> None:
        for hook in self.on_stop:
            try:
                await hook()
            except Exception:
                log.exception("stop hook failed")
        if self._loop_task:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        for task in list(self._bg):
            task.cancel()
        if self.monitor:
            await self.monitor.close()
        # Answer every request still held: the router is going away.
        for t in self.controller.held_tickets():
            self.controller.cancel(t)
            self._fail(t, Overloaded("router shutting down", retry_after=self.cfg.gateway.retry_after_seconds))
        self.upstream.close()
        if self.session:
            await self.session.close()

    def spawn(self, coro: Awaitable[Any], name: str) -> None:
        """Run a background task whose failure is logged, never lost."""
        task = asyncio.ensure_future(coro)
        self._bg.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._bg.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("background task %s failed: %r", name, t.exception())

        task.add_done_callback(done)

    @property
    def admin_key(self) -> str | None:
        """Admin routes need this key: the admin key if set, else the API key (else open)."""
        return self.cfg.gateway.admin_api_key or self.cfg.gateway.api_key

    def upstream_auth(self) -> dict[str, str]:
        key = self.cfg.gateway.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    # ---- workers ------------------------------------------------------------------------
    def kick(self) -> None:
        """Wake the scheduler loop for a tick as soon as the controller allows."""
        self.controller.kick()
        self._kick.set()

    def _on_worker_ready(self, w: Worker) -> None:
        for b in w.backends:
            self.controller.add_backend(b)
        self.kick()

    def _on_worker_version(self, w: Worker, version: str) -> None:
        """The monitor read a worker's weight version: changed behind the router, its
        programs' KV accounting is reset and the queue refills them."""
        now = self.clock()
        requeued = [p for b in w.backends if b.key in self.controller.backends
                    for p in self.controller.weight_version_seen(self.controller.backends[b.key], version, now)]
        if requeued:
            self.kick()

    def _on_worker_pause(self, w: Worker) -> None:
        """The monitor found a worker paused behind the router, or continuing
        (``backends.pause``): while paused its programs' requests are held; when it continues
        they go out."""
        keys = [b.key for b in w.backends]
        now = self.clock()
        if w.pause.holding:
            self.controller.engine_paused(keys, now)
        else:
            self._dispatch(self.controller.engine_resumed(keys, now))
        self.kick()

    def _on_worker_health(self, w: Worker) -> None:
        # Without a tick now, requests held while the worker was down would wait for the
        # periodic one (up to tick_seconds, 5 s) after it is back.
        self.kick()

    def _on_worker_removed(self, w: Worker) -> None:
        for b in w.backends:
            b.draining = True
            self.controller.remove_backend(b.key)
        self.kick()

    def suspect(self, b: Backend, reason: str) -> None:
        if self.monitor:
            self.monitor.suspect(b, reason)
        self.kick()

    # ---- request path -------------------------------------------------------------------
    async def acquire(self, t: Ticket, disconnected: Callable[[], Awaitable[Any]] | None = None) -> Backend:
        """Index ``t`` by its rid (``rids``), submit it and, if held, wait until the scheduler
        dispatches it. Raises ThunderError (4xx/5xx) or asyncio.CancelledError when the client
        goes away while held; the caller then ``untrack``s it."""
        self.track(t)
        now = self.clock()
        b = self.controller.submit(t, now)
        if b is not None:
            return b
        loop = asyncio.get_running_loop()
        t.waiter = loop.create_future()
        self.kick()
        watcher = asyncio.ensure_future(disconnected()) if disconnected else None
        try:
            if watcher is None:
                return await t.waiter
            done, _ = await asyncio.wait({t.waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if t.waiter in done:
                return t.waiter.result()
            raise asyncio.CancelledError("client disconnected while held")
        except BaseException:
            self.controller.cancel(t)
            raise
        finally:
            if watcher is not None:
                watcher.cancel()

    def finish(self, t: Ticket, usage: Usage | None, answer: dict[str, Any] | None = None) -> None:
        """``t``'s request ended (usage None: failed or aborted); ``answer``: the assistant
        message relayed, for a request whose conversation is tracked (``conversations``)."""
        self.untrack(t)
        now = self.clock()
        if answer is not None and usage is not None and t.conversation_id is not None \
                and t.conversation is not None and self.conversations is not None:
            if isinstance(t.conversation, PromptHead):
                self.conversations.answered_prompt(t.conversation_id, t.conversation, answer, now)
            else:
                self.conversations.answered(t.conversation_id, t.conversation, answer, now)
            if t.inferred:
                pc = self.controller.cfg.programs
                t.end_hint = end_hint(answer, t.tools_offered, self._end_tools, pc.inferred_end_markers)
        self._dispatch(self.controller.finish(t, now, usage))

    def infer(self, t: Ticket, messages: list[Any]) -> None:
        """A chat request that names no program (``conversations``): the program whose
        conversation it continues, or a new one. It goes statelessly, unrecorded, when it
        continues several (ambiguous) or its program has a request out already (an unmodified
        client is never refused with 409); a new one goes statelessly but is recorded when the
        router cannot take another program (its next request may)."""
        if self.conversations is None:
            return
        m = self.conversations.match(messages, self.clock())
        self._inferred(t, m, m.head)

    def infer_prompt(self, inbound: Inbound, t: Ticket) -> None:
        """The same for a ``/v1/completions`` or ``/generate`` request that names no program,
        from its prompt (``conversations`` rule 6): one prompt, not streamed from /generate,
        not echoed, one choice; anything else goes statelessly. A prompt that continues no
        program goes statelessly too, its answer recorded: the program starts at the request
        that continues it. (Prompt routes carry one-shot traffic as often as agents: made
        programs, one-shot requests would wait for admission and hold places.)"""
        if self.conversations is None:
            return
        body = inbound.body
        if inbound.route == "completions":
            if body.get("echo") or body.get("n") not in (None, 1) or body.get("best_of") not in (None, 1):
                return
            prompt = prompt_bytes(body.get("prompt"))
        else:
            sp = body.get("sampling_params")
            if inbound.stream or (isinstance(sp, dict) and sp.get("n") not in (None, 1)):
                return
            prompt = prompt_bytes(body["text"] if body.get("text") is not None else body.get("input_ids"))
        if prompt is None:
            return
        m, head = self.conversations.match_prompt(prompt[0], prompt[1], self.clock())
        if m.kind == "new":  # recorded, sent statelessly: its program starts with its next step
            t.conversation, t.conversation_id = head, m.program_id
            return
        self._inferred(t, m, head)

    def _inferred(self, t: Ticket, m: Match, head: bytes | PromptHead) -> None:
        if m.program_id is None:
            return
        c = self.controller
        p = c.programs.get(m.program_id)
        if p is not None and (p.in_flight or p.held):
            self.conversations.recount(m.kind, "busy")  # type: ignore[union-attr]
            return
        t.conversation, t.conversation_id = head, m.program_id
        if p is None and not c.can_create():
            self.conversations.recount(m.kind, "overflow")  # type: ignore[union-attr]
            return
        t.program_id, t.inferred = m.program_id, True

    # ---- request ids (for /abort_request) ---------------------------------------------
    def track(self, t: Ticket) -> None:
        if t.rid is not None:
            self.rids[t.rid] = t

    def untrack(self, t: Ticket) -> None:
        if t.rid is not None and self.rids.get(t.rid) is t:
            del self.rids[t.rid]

    def abort_held(self, t: Ticket) -> bool:
        """Withdraw a held request; its client is answered as an aborted request. False when
        it is not held (dispatched meanwhile, or gone)."""
        if not self.controller.cancel(t):
            return False
        self.untrack(t)
        self._fail(t, RequestAborted("request aborted while held"))
        return True

    def failover(self, t: Ticket, reason: str) -> None:
        """The upstream could not be reached before any byte: mark it, requeue the program
        (``Controller.failover``), send what the freed room lets through."""
        if t.backend is not None:
            self.suspect(t.backend, reason)
        self._dispatch(self.controller.failover(t, self.clock()))
        self.send_closes()

    def release(self, pid: str) -> Program:
        """Release a program at its client's request (an inferred one is forgotten too: its
        conversation ended)."""
        p, held = self.controller.release(pid, self.clock())
        if self.conversations is not None:
            self.conversations.forget(pid)
        for t in held:
            self._fail(t, NotFound(f"program {pid!r} was released while this request waited", code="program_released"))
        self._after_release(p)
        self.kick()
        return p

    def _after_release(self, p: Program) -> None:
        for hook in self.on_release:
            self.spawn(hook(p), f"release hook {p.id}")
        self.send_closes()

    def send_closes(self) -> None:
        """Drop the KV references the controller let go of (``kvrefs``): ``POST
        /close_session`` to each worker, in the background (a failed close only leaves KV
        referenced until the engine needs the room: referenced KV is still evictable)."""
        for sid, key in self.controller.kvrefs.take_closes():
            b = self.controller.backends.get(key)
            if b is not None:
                self.spawn(self._close(b.worker_url, sid), f"close session {sid}")

    async def _close(self, url: str, sid: str) -> None:
        r = await self.workers.call(url, "POST", "/close_session", {"session_id": sid}, timeout=5)
        if not r.ok:
            log.info("close_session %s on %s: %s", sid, url, r.message)

    def _dispatch(self, tickets: list[Ticket]) -> None:
        for t in tickets:
            w = t.waiter
            if w is not None and not w.done():
                w.set_result(t.backend)
                self.metrics.observe_held(t)
            elif w is not None:
                # The client left between dispatch and now: give the slot back.
                self.controller.finish(t, self.clock(), None)

    def _fail(self, t: Ticket, err: ThunderError) -> None:
        w = t.waiter
        if w is not None and not w.done():
            w.set_exception(err)

    # ---- scheduler loop -----------------------------------------------------------------
    async def _scheduler_loop(self) -> None:
        while True:
            remaining = self.controller.next_tick_at() - self.clock()
            if remaining > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._kick.wait(), timeout=remaining)
                self._kick.clear()
                continue  # woken early: the due time may have moved (or not: wait the rest)
            try:
                self.run_tick(self.clock())
            except Exception:  # a bug in a tick must not stop scheduling
                log.exception("scheduler tick failed")

    def run_tick(self, now: float) -> TickResult:
        res = self.controller.tick(now)
        self._dispatch(res.dispatched)
        for t in res.expired:
            self._fail(t, Overloaded(
                f"request held {self.cfg.gateway.held_timeout_seconds:.0f}s waiting for its program to be scheduled; "
                "the program stays queued, retry later", code="held_timeout",
                retry_after=self.cfg.gateway.retry_after_seconds))
        for p in res.released:
            self._after_release(p)
        self.send_closes()
        if res.window_closed is not None:
            log.error("weight-update window %d closed by the router after %.0fs (windows.max_window_seconds): "
                      "held requests go to the engines as they are", res.window_closed.window.id,
                      res.window_closed.seconds)
        self.metrics.on_tick(res)
        for hook in self.on_tick:
            hook(res)
        return res
