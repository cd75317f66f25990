"""Routers as the DES drives them: thunder through its ``Controller``, the stock routers through
the re-implemented policies of ``baselines``.

One small interface: ``send`` (a request is issued: route it, or hold it), ``complete`` (a
request ended), ``release`` (a program ended), ``next_time`` / ``run_timers`` (ticks, load
polls, tree eviction), ``drain`` (the run is over). Each returns the requests to submit now as
``Dispatch(agent, worker index, dp_rank or None)``. Routing adds no latency in virtual time.

Workers are read through the same parsers as the real monitor: ``parse_server_info`` at
registration, ``parse_loads(/v1/loads?include=core,queues)`` and the HiCache host gauges
(``parse_prometheus`` + ``host_tier_by_rank`` over ``/metrics``) at every poll. ``read(i, now)``
brings worker i's reports up to ``now`` first.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

from thunder_sgl.backends.backend import Backend
from thunder_sgl.backends.parse import (
    TierReading,
    host_tier_by_rank,
    parse_loads,
    parse_prometheus,
    parse_server_info,
)
from thunder_sgl.benchmark.des.baselines import Policy, RouteRequest, text_key
from thunder_sgl.config import RouterConfig
from thunder_sgl.control.controller import Controller
from thunder_sgl.control.conversations import CONTEXT_OVERFLOW, SIGN
from thunder_sgl.control.tickets import Ticket, prefix_key_of
from thunder_sgl.errors import ThunderError
from thunder_sgl.programs import Usage
from thunder_sgl.sim import Completion, SimWorker

LOADS_INCLUDE = {"core", "queues"}
CHARS_PER_TOKEN = 4
"""Chat characters per token, to size tickets as the gateway sizes a chat request."""


class Dispatch(NamedTuple):
    agent: Any
    worker: int
    dp_rank: int | None
    session_id: str | None = None
    """``session_id`` the request carries (thunder's KV references, ``kvrefs``)."""


Reader = Callable[[int, float], SimWorker]


class Refused(Exception):
    """The router answered the request with an error (the agent retries after ``retry_after``)."""

    def __init__(self, kind: str, retry_after: float) -> None:
        super().__init__(kind)
        self.kind = kind
        self.retry_after = retry_after


class ThunderRouter:
    """The thunder policy: ``Controller`` + a monitor poll + the gateway's scheduler loop.

    The loop is the gateway's (``gateway.runtime._scheduler_loop``): a tick at
    ``Controller.next_tick_at()`` — ``tick_seconds`` after the previous one, or sooner when a
    request is held or a program released, but not before ``kick_min_interval_seconds``. Tickets are sized
    as the gateway sizes a chat request: characters (≈ 4 per token) and the system prompt's
    identity and length.
    """

    def __init__(self, workers: list[SimWorker], read: Reader, cfg: RouterConfig, policy: str,
                 system_text_tokens: int, prefix_identity: str, inferred: bool = False) -> None:
        self.cfg = cfg
        self.ctl = Controller(cfg, policy)
        self.inferred = inferred
        """``thunder-inferred``: the client sends no program id and never releases its program.
        A DES conversation extends its previous request and answer exactly and no two agents
        get the same answer, so inference (``control.conversations``) would find each agent's
        program at every step: the tickets carry it, marked inferred (the dormant pause and the
        tool-derived idle timeout apply), and the agent's end releases nothing."""
        self.read = read
        self.n = len(workers)
        self.where: dict[str, tuple[int, int]] = {}
        self.backends: list[list[Backend]] = []
        self.hicache = []
        for i, w in enumerate(workers):
            info = parse_server_info(w.server_info())
            bs = [Backend(f"sim://node{i}", r, info.tiers(), monitored=True, model_id=info.model_path,
                          session_refs=info.session_radix_cache, context_length=info.context_length)
                  for r in range(info.dp_size)]
            for b in bs:
                self.ctl.add_backend(b)
                self.where[b.key] = (i, b.dp_rank)
            self.backends.append(bs)
            self.hicache.append(info.hicache)
        self.prefix_key = prefix_key_of(prefix_identity)
        self.prefix_chars = CHARS_PER_TOKEN * system_text_tokens
        self.next_poll = 0.0
        self.poll(0.0)

    # ---- request path -------------------------------------------------------------------
    def send(self, agent: Any, prompt_tokens: int, now: float) -> list[Dispatch]:
        spec = agent.spec
        t = Ticket(agent.pid, prompt_chars=CHARS_PER_TOKEN * prompt_tokens, inferred=self.inferred,
                   prefix_key=self.prefix_key, prefix_chars=self.prefix_chars, group_id=spec.group_id,
                   group_chars=CHARS_PER_TOKEN * spec.instance_tokens if spec.group_id else 0,
                   max_output=spec.output_tokens_at(agent.step))  # the http driver's max_tokens
        t.waiter = agent
        try:
            b = self.ctl.submit(t, now)
        except ThunderError as e:
            raise Refused(type(e).__name__, getattr(e, "retry_after", None) or self.cfg.gateway.retry_after_seconds) from e
        agent.ticket = t
        if b is None:
            self._kick(now)
            return []
        return [self._dispatch(t)]

    def complete(self, agent: Any, c: Completion | None, now: float, overflow: bool = False) -> list[Dispatch]:
        """``agent``'s request ended: answered (``c``), failed, or refused by the engine for the
        model's context (``overflow``: what the gateway reads in SGLang's 400)."""
        t = agent.ticket
        agent.ticket = None
        if overflow and t is not None and self.inferred:
            t.end_hint = CONTEXT_OVERFLOW  # as the proxy sets it (conversations.context_overflow)
        usage = None
        if c is not None and c.error is None and c.finish_reason != "abort":
            usage = Usage(c.prompt_tokens, c.completion_tokens, c.cached_tokens, c.cached_host, c.cached_storage)
            if t is not None and self.inferred and agent.spec.signs_end and agent.step == len(agent.spec.steps) - 1:
                t.end_hint = SIGN  # the answer the gateway would read the end sign in (conversations rule 7)
        return [self._dispatch(x) for x in self.ctl.finish(t, now, usage)] if t is not None else []

    def release(self, agent: Any, now: float, end_of_run: bool = False) -> None:
        if self.inferred and not end_of_run:
            return  # the client cannot say its program ended: the controller's idle rules do
        if agent.pid in self.ctl.programs:
            _, held = self.ctl.release(agent.pid, now)
            for t in held:
                t.waiter.ticket = None
            self._kick(now)

    def _dispatch(self, t: Ticket) -> Dispatch:
        i, rank = self.where[t.backend.key]  # type: ignore[union-attr]
        return Dispatch(t.waiter, i, rank, t.session_id)

    def after(self, now: float) -> None:
        """End of an instant of the simulation: drop the KV references the controller let go
        of (as the gateway's ``send_closes`` does after ticks, releases and failovers)."""
        for sid, key in self.ctl.kvrefs.take_closes():
            where = self.where.get(key)
            if where is not None:
                self.read(where[0], now).close_session(sid)

    def _kick(self, now: float) -> None:
        self.ctl.kick()

    # ---- timers -------------------------------------------------------------------------
    def next_time(self) -> float:
        return min(self.ctl.next_tick_at(), self.next_poll)

    def run_timers(self, now: float, expired: list[Any]) -> list[Dispatch]:
        """Polls and ticks due at ``now``; agents whose held request timed out go to ``expired``."""
        if self.next_poll <= now:
            self.poll(now)
        out: list[Dispatch] = []
        if self.ctl.next_tick_at() <= now:
            res = self.ctl.tick(now)
            out = [self._dispatch(t) for t in res.dispatched]
            for t in res.expired:
                t.waiter.ticket = None
                expired.append(t.waiter)
        return out

    def poll(self, now: float) -> None:
        """One monitor reading of every worker (``Monitor.poll``), fresh as of ``now``."""
        self.next_poll = now + self.cfg.monitor.poll_interval_seconds
        for i, bs in enumerate(self.backends):
            w = self.read(i, now)
            host: dict[int, TierReading] = {}
            if self.hicache[i]:
                # the monitor parses all of /metrics; only these gauges feed host_tier_by_rank
                text = "\n".join(ln for ln in w.metrics_text().splitlines() if ln.startswith("sglang:hicache_host"))
                host = host_tier_by_rank(parse_prometheus(text))
            for r in parse_loads(w.loads(include=LOADS_INCLUDE)):
                if r.dp_rank >= len(bs):
                    continue
                b = bs[r.dp_rank]
                h = host.get(r.dp_rank)
                if h is not None:
                    b.tiers.host_tokens = h.host_total_tokens
                b.live.read(r, now, h)

    # ---- end of run ---------------------------------------------------------------------
    def drain(self, agents: list[Any], now: float) -> None:
        """The run is over: in-flight requests end unanswered, every program is released."""
        for a in agents:
            if a.ticket is not None and a.ticket.dispatched_at is not None:
                self.ctl.finish(a.ticket, now, None)
                a.ticket = None
            self.release(a, now, end_of_run=True)

    @property
    def held_count(self) -> int:
        return self.ctl.held_count


def routed_text(tokens: Any) -> bytes:
    """The text a stock router routes a DES prompt by (``baselines.text_key``), with the header
    the benchmark's HTTP and real drivers put before a program's task
    (``workloads.conversation.instance_text``: ``Task <program id>:``). The header matters to a
    character tree: after the shared system prompt every task starts with it, and new programs
    branch on their ids' digits, into nodes that earlier programs of both workers share."""
    prompt = tokens.prompt
    spec = getattr(tokens, "spec", None)
    if spec is None:  # a trace's turn (``des.trace``): its prompt carries no task header
        return text_key(prompt)
    cut = len(tokens.layout.shared_prefix)
    head = b"" if spec.task is not None else f"Task {spec.program_id}:\n".encode()  # a group's task is shared
    return text_key(prompt[:cut]) + head + text_key(prompt[cut:])


class StockRouter:
    """A stock policy of ``baselines``: routes each request when it is issued, never holds."""

    def __init__(self, workers: list[SimWorker], read: Reader, policy: Policy) -> None:
        self.policy = policy
        self.read = read
        self.n = len(workers)
        p = policy.poll_interval_s
        e = policy.eviction_interval_s
        self.next_poll = 0.0 if p else math.inf
        self.next_evict = e if e else math.inf

    def send(self, agent: Any, prompt_tokens: int, now: float) -> list[Dispatch]:
        i = self.policy.select(RouteRequest(routed_text(agent.tokens), agent.pid, now))
        agent.ticket = i
        return [Dispatch(agent, i, None)]

    def complete(self, agent: Any, c: Completion | None, now: float, overflow: bool = False) -> list[Dispatch]:
        if agent.ticket is not None:
            self.policy.on_complete(agent.ticket)
            agent.ticket = None
        return []

    def release(self, agent: Any, now: float) -> None:
        self.policy.on_release(agent.pid)

    def after(self, now: float) -> None:
        pass

    def next_time(self) -> float:
        return min(self.next_poll, self.next_evict)

    def run_timers(self, now: float, expired: list[Any]) -> list[Dispatch]:
        if self.next_poll <= now:
            self.next_poll = now + (self.policy.poll_interval_s or math.inf)
            self.policy.poll(now, [parse_loads(self.read(i, now).loads(include=LOADS_INCLUDE)) for i in range(self.n)])
        if self.next_evict <= now:
            self.next_evict = now + (self.policy.eviction_interval_s or math.inf)
            self.policy.evict(now)
        return []

    def drain(self, agents: list[Any], now: float) -> None:
        for a in agents:
            self.complete(a, None, now)

    @property
    def held_count(self) -> int:
        return 0
