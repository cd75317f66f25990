"""Engine control through the router, for RL rollouts: SGLang 0.5.23's control routes fanned
out to the right workers and answered with one summary, inside the router's weight-update
windows (``thunder_sgl.control.windows``).

- ``pause`` / ``resume_generation``: every registered worker; the router holds new requests
  from before the engines pause until after they continue. In-flight requests are the
  engines' business by mode: ``abort`` answers them (finish reason ``abort``, usage of what
  was generated — the router finishes their programs as usual), ``in_place`` keeps them
  frozen with their KV, ``retract`` releases their KV and prefills them again afterwards.
- ``update_weights``: every registered worker, inside a window (opened for the call if none
  is). Where the update succeeded and the cache was flushed, every program's KV is gone: the
  controller resets their accounting (``Controller.reset_kv``) and the queue refills them.
- ``abort``: a ``rid`` goes to the one worker that holds it (``Gateway.rids``), or is
  withdrawn if the router still holds it; ``abort_all`` reaches every worker and every held
  request. An unknown rid is a 404.
- ``release_memory`` / ``resume_memory``: resume goes only to workers whose memory was
  released through the router, with those tags — a real SGLang server crashes on a resume of
  a tag it never released, and on a release while requests run, so both are refused (409)
  before any worker is called.
- ``flush``: healthy workers; a worker that flushed resets the accounting of its programs.
- ``begin_sync`` / ``end_sync``: SkyRL's ``/weight_sync/begin`` and ``/end``; no worker is called.

A summary names every worker's answer. Its status: 200 when all succeeded, the workers' 4xx
when they all refused alike, else 502. A control call that failed on every worker leaves no
window open behind it.
"""

from __future__ import annotations

import logging
from typing import Any

from thunder_sgl.control.windows import Closed, Reason, WindowConflict
from thunder_sgl.errors import Conflict, NoBackend, NotFound, openai_error_body
from thunder_sgl.gateway import engine_bodies as B
from thunder_sgl.gateway.runtime import Gateway
from thunder_sgl.gateway.workers_client import FanOut, WorkerReply

log = logging.getLogger("thunder_sgl.gateway")

ABORT_TIMEOUT_S = 10.0
FLUSH_TIMEOUT_S = 60.0


