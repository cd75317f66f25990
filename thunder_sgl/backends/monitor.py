"""The monitor: registers workers and keeps each (worker, dp_rank) backend's numbers fresh.

Registration reads ``/server_info`` (falling back to ``/get_server_info``) for the HBM
capacity per rank, ``dp_size`` and the HiCache settings, ``/model_info``, and the model's context
length (``/v1/models``' ``max_model_len`` where ``/server_info`` has none, as SGLang's); until it
succeeds the worker is retried in the background (as sglang_router does) and serves nothing.
Then every ``poll_interval_seconds`` it reads ``/v1/loads?include=core,queues`` (per-rank usage,
queueing, retraction) and ``/metrics`` (HiCache host-tier gauges). A poll that fails counts
towards ``failure_threshold``; past it the worker is unhealthy, and its backends count as full
(the scheduler sends their idle programs back to the global queue). ``success_threshold`` good
polls bring it back. A connection refused on the request path marks it unhealthy at once.
A worker whose weight update through the router failed is out of routing too, whatever its
health, until it reports the version expected (``Backend.weights_pending``, read with the
weight version every ``version_poll_seconds``); ``GET /workers`` shows it per worker.
After every good poll it reads ``/ready``: a worker paused behind the router (``/ready`` 503
while ``/v1/loads`` answers; the rule and what the router does then: ``backends.pause``) is
held, not failed — ``paused`` in ``GET /workers``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import orjson

from thunder_sgl.backends.backend import Backend, PendingWeights
from thunder_sgl.backends.parse import (
    ParseError,
    TierReading,
    WorkerInfo,
    cached_tokens_by_source,
    host_tier_by_rank,
    parse_loads,
    parse_models,
    parse_prometheus,
    parse_server_info,
)
from thunder_sgl.backends.pause import NOT_PAUSED, READY_PATH, EnginePause, judge
from thunder_sgl.config import MonitorConfig

log = logging.getLogger("thunder_sgl.monitor")


@dataclass(eq=False)
class Worker:
    url: str
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    info: WorkerInfo | None = None
    model_info: dict[str, Any] | None = None
    version_read_at: float = float("-inf")
    """When ``/model_info`` was last read for the weight version."""
    backends: list[Backend] = field(default_factory=list)
    healthy: bool = False
    registered: bool = False
    fails: int = 0
    oks: int = 0
    last_error: str | None = None
    metrics_supported: bool = True
    cached_by_source: dict[str, int] = field(default_factory=dict)
    """``sglang:cached_tokens_total`` by ``cache_source`` (device, host, storage): prompt tokens
    the engine served from each tier since it started (HiCache only; no rank label)."""
    task: asyncio.Task[None] | None = None
    model_id_override: str | None = None
    """``model_id`` of the ``POST /workers`` body (sglang_router's), shown instead of the model path."""
    priority: int | None = None
    cost: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    disable_health_check: bool = False
    """Shown as given (``worker_bodies``); thunder's scheduling does not use them."""
    pause: EnginePause = NOT_PAUSED
    """Paused behind the router, as ``backends.pause.judge`` last said (from ``/ready``)."""
    ready_supported: bool = True
    """False once ``/ready`` answered 404 (an SGLang without it): never judged paused."""
    continued_at: float = float("-inf")
    """When a ``/continue_generation`` through the router last succeeded on it (a ``/ready``
    read before that is not judged)."""

    @property
    def weights_pending(self) -> PendingWeights | None:
        """Set while a failed weight update keeps this worker out of routing (``Backend.weights_pending``)."""
        return next((b.weights_pending for b in self.backends if b.weights_pending is not None), None)

    @property
    def model_id(self) -> str:
        if self.model_id_override:
            return self.model_id_override
        return self.info.model_path if self.info else "unknown"

    def metadata(self) -> dict[str, str]:
        """sglang_router 0.3.2's ``metadata`` (all values strings): what the worker reported,
        then the body's labels, and its priority and cost when given."""
        m = {
            "model_path": self.info.model_path if self.info else "unknown",
            "dp_size": str(self.info.dp_size if self.info else 1),
            "tp_size": str(self.info.tp_size if self.info else 1),
            "disaggregation_mode": "null",
        }
        raw = self.info.raw if self.info else {}
        for key in ("served_model_name", "load_balance_method"):
            if isinstance(raw.get(key), str):
                m[key] = raw[key]
        mi = self.model_info or {}
        if isinstance(mi.get("architectures"), list):
            m["architectures"] = orjson.dumps(mi["architectures"]).decode()
        if isinstance(mi.get("model_type"), str):
            m["model_type"] = mi["model_type"]
        m.update(self.labels)
        if self.priority is not None:
            m["priority"] = str(self.priority)
        if self.cost is not None:
            m["cost"] = str(self.cost)
        return m

    def describe(self, now: float) -> dict[str, Any]:
        """The item of ``GET /workers`` (sglang_router's shape, plus thunder fields)."""
        return {
            "id": self.id,
            "url": self.url,
            "model_id": self.model_id,
            "priority": 50 if self.priority is None else self.priority,
            "cost": 1.0 if self.cost is None else self.cost,
            "worker_type": "regular",
            "is_healthy": self.healthy,
            "load": sum(b.inflight for b in self.backends),
            "connection_mode": "HTTP",
            "metadata": self.metadata(),
            "disable_health_check": self.disable_health_check,
            "registered": self.registered,
            "last_error": self.last_error,
            "tp_size": self.info.tp_size if self.info else None,
            "weights_pending": pending.describe() if (pending := self.weights_pending) is not None else None,
            "routable": self.registered and self.healthy and pending is None and not self.pause.holding,
            "paused": self.pause.paused,
            "pause": self.pause.describe(now) if self.pause.paused else None,
            "backends": [
                {
                    "key": b.key,
                    "dp_rank": b.dp_rank,
                    "hbm_tokens": b.tiers.hbm_tokens,
                    "host_tokens": b.tiers.host_tokens,
                    "storage_tokens": b.tiers.storage_tokens,
                    "used_tokens": b.live.used_tokens,
                    "host_used_tokens": b.live.host_used_tokens,
                    "hicache": _hicache_view(b, self.info, self.cached_by_source) if self.info and self.info.hicache else None,
                    "running_reqs": b.live.running_reqs,
                    "waiting_reqs": b.live.waiting_reqs,
                    "inflight": b.inflight,
                    "weight_version": b.weight_version,
                    "engine_paused": b.engine_paused,
                    "admission": b.admission.view() if b.admission is not None else None,
                }
                for b in self.backends
            ],
        }


def _hicache_view(b: Backend, info: WorkerInfo, cached_by_source: dict[str, int]) -> dict[str, Any]:
    """A backend's HiCache tiers as ``GET /workers`` shows them: configuration, the engine's
    gauges and counters (``parse.TierReading``) and the per-tier hits of the whole worker."""
    t = b.live.tier
    return {
        "write_policy": info.write_policy,
        "storage_backend": info.storage_backend,
        "host_inclusive": b.tiers.host_inclusive,
        "kv_bytes_per_token": b.tiers.kv_bytes_per_token or None,
        "host_used_stale": b.live.host_stale_since is not None,
        "backup_tokens": t.backup_tokens if t else 0,
        "load_back_tokens": t.load_back_tokens if t else 0,
        "storage_backup_tokens": t.storage_backup_tokens if t else 0,
        "storage_prefetch_tokens": t.storage_prefetch_tokens if t else 0,
        "cached_tokens_by_source": dict(cached_by_source),
    }


class Monitor:
    def __init__(
        self,
        cfg: MonitorConfig,
        session: aiohttp.ClientSession,
        on_backends: Callable[[Worker], None],
        on_remove: Callable[[Worker], None],
        headers: dict[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_health: Callable[[Worker], None] | None = None,
        on_version: Callable[[Worker, str], None] | None = None,
        on_pause: Callable[[Worker], None] | None = None,
        pause_limit: float = float("inf"),
    ) -> None:
        """``on_health`` is told of every change of a worker's health (the scheduler acts on
        both: a worker back in service can take held requests at once); ``on_version`` of the
        weight version read from ``/model_info`` every ``version_poll_seconds``; ``on_pause``
        of every change of whether the router holds for a worker paused behind it
        (``backends.pause``; ``pause_limit``: its watchdog, seconds)."""
        self.on_version = on_version
        self.on_pause = on_pause
        self.pause_limit = pause_limit
        self.cfg = cfg
        self.session = session
        self.on_backends = on_backends
        self.on_remove = on_remove
        self.on_health = on_health
        # The router's session does not decompress (the proxy passes bodies through as they are),
        # and SGLang gzips /metrics for a client that accepts it: the monitor asks for identity.
        self.headers = {**(headers or {}), "Accept-Encoding": "identity"}
        self.clock = clock
        self.workers: dict[str, Worker] = {}

    # ---- registry -----------------------------------------------------------------------
    def add(self, url: str, **fields: Any) -> Worker:
        """Register ``url`` (in the background); ``fields`` set on the new ``Worker``
        (``priority``, ``labels``, ...). A URL already registered returns its worker unchanged,
        as sglang_router 0.3.2 does."""
        url = url.rstrip("/")
        for w in self.workers.values():
            if w.url == url:
                return w
        w = Worker(url=url, **fields)
        self.workers[w.id] = w
        w.task = asyncio.get_running_loop().create_task(self._run(w), name=f"monitor {url}")
        return w

    def find(self, id_or_url: str) -> Worker | None:
        w = self.workers.get(id_or_url)
        if w is None:
            url = id_or_url.rstrip("/")
            w = next((x for x in self.workers.values() if x.url == url), None)
        return w

    async def remove(self, worker_id: str) -> Worker | None:
        w = self.workers.pop(worker_id, None)
        if w is None:
            return None
        if w.task:
            w.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await w.task
        self.on_remove(w)
        return w

    async def close(self) -> None:
        for w in list(self.workers.values()):
            if w.task:
                w.task.cancel()
        for w in list(self.workers.values()):
            if w.task:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await w.task

    def healthy_workers(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.registered and w.healthy]

    def suspect(self, backend: Backend, reason: str) -> None:
        """The request path could not connect: mark the worker unhealthy now."""
        for w in self.workers.values():
            if backend in w.backends and w.healthy:
                log.warning("worker %s unreachable (%s): marked unhealthy", w.url, reason)
                self._set_health(w, False, reason)

    # ---- loop ---------------------------------------------------------------------------
    async def _run(self, w: Worker) -> None:
        delay = 0.5
        while not w.registered:
            try:
                await self._register(w)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # keep retrying: the worker may still be starting
                w.last_error = f"registration: {e}"
                log.info("worker %s not ready (%s); retrying in %.1fs", w.url, e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        while True:
            await self.poll(w)
            await asyncio.sleep(self.cfg.poll_interval_seconds)

    async def _get(self, w: Worker, path: str) -> tuple[int, bytes]:
        timeout = aiohttp.ClientTimeout(total=self.cfg.request_timeout_seconds)
        async with self.session.get(w.url + path, headers=self.headers, timeout=timeout) as r:
            body = await r.read()
            if r.headers.get("Content-Encoding", "").lower() == "gzip":  # sent despite identity
                body = gzip.decompress(body)
            return r.status, body

    async def _get_json(self, w: Worker, *paths: str) -> Any:
        for path in paths:
            status, body = await self._get(w, path)
            if status == 404:
                continue
            if status != 200:
                raise ParseError(f"GET {path} -> {status}")
            return orjson.loads(body)
        raise ParseError(f"none of {paths} exists")

    async def _register(self, w: Worker) -> None:
        info = parse_server_info(await self._get_json(w, "/server_info", "/get_server_info"))
        if info.hicache and info.storage_backend and info.storage_tokens == 0 and self.cfg.storage_tokens > 0:
            info = replace(info, storage_tokens=self.cfg.storage_tokens)  # SGLang reports no capacity
        try:
            w.model_info = await self._get_json(w, "/model_info", "/get_model_info")
        except (ParseError, aiohttp.ClientError, ValueError):
            w.model_info = None
        if info.context_length <= 0:  # SGLang: null in /server_info, max_model_len in /v1/models
            try:
                info = replace(info, context_length=parse_models(await self._get_json(w, "/v1/models")))
            except (ParseError, aiohttp.ClientError, ValueError):
                pass  # unknown: no request is judged too long for it
        w.info = info
        w.backends = [Backend(w.url, r, info.tiers(), monitored=True, model_id=info.model_path, dp_size=info.dp_size,
                              session_refs=info.session_radix_cache, context_length=info.context_length)
                      for r in range(info.dp_size)]
        w.registered = True
        w.last_error = None
        await self.poll(w)
        self.on_backends(w)
        log.info("registered %s: model=%s dp=%d hbm=%d host=%d tokens/rank", w.url, info.model_path,
                 info.dp_size, info.hbm_tokens, w.backends[0].tiers.host_tokens)

    async def poll(self, w: Worker) -> None:
        """One reading of /v1/loads (+ /metrics); updates health and live numbers."""
        try:
            loads = parse_loads(await self._get_json(w, "/v1/loads?include=core,queues"))
            host: dict[int, TierReading] = {}
            if w.metrics_supported:
                status, body = await self._get(w, "/metrics")
                if status == 200:
                    samples = parse_prometheus(body.decode(errors="replace"))
                    host = host_tier_by_rank(samples)
                    if host:
                        w.cached_by_source = cached_tokens_by_source(samples)
                elif status == 404:
                    w.metrics_supported = False  # worker runs without --enable-metrics
        except asyncio.CancelledError:
            raise
        except (TimeoutError, aiohttp.ClientError, ParseError, ValueError, OSError) as e:
            w.fails += 1
            w.oks = 0
            w.last_error = f"poll: {type(e).__name__}: {e}"
            if w.healthy and w.fails >= self.cfg.failure_threshold:
                log.warning("worker %s failed %d polls: marked unhealthy", w.url, w.fails)
                self._set_health(w, False, w.last_error)
            return
        now = self.clock()
        for r in loads:
            if r.dp_rank >= len(w.backends):
                continue
            b = w.backends[r.dp_rank]
            h = host.get(r.dp_rank)
            if h is not None:
                b.tiers.host_tokens = h.host_total_tokens  # the engine's own figure (pages rounded)
                if b.tiers.kv_bytes_per_token == 0:
                    b.tiers.kv_bytes_per_token = h.kv_bytes_per_token
            b.live.read(r, now, h)
        w.fails = 0
        w.oks += 1
        ready = await self._ready(w)
        if w.continued_at < now:  # else a continue through the router came after this read
            self._set_pause(w, judge(w.pause, ready, now, self.pause_limit), now)
        if self.on_version is not None and now - w.version_read_at >= self.cfg.version_poll_seconds:
            w.version_read_at = now
            await self._read_version(w)
        if not w.healthy and w.oks >= self.cfg.success_threshold:
            if w.registered:
                log.info("worker %s healthy", w.url)
            self._set_health(w, True, None)

    async def _read_version(self, w: Worker) -> None:
        try:
            info = await self._get_json(w, "/model_info", "/get_model_info")
        except asyncio.CancelledError:
            raise
        except (TimeoutError, aiohttp.ClientError, ParseError, ValueError, OSError):
            return  # the loads poll judges health; a version unread now is read next time
        v = info.get("weight_version") if isinstance(info, dict) else None
        if isinstance(v, str) and v and self.on_version is not None:
            self.on_version(w, v)

    async def _ready(self, w: Worker) -> int | None:
        """The status of the worker's ``/ready`` (None: not read; 404 once: never read again)."""
        if not w.ready_supported:
            return None
        try:
            status, _ = await self._get(w, READY_PATH)
        except asyncio.CancelledError:
            raise
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None  # the loads poll judges health; paused or not is read next time
        if status == 404:
            w.ready_supported = False
            log.info("worker %s serves no %s: an engine paused behind the router is not detected there",
                     w.url, READY_PATH)
            return None
        return status

    def continued(self, w: Worker) -> None:
        """The worker answered a ``/continue_generation`` sent through the router: not paused
        any more, without waiting for the next ``/ready``."""
        w.continued_at = self.clock()
        self._set_pause(w, NOT_PAUSED, w.continued_at)

    def _set_pause(self, w: Worker, pause: EnginePause, now: float) -> None:
        """Record the rule's judgement; a change of whether the router holds for the worker
        goes to its backends and to ``on_pause``."""
        old, w.pause = w.pause, pause
        if old.holding == pause.holding:
            return
        for b in w.backends:
            if pause.holding:
                b.engine_pause(now)
            else:
                b.engine_resume(now)
        if pause.holding:
            log.warning("worker %s is paused (GET %s answers 503 while it answers its loads poll): its programs "
                        "and their requests are held until it continues", w.url, READY_PATH)
        elif pause.expired:
            log.error("worker %s paused for more than %.0fs: the router stops holding for it (requests go to it "
                      "and wait at its door while it stays paused)", w.url, self.pause_limit)
        else:
            log.warning("worker %s continues after %.1fs paused: its held requests go out", w.url,
                        now - (old.since if old.since is not None else now))
        if self.on_pause is not None:
            self.on_pause(w)

    def _set_health(self, w: Worker, healthy: bool, reason: str | None) -> None:
        changed = w.healthy != healthy
        w.healthy = healthy
        if reason:
            w.last_error = reason
        for b in w.backends:
            b.healthy = healthy
        if changed and self.on_health is not None:
            self.on_health(w)
