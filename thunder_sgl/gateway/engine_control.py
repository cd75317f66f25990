"""Engine control through the router, for RL rollouts: SGLang 0.5.23's control routes fanned
out to the right workers and answered with one summary, inside the router's weight-update
windows (``thunder_sgl.control.windows``).

- ``pause`` / ``resume_generation``: every registered worker; the router holds new requests
  from before the engines pause until after they continue. In-flight requests are the
  engines' business by mode: ``abort`` answers them (finish reason ``abort``, usage of what
  was generated — the router finishes their programs as usual), ``in_place`` keeps them
  frozen with their KV, ``retract`` releases their KV and prefills them again afterwards.
- ``update_weights`` (from disk) and ``update_distributed``: every registered worker;
  ``update_tensor``: the one worker named by the ``worker`` query parameter (``worker``: its
  index in ``GET /workers``, URL or id). Each inside a window (opened for the call if none
  is). Where the update succeeded the new version is known, and where the cache was flushed
  every program's KV is gone: the controller resets their accounting (``Controller.reset_kv``)
  and the queue refills them. Where it failed, the worker is kept out of routing
  (``Backend.weights_pending``: like an unhealthy worker, nothing new goes there and its idle
  programs migrate) until it reports the version the update named or a later update through
  the router succeeds on it — unless every registered worker refused the call alike with a
  4xx (a bad request that changed nothing anywhere).
- ``init_group``: ``/init_weights_update_group`` on every registered worker, each with its own
  ``rank_offset``: the body's for the first (in ``GET /workers`` order), then each after the TP
  ranks of the workers before it (their ``/server_info`` ``tp_size``); a ``world_size`` too
  small for those ranks is a 400 before any worker is called. ``destroy_group`` broadcasts.
- ``get_version`` (each worker's ``/model_info`` version; SGLang 0.5.23 has no
  ``/get_weight_version``), ``update_version`` (a label, no new weights), ``load_lora`` /
  ``unload_lora``: every registered worker, no window.
- ``abort``: a ``rid`` goes to the one worker that holds it (``Gateway.rids``), or is
  withdrawn if the router still holds it; ``abort_all`` reaches every worker and every held
  request. An unknown rid is a 404.
- ``release_memory`` / ``resume_memory``: resume goes only to workers whose memory was
  released through the router, with those tags — a real SGLang server crashes on a resume of
  a tag it never released, and on a release while requests run, so both are refused (409)
  before any worker is called.
- ``flush``: healthy workers; a worker that flushed resets the accounting of its programs,
  except where it has a HiCache storage tier, which ``/flush_cache`` leaves as it is.
- ``begin_sync`` / ``end_sync``: SkyRL's ``/weight_sync/begin`` and ``/end``; no worker is called.

A summary names every worker's answer. Its status: 200 when all succeeded, the workers' 4xx
when they all refused alike, else 502. A control call that failed on every worker leaves no
window open behind it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from urllib.parse import parse_qs

from thunder_sgl.backends.backend import Backend, PendingWeights
from thunder_sgl.backends.monitor import Worker
from thunder_sgl.control.windows import Closed, Reason, WindowConflict
from thunder_sgl.errors import BadRequest, Conflict, NoBackend, NotFound, openai_error_body
from thunder_sgl.gateway import engine_bodies as B
from thunder_sgl.gateway.runtime import Gateway
from thunder_sgl.gateway.workers_client import FanOut, WorkerReply

log = logging.getLogger("thunder_sgl.gateway")

ABORT_TIMEOUT_S = 10.0
FLUSH_TIMEOUT_S = 60.0
FLUSH_BUSY_WAIT_S = 10.0
"""How long a ``/flush_cache`` without SGLang's own ``?timeout=`` keeps asking a worker that
refused it (SGLang answers 400 while any request runs or waits, and for one loop turn after the
last one finished), so a flush sent right after the traffic stops is not refused for that."""
FLUSH_BUSY_POLL_S = 0.25


def _seconds(text: str) -> bool:
    try:
        return float(text) >= 0  # NaN is not
    except ValueError:
        return False


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
        if self.gw.monitor is not None:  # what the monitor read of their /ready is over too
            for r in fan.ok:
                w = self.gw.monitor.find(r.worker)
                if w is not None:
                    self.gw.monitor.continued(w)
        return self._summary(fan, "Generation continued."), fan.status()

    # ---- weights --------------------------------------------------------------------------
    async def update_weights(self, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """``/update_weights_from_disk`` on every worker."""
        upd = B.weight_update(body)
        out, fan = await self._update("/update_weights_from_disk", body, upd, self._targets())
        paused = [r.body.get("num_paused_requests", 0) for r in fan.replies if isinstance(r.body, dict)]
        return {**out, "num_paused_requests": sum(x for x in paused if isinstance(x, int))}, fan.status()

    async def update_distributed(self, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """``/update_weights_from_distributed`` on every worker (each receives the trainer's
        broadcast in the group made by ``init_group``)."""
        upd = B.distributed_update(body)
        out, fan = await self._update("/update_weights_from_distributed", body, upd, self._targets())
        return out, fan.status()

    async def update_tensor(self, body: dict[str, Any], ref: str) -> tuple[dict[str, Any], int]:
        """``/update_weights_from_tensor`` on the one worker ``ref`` names (its payloads are
        that engine's: CUDA IPC handles of tensors on the trainer's GPUs)."""
        upd = B.tensor_update(body)
        out, fan = await self._update("/update_weights_from_tensor", body, upd, [self.worker(ref)])
        return out, fan.status()

    async def _update(self, path: str, body: dict[str, Any], upd: B.WeightUpdate,
                      urls: list[str]) -> tuple[dict[str, Any], FanOut]:
        """A weight update on ``urls`` inside a window (opened for the call if none is). Where
        it succeeded the new version is known and, flushed, the programs' KV accounting reset;
        where it failed the worker is kept out of routing (``_hold_out``)."""
        self.windows.hold(Reason.UPDATING, self.gw.clock())
        fan = FanOut(())
        done: list[str] = []
        try:
            fan = await self.gw.workers.fan_out(urls, "POST", path, body)
        finally:
            now = self.gw.clock()
            done = [r.worker for r in fan.replies if r.ok and _success(r)]
            if done:
                self.windows.weights_updated(upd.weight_version)
                self._versions(done, upd.weight_version, weights=True)
                if upd.flush_cache:
                    self._reset(done, now)
            self._hold_out(path, fan, done, upd.weight_version, now)
            self._closed(self.windows.release(Reason.UPDATING, now))
        out = {"success": fan.all_ok and len(done) == len(fan.replies),
               "message": " | ".join(f"{r.worker}: {r.message}" for r in fan.replies),
               "weight_version": self.windows.weight_version,
               "workers_updated": len(done), "total_workers": len(fan.replies),
               "out_of_routing": self._pending(),
               "workers": fan.describe(), "window": self.windows.describe(self.gw.clock())}
        return out, fan

    def _hold_out(self, path: str, fan: FanOut, done: list[str], version: str | None, now: float) -> None:
        """Keep the workers where ``path`` failed out of routing until they report ``version``
        (``Backend.weights_pending``): their weights are not the trainer's. Not when every
        registered worker refused the call alike with a 4xx — a bad request that changed
        nothing anywhere: the cluster stays on its old weights together."""
        failed = [r for r in fan.replies if r.worker not in done]
        if not failed:
            return
        status = fan.status()
        if not done and 400 <= status < 500 and {r.worker for r in fan.replies} >= set(self._registered()):
            log.warning("%s refused alike by every worker (%d): no worker kept out of routing", path, status)
            return
        for r in failed:
            for b in self._backends([r.worker]):
                b.weights_pending = PendingWeights(version, b.weight_version, now, path, r.message)
            log.error("%s failed on %s (%s): kept out of routing until it reports weights %s", path, r.worker,
                      r.message, repr(version) if version is not None else "other than its current ones")
        self.gw.kick()

    def _pending(self) -> dict[str, Any]:
        """Worker URL → the version each worker kept out of routing waits for."""
        assert self.gw.monitor is not None
        return {w.url: p.expected for w in self.gw.monitor.workers.values() if (p := w.weights_pending) is not None}

    # ---- weight update groups (NCCL broadcast from the trainer) -------------------------
    async def init_group(self, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """``/init_weights_update_group`` on every worker, each with its own ``rank_offset``:
        the body's for the first worker, then each worker's after the TP ranks of those before
        it (SGLang joins TP rank r of an engine as ``rank_offset + r``)."""
        g = B.init_group(body)
        workers = self._registered_workers()
        offsets, tp, nxt = {}, {}, g.rank_offset
        for w in workers:
            offsets[w.url], tp[w.url] = nxt, w.info.tp_size if w.info else 1
            nxt += tp[w.url]
        if nxt > g.world_size:
            raise BadRequest(f"world_size {g.world_size} is too small: the {len(workers)} registered engine(s) "
                             f"(TP sizes {list(tp.values())}) take ranks {g.rank_offset}..{nxt - 1}, so world_size "
                             f"must be at least {nxt}", param="world_size", code="world_size_too_small")
        bodies = {u: {**body, "rank_offset": o} for u, o in offsets.items()}
        fan = await self.gw.workers.fan_out(list(offsets), "POST", "/init_weights_update_group", bodies=bodies)
        out = {**self._summary(fan, "Weight update group initialized on every worker."),
               "success": fan.all_ok and all(_success(r) for r in fan.replies),
               "rank_offsets": offsets, "tp_sizes": tp, "ranks_used": nxt, "world_size": g.world_size}
        return out, fan.status()

    async def destroy_group(self, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        B.destroy_group(body)
        fan = await self.gw.workers.fan_out(self._targets(), "POST", "/destroy_weights_update_group", body)
        out = {**self._summary(fan, "Weight update group destroyed on every worker."),
               "success": fan.all_ok and all(_success(r) for r in fan.replies)}
        return out, fan.status()

    # ---- versions and adapters ------------------------------------------------------------
    async def get_version(self) -> tuple[dict[str, Any], int]:
        """Every worker's weight version, read from its ``/model_info`` (SGLang 0.5.23 has no
        ``/get_weight_version``). What is read counts as seen (``Controller.weight_version_seen``)."""
        fan = await self.gw.workers.fan_out(self._targets(), "GET", "/model_info", None, ABORT_TIMEOUT_S)
        versions: dict[str, str | None] = {}
        for r in fan.replies:
            v = r.body.get("weight_version") if r.ok and isinstance(r.body, dict) else None
            versions[r.worker] = v if isinstance(v, str) else None
            if isinstance(v, str) and v and self.gw.monitor is not None:
                w = self.gw.monitor.find(r.worker)
                if w is not None:
                    self.gw._on_worker_version(w, v)
        seen = set(versions.values())
        out = {**self._summary(fan, "Weight version of every worker."),
               "weight_version": next(iter(seen)) if len(seen) == 1 else None, "consistent": len(seen) == 1,
               "versions": versions, "out_of_routing": self._pending()}
        return out, fan.status()

    async def update_version(self, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """``/update_weight_version`` (a new label, no new weights) on every worker."""
        version = B.version_update(body)
        fan = await self.gw.workers.fan_out(self._targets(), "POST", "/update_weight_version", body)
        done = [r.worker for r in fan.replies if r.ok and _success(r)]
        self._versions(done, version, weights=False)
        if done:
            self.windows.weight_version = version
        out = {**self._summary(fan, f"Weight version updated to {version} on every worker."),
               "success": fan.all_ok and len(done) == len(fan.replies), "new_version": version,
               "workers_updated": len(done), "out_of_routing": self._pending()}
        return out, fan.status()

    async def load_lora(self, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        B.lora_load(body)
        return await self._lora("/load_lora_adapter", body, "LoRA adapter loaded on every worker.")

    async def unload_lora(self, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        B.lora_unload(body)
        return await self._lora("/unload_lora_adapter", body, "LoRA adapter unloaded on every worker.")

    async def _lora(self, path: str, body: dict[str, Any], message: str) -> tuple[dict[str, Any], int]:
        """SGLang's ``LoRAUpdateOutput`` per worker: ``loaded_adapters`` keeps the adapters
        loaded alike on every worker that answered, ``loaded_adapters_by_worker`` each one's."""
        fan = await self.gw.workers.fan_out(self._targets(), "POST", path, body)
        by_worker = {r.worker: r.body.get("loaded_adapters") for r in fan.replies
                     if isinstance(r.body, dict) and isinstance(r.body.get("loaded_adapters"), dict)}
        common: dict[str, Any] | None = None
        for adapters in by_worker.values():
            common = dict(adapters) if common is None else {k: v for k, v in common.items() if adapters.get(k) == v}
        errors = [f"{r.worker}: {r.body.get('error_message') if isinstance(r.body, dict) and r.body.get('error_message') else r.message}"
                  for r in fan.replies if not (r.ok and _success(r))]
        out = {**self._summary(fan, message), "success": not errors and bool(fan.replies),
               "error_message": " | ".join(errors) or None, "loaded_adapters": common or {},
               "loaded_adapters_by_worker": by_worker}
        if errors:
            out["message"] = f"{len(errors)} of {len(fan.replies)} worker(s) failed; " + out["error_message"]
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
        asked = parse_qs(query, keep_blank_values=True).get("timeout")
        if asked is not None and not _seconds(asked[-1]):
            raise BadRequest(f"timeout must be a number of seconds >= 0, not {asked[-1]!r}", param="timeout")
        urls = [w.url for w in self.gw.monitor.healthy_workers()]
        path = "/flush_cache" + (f"?{query}" if query else "")
        fan = await self.gw.workers.fan_out(urls, "POST", path, None, FLUSH_TIMEOUT_S)
        if asked is None:  # with ?timeout= SGLang itself waits for idle
            fan = await self._flush_busy_again(fan, path)
        kept: list[str] = []
        if fan.ok:
            flushed = {r.worker for r in fan.ok}
            workers = [w for w in self.gw.monitor.workers.values() if w.url in flushed]
            for w in workers:
                for b in w.backends:
                    b.live.flushed()  # device and host emptied; SGLang's host gauge lags a batch
            # /flush_cache empties the device and host tiers, not the storage tier: a program whose
            # worker has one keeps its KV there (its next request loads it back), so its accounting
            # stays; elsewhere its KV is gone.
            kept = sorted(w.url for w in workers if w.info is not None and w.info.hicache and w.info.storage_backend)
            self._reset(sorted(flushed - set(kept)), self.gw.clock())
            if kept:
                log.info("flushed %d worker(s) with a storage tier: their programs' KV stays there", len(kept))
        failed = [{"worker": r.worker, "status": r.status, "message": r.message} for r in fan.failed]
        return {"status": "success" if not failed else "partial", "workers_flushed": len(fan.ok),
                "total_http_workers": len(urls), "failed": failed, "storage_kept": kept}, 200 if not failed else 502

    async def _flush_busy_again(self, fan: FanOut, path: str) -> FanOut:
        """Ask the workers that refused the flush as busy (HTTP 400) again, every
        ``FLUSH_BUSY_POLL_S`` for up to ``FLUSH_BUSY_WAIT_S``; their last answers replace the
        refusals."""
        replies = {r.worker: r for r in fan.replies}
        deadline = time.monotonic() + FLUSH_BUSY_WAIT_S
        while (busy := [w for w, r in replies.items() if r.status == 400]) and time.monotonic() < deadline:
            await asyncio.sleep(FLUSH_BUSY_POLL_S)
            again = await self.gw.workers.fan_out(busy, "POST", path, None, FLUSH_TIMEOUT_S)
            replies.update({r.worker: r for r in again.replies})
        return FanOut(tuple(replies.values()))

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

    def _registered_workers(self) -> list[Worker]:
        """Registered workers, in ``GET /workers`` order (the order they were added)."""
        assert self.gw.monitor is not None
        workers = [w for w in self.gw.monitor.workers.values() if w.registered]
        if not workers:
            raise NoBackend("no registered workers to send the control call to")
        return workers

    def _registered(self) -> list[str]:
        assert self.gw.monitor is not None
        return [w.url for w in self.gw.monitor.workers.values() if w.registered]

    def worker(self, ref: str) -> str:
        """The URL of the one worker ``ref`` names: its URL, id, or index in ``GET /workers``.
        A 404 ``worker_not_found`` when no registered worker matches."""
        assert self.gw.monitor is not None
        workers = list(self.gw.monitor.workers.values())
        w = workers[int(ref)] if ref.isdigit() and int(ref) < len(workers) else self.gw.monitor.find(ref)
        if w is None or not w.registered:
            known = ", ".join(f"{i}: {x.url}" for i, x in enumerate(workers) if x.registered) or "none"
            raise NotFound(f"no registered worker {ref!r} (by index, URL or id; registered: {known})",
                           param="worker", code="worker_not_found")
        return w.url

    def _backends(self, urls: list[str]) -> list[Backend]:
        return [b for b in self.gw.controller.backend_list() if b.worker_url in urls]

    def _versions(self, urls: list[str], version: str | None, weights: bool = True) -> None:
        """An update through the router: the engines' new version is known (or, unnamed, read
        afresh from their next answer), so it is not taken for one behind the router's back.
        New weights (``weights``) bring a worker kept out of routing back; a new label only
        when it is the version that worker waits for."""
        for b in self._backends(urls):
            b.weight_version = version
            p = b.weights_pending
            if p is not None and (weights or (version is not None and p.met_by(version))):
                b.weights_pending = None
                log.warning("worker %s has the expected weights again: back in routing", b.worker_url)
                self.gw.kick()

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