class EngineControl:
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.released: dict[str, set[str]] = {}
        """Worker URL → memory tags released through the router and not resumed yet."""

    @property
    def windows(self):  # noqa: ANN201 - the controller's Windows
        return self.gw.controller.windows

    # ---- weight-sync windows (SkyRL) ------------------------------------------------------
    def begin_sync(self) -> tuple[dict[str, Any], int]:
        now = self.gw.clock()
        self.windows.hold(Reason.WEIGHT_SYNC, now)
        log.info("weight sync begins: holding new requests and restores")
        return {"status": "ok", "weight_sync_active": True, "window": self.windows.describe(now)}, 200

    def end_sync(self) -> tuple[dict[str, Any], int]:
        now = self.gw.clock()
        self._closed(self.windows.release(Reason.WEIGHT_SYNC, now))
        return {"status": "ok", "weight_sync_active": False, "window": self.windows.describe(self.gw.clock())}, 200

    # ---- generation -----------------------------------------------------------------------
    async def pause(self, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        mode = B.pause_mode(body)
        urls = self._targets()
        was_paused = self.windows.has(Reason.PAUSED)
        self.windows.hold(Reason.PAUSED, self.gw.clock(), mode=mode)
        fan = await self.gw.workers.fan_out(urls, "POST", "/pause_generation", body)
        if not fan.ok and not was_paused:  # no engine paused: the router holds nothing either
            self._closed(self.windows.release(Reason.PAUSED, self.gw.clock()))
        return self._summary(fan, f"Generation paused ({mode})."), fan.status()

    async def resume_generation(self, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        B.check_continue(body)
        fan = await self.gw.workers.fan_out(self._targets(), "POST", "/continue_generation", body)
        if fan.ok:  # engines run again: held requests may go (a paused one still holds them)
            self._closed(self.windows.release(Reason.PAUSED, self.gw.clock()))
        return self._summary(fan, "Generation continued."), fan.status()

    # ---- weights --------------------------------------------------------------------------
    async def update_weights(self, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        upd = B.weight_update(body)
        urls = self._targets()
        self.windows.hold(Reason.UPDATING, self.gw.clock())
        fan = FanOut(())
        try:
            fan = await self.gw.workers.fan_out(urls, "POST", "/update_weights_from_disk", body)
        finally:
            now = self.gw.clock()
            done = [r.worker for r in fan.replies if r.ok and _success(r)]
            if done:
                self.windows.weights_updated(upd.weight_version)
                self._versions(done, upd.weight_version)
                if upd.flush_cache:
                    self._reset(done, now)
            self._closed(self.windows.release(Reason.UPDATING, now))
        paused = [r.body.get("num_paused_requests", 0) for r in fan.replies if isinstance(r.body, dict)]
        out = {"success": fan.all_ok and len(done) == len(fan.replies),
               "message": " | ".join(f"{r.worker}: {r.message}" for r in fan.replies),
               "num_paused_requests": sum(x for x in paused if isinstance(x, int)),
               "weight_version": self.windows.weight_version,
               "workers_updated": len(done), "total_workers": len(fan.replies),
               "workers": fan.describe(), "window": self.windows.describe(self.gw.clock())}
        return out, fan.status()

    # ---- abort ----------------------------------------------------------------------------
    async def abort(self, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        target = B.abort_target(body)
        gw = self.gw
        if target.abort_all:
            held = sum(gw.abort_held(t) for t in gw.controller.held_tickets())
            fan = await gw.workers.fan_out(self._targets(), "POST", "/abort_request", body, ABORT_TIMEOUT_S)
            return {**self._summary(fan, "Aborted every request."), "aborted_held": held}, fan.status()
        rid = target.rid
        assert rid is not None
        t = gw.rids.get(rid)
        if t is None:
            raise NotFound(f"no request with rid {rid!r} is held or in flight through this router", param="rid",
                           code="rid_not_found")
        if t.dispatched_at is None and gw.abort_held(t):
            return {"status": "ok", "rid": rid, "where": "held", "message": "withdrawn before reaching an engine"}, 200
        if t.backend is None:
            raise Conflict(f"request {rid!r} is being retried on another worker; abort it again", code="rid_moving")
        reply = await gw.workers.call(t.backend.worker_url, "POST", "/abort_request", {"rid": rid}, ABORT_TIMEOUT_S)
        fan = FanOut((reply,))
        return {**self._summary(fan, "Abort sent to the worker that holds the request."), "rid": rid,
                "where": "worker", "worker": reply.worker}, fan.status()

    # ---- memory ---------------------------------------------------------------------------
    async def release_memory(self, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        tags = set(B.memory_tags(body) or B.MEMORY_TAGS)
        urls = self._targets()
        w = self.windows.current
        retracted = w is not None and Reason.PAUSED in w.reasons and w.pause_mode in ("retract", "abort")
        busy = {u: n for u in urls if (n := self._inflight(u))}
        if busy and not retracted:
            raise WindowConflict(f"requests are running on {sorted(busy)} through the router; SGLang releases "
                                 "memory only on an idle engine: pause generation (mode retract or abort) first",
                                 code="workers_busy")
        self.windows.hold(Reason.RELEASED, self.gw.clock())
        fan = await self.gw.workers.fan_out(urls, "POST", "/release_memory_occupation", body)
        now = self.gw.clock()
        for r in fan.ok:
            self.released.setdefault(r.worker, set()).update(tags)
        if "kv_cache" in tags and fan.ok:
            self._reset([r.worker for r in fan.ok], now)
        if not self.released:
            self._closed(self.windows.release(Reason.RELEASED, now))
        return {**self._summary(fan, f"Memory released ({', '.join(sorted(tags))})."), "released": self._released()}, fan.status()

    async def resume_memory(self, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        asked = B.memory_tags(body)
        bodies: dict[str, Any] = {}
        for url, held in self.released.items():
            tags = held & set(asked) if asked else held
            if tags:
                bodies[url] = {**body, "tags": sorted(tags)}
        if not bodies:
            raise WindowConflict("no worker's memory" + (f" with tags {asked}" if asked else "") +
                                 " was released through this router; nothing to resume", code="nothing_released")
        fan = await self.gw.workers.fan_out(bodies, "POST", "/resume_memory_occupation", bodies=bodies)
        for r in fan.ok:
            left = self.released[r.worker] - set(bodies[r.worker]["tags"])
            if left:
                self.released[r.worker] = left
            else:
                del self.released[r.worker]
        if not self.released:
            self._closed(self.windows.release(Reason.RELEASED, self.gw.clock()))
        return {**self._summary(fan, "Memory resumed."), "released": self._released()}, fan.status()

    # ---- cache ----------------------------------------------------------------------------
    async def flush(self, query: str) -> tuple[dict[str, Any], int]:
        assert self.gw.monitor is not None
        urls = [w.url for w in self.gw.monitor.healthy_workers()]
        path = "/flush_cache" + (f"?{query}" if query else "")
        fan = await self.gw.workers.fan_out(urls, "POST", path, None, FLUSH_TIMEOUT_S)
        if fan.ok:
            self._reset([r.worker for r in fan.ok], self.gw.clock())
        failed = [{"worker": r.worker, "status": r.status, "message": r.message} for r in fan.failed]
        return {"status": "success" if not failed else "partial", "workers_flushed": len(fan.ok),
                "total_http_workers": len(urls), "failed": failed}, 200 if not failed else 502

    # ---- helpers --------------------------------------------------------------------------
    def _targets(self) -> list[str]:
        assert self.gw.monitor is not None
        urls = [w.url for w in self.gw.monitor.workers.values() if w.registered]
        if not urls:
            raise NoBackend("no registered workers to send the control call to")
        return urls

    def _inflight(self, url: str) -> int:
        assert self.gw.monitor is not None
        return sum(b.inflight for w in self.gw.monitor.workers.values() if w.url == url for b in w.backends)

    def _versions(self, urls: list[str], version: str | None) -> None:
        """An update through the router: the engines' new version is known (or, unnamed, read
        afresh from their next answer), so it is not taken for one behind the router's back."""
        for b in self.gw.controller.backend_list():
            if b.worker_url in urls:
                b.weight_version = version

    def _reset(self, urls: list[str], now: float) -> None:
        """The engines of ``urls`` dropped their KV: reset the accounting of their programs."""
        assert self.gw.monitor is not None
        keys = [b.key for w in self.gw.monitor.workers.values() if w.url in urls for b in w.backends]
        requeued = self.gw.controller.reset_kv(keys, now)
        log.info("KV dropped on %d worker(s): %d idle program(s) back to the queue", len(urls), len(requeued))
        self.gw.kick()

    def _closed(self, closed: Closed | None) -> None:
        if closed is None:
            return
        log.info("weight-update window %d closed after %.1fs; held requests go out", closed.window.id, closed.seconds)
        self.gw.run_tick(self.gw.clock())

    def _released(self) -> dict[str, list[str]]:
        return {u: sorted(t) for u, t in self.released.items()}

    def _summary(self, fan: FanOut, message: str) -> dict[str, Any]:
        status = "ok" if fan.all_ok else ("partial" if fan.ok else "failed")
        return {"status": status, "message": message if fan.all_ok else _failure(fan), "workers": fan.describe(),
                "window": self.windows.describe(self.gw.clock())}


def with_error(out: dict[str, Any], fan_status: int) -> dict[str, Any]:
    """A summary that is not a success also carries the OpenAI error object (SGLang's own
    fields, ``success`` and ``message``, stay for the clients that read them)."""
    if fan_status < 300:
        return out
    kind = "invalid_request_error" if fan_status < 500 else "upstream_error"
    return {**out, "error": openai_error_body(str(out.get("message", "")), kind, fan_status)["error"]}


def _failure(fan: FanOut) -> str:
    first = fan.failed[0]
    return f"{len(fan.failed)} of {len(fan.replies)} worker(s) failed; {first.worker}: {first.message}"


def _success(r: WorkerReply) -> bool:
    return isinstance(r.body, dict) and r.body.get("success") is True
