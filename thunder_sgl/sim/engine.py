"""One DP rank of a simulated SGLang server: admission, chunked prefill, decode, retraction.

The engine runs on a virtual clock and advances by *plans*. A plan is either one iteration that
prefills (chunks of new prompts, mixed with one decode step of every running request, as
SGLang's mixed chunked prefill), or a span of pure decode steps during which the batch does not
change; its duration comes from ``timing`` (a span has a closed form), so the engine jumps from
event to event instead of stepping every token. A plan's decisions are taken at its start and
its effects applied at its end. A request that arrives (or is aborted) during a decode span cuts
the span at the end of the step in progress, so it is scheduled at the next step boundary
exactly as in a step-by-step engine.

Scheduling follows SGLang 0.5 (``scheduler.py``, ``schedule_policy.PrefillAdder``):

- FCFS admission. A request is admitted when ``extend + min(max_new − out, clip)`` is below
  ``free + evictable − reserve``, where extend is the prompt minus its HBM hit and reserve is
  ``new_token_ratio × Σ min(max_new − out, clip)`` over running requests plus what this round
  already admitted. The head of the queue blocks the rest (no skipping). An idle engine admits
  its head whenever the prompt fits at all. At most one request is chunked at a time.
- The prefix match stops one token short of the prompt (the last token is always computed).
  Host/storage hits are loaded back into HBM before the prefill (``timing.h2d_seconds``, after
  ``timing.storage_fetch_seconds`` for storage hits; ``batching``).
- Chunks are inserted into the radix tree as they complete; a finished request inserts prompt +
  output (all but the last token, whose KV was never computed), so the next turn hits.
- Decode needs one KV slot per running request per step; when free + evictable KV cannot cover
  it, requests are retracted (fewest output tokens first, then longest prompt) until KV covers
  ``retract_decode_steps`` steps. They return to the head of the waiting queue, keep their output,
  and prefill prompt + output again. ``new_token_ratio`` is then re-estimated; it decays by a
  fixed step per decode step and resets when the engine idles.

While ``paused`` (``/pause_generation`` in ``in_place`` or ``retract`` mode, ``sim.control``)
no plan starts: the one in progress ends at its step boundary and the engine waits, its
requests where they are, until generation continues.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass

from thunder_sgl.sim.batching import may_admit_during_span, release, retract, schedule_prefill
from thunder_sgl.sim.config import SimConfig
from thunder_sgl.sim.exposition import LATENCY_BUCKETS, LOAD_BUCKETS, Histogram, engine_stats
from thunder_sgl.sim.radix import Node
from thunder_sgl.sim.request import (
    DONE,
    PREFILL,
    RUNNING,
    WAITING,
    Completion,
    EngineCounters,
    EngineStats,
    Req,
    SimRequest,
    SimRequestError,
    make_req,
)
from thunder_sgl.sim.tiers import KVCache
from thunder_sgl.sim.timing import (
    Roofline,
    decode_growth,
    decode_step,
    iteration_seconds,
    prefill_seconds,
    span,
    steps_within,
)

RECHECK_STEPS = 64
"""A decode span is cut after this many steps when a waiting request might become admissible
during it (see ``batching.may_admit_during_span``)."""


@dataclass(slots=True)
class Plan:
    start: float
    end: float
    steps: int
    decode: list[Req]
    prefill: list[tuple[Req, int]]
    a: float
    """Duration of the first step."""
    q: float
    """Each further step is q longer (context grows by B per step)."""
    touched: list[Node]
    """Cached prefix of the queue head that could not be admitted (re-touched every step)."""


class Engine:
    """One DP rank. Drive it with submit / next_event_time / advance (see ``thunder_sgl.sim``)."""

    def __init__(self, cfg: SimConfig, dp_rank: int = 0, max_span_steps: int | None = None) -> None:
        """``max_span_steps``: cap on decode steps per plan (1 simulates step by step; for
        validating the event-driven jumps, never needed otherwise)."""
        s, h = cfg.server, cfg.hicache
        self.cfg = cfg
        self.dp_rank = dp_rank
        self.max_span_steps = max_span_steps
        self.roofline = Roofline.from_config(cfg)
        self.capacity = s.max_total_num_tokens
        self.page = s.page_size
        self.cache = KVCache(s.page_size, cfg.host_tokens, cfg.storage_tokens, h.write_policy, h.load_back_threshold, h.storage_prefetch_threshold)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.chunked: Req | None = None
        self.reqs: dict[str, Req] = {}
        self.ratio = s.init_new_token_ratio
        self.counters = EngineCounters()
        self._min_ratio = s.min_new_token_ratio
        self._decay = s.new_token_ratio_decay
        self._t = 0.0
        self._now = 0.0
        self._plan: Plan | None = None
        self._stalled = False
        self._buffered: list[Completion] = []
        self._private = 0
        self._hit_rate = 0.0
        self._window: deque[tuple[float, int, float]] = deque()
        self._head_path: list[Node] = []
        self._aborts = False
        """Some running or prefilling request was aborted and not yet reaped."""
        self.paused: str | None = None
        """Pause mode (in_place, retract) while generation is paused (``sim.control``)."""
        self.hist_ttft = Histogram(LATENCY_BUCKETS)
        self.hist_e2e = Histogram(LATENCY_BUCKETS)
        self.hist_load_back = Histogram(LOAD_BUCKETS)

    # ---- public API -----------------------------------------------------------------------
    def submit(self, request: SimRequest, now: float) -> None:
        """Queue a request arriving at ``now`` (raises SimRequestError if it can never run)."""
        self._step_to(now, self._buffered)
        if request.rid in self.reqs:
            raise SimRequestError(f"request id {request.rid!r} is already in use")
        r = make_req(self.cfg, request, now, self.cache.tree.root)
        r.dp_rank = self.dp_rank
        if r.session_id is not None and self.cfg.server.enable_session_radix_cache:
            r.session_gen = self.cache.refs.open(r.session_id)
        self.reqs[r.rid] = r
        self.waiting.append(r)
        self.counters.requests_submitted += 1
        self._wake(now)

    def next_event_time(self) -> float | None:
        """When ``advance`` has something to do next (None: idle until the next submit)."""
        if self._buffered:
            return self._now
        if self._plan is not None:
            return self._plan.end
        if self.paused is not None:
            return self._t if self._aborts else None
        if not self._stalled and (self.running or self.waiting or self.chunked):
            return self._t
        return None

    def advance(self, until: float) -> list[Completion]:
        """Run every plan that ends by ``until``; return the requests that left, in time order."""
        out, self._buffered = self._buffered, []
        self._step_to(until, out)
        return out

    def abort(self, rid: str, now: float) -> bool:
        """Abort a request; its Completion (reason "abort") comes from a later ``advance``."""
        self._step_to(now, self._buffered)
        r = self.reqs.get(rid)
        if r is None:
            return False
        if r.state == WAITING:
            self.waiting.remove(r)
            r.aborted = True
            self._finish(r, max(now, self._now), self._buffered)
        else:
            r.aborted = True
            self._aborts = True
            self._wake(now)
        return True

    def close_session(self, session_id: str) -> bool:
        """Drop a session's reference to its KV (``/close_session``); True if it had one."""
        return self.cache.refs.close(session_id)

    def can_flush(self) -> bool:
        """SGLang flushes only a fully idle engine; requests waiting in a paused one are
        ignored (they hold no KV: a retract pause released theirs)."""
        busy = self.running or self.chunked is not None or self._plan is not None
        return not busy and (not self.waiting or self.paused is not None)

    def flush_cache(self) -> bool:
        """Drop every cached prefix; refused (False) while requests run or wait, as SGLang."""
        if not self.can_flush():
            return False
        self.cache.flush()
        return True

    def visible_tokens(self, rid: str) -> int | None:
        """Output tokens of ``rid`` generated by the last ``advance`` time (for streaming)."""
        r = self.reqs.get(rid)
        if r is None:
            return None
        p = self._plan
        if r.in_plan and p is not None and p.steps > 1 and self._now > p.start:
            return r.n_out + steps_within(p.a, p.q, self._now - p.start, p.steps)
        return r.n_out

    def output_ids(self, rid: str) -> array | None:
        r = self.reqs.get(rid)
        return None if r is None else r.out_ids

    def _wake(self, now: float) -> None:
        self._stalled = False
        if self._plan is None:
            self._t = max(self._t, now)
        else:
            self._truncate(now)

    # ---- the loop -------------------------------------------------------------------------
    def _step_to(self, until: float, out: list[Completion]) -> None:
        while True:
            p = self._plan
            if p is None:
                if not (self.running or self.waiting or self.chunked):
                    self.ratio = self.cfg.server.init_new_token_ratio
                    break
                if self._stalled or self._t > until:
                    break
                if self.paused is not None:
                    self._reap_aborted(self._t, out)
                    break
                p = self._make_plan(self._t, out)
                if p is None:
                    self._stalled = True
                    break
                self._plan = p
            if p.end > until:
                break
            self._plan = None
            self._commit(p, out)
        if until > self._now:
            self._now = until

    def _truncate(self, now: float) -> None:
        """Cut a decode span at the end of the step in progress at ``now``."""
        p = self._plan
        if p is None or p.steps <= 1 or now >= p.end:
            return
        elapsed = now - p.start
        k = steps_within(p.a, p.q, elapsed, p.steps) if elapsed > 0 else 0
        new = k if k and span(p.a, p.q, k) >= elapsed else k + 1
        if new < p.steps:
            p.steps = new
            p.end = p.start + span(p.a, p.q, new)

    def _make_plan(self, t: float, out: list[Completion]) -> Plan | None:
        self.cache.settle()  # the last iteration's load-backs have completed
        self._reap_aborted(t, out)
        rf = self.roofline
        if self.running and self._free() + self.cache.evictable < len(self.running):
            retract(self, t, out)
        self._head_path = []
        items, loads = schedule_prefill(self, t)
        if not items and not self.running and self.chunked is not None:
            release(self, self.chunked)  # a chunked prefill that cannot get KV: start it over
            self.waiting.appendleft(self.chunked)
            self.chunked = None
            items, loads = schedule_prefill(self, t)
        decode = list(self.running)
        if items and not self.cfg.server.enable_mixed_chunk:
            decode = []  # SGLang runs a prefill batch alone: the running requests wait for it
        b = len(decode)
        if not items and not b:
            return None
        kv, left = 0, 1 << 62
        for r in decode:
            r.in_plan = True
            kv += r.kv_len
            if r.target - r.n_out < left:
                left = r.target - r.n_out
        if items:
            self._ensure_free(sum(n for _, n in items) + b)
            prefill_s = sum(prefill_seconds(rf, n, r.kv_len) for r, n in items)
            a, q, steps = iteration_seconds(rf, b, kv, prefill_s, *loads), 0.0, 1
        else:
            steps = min(left, (self._free() + self.cache.evictable) // b)
            if (self.waiting or self.chunked is not None) and may_admit_during_span(self, b):
                steps = min(steps, RECHECK_STEPS)
            if self.max_span_steps is not None:
                steps = min(steps, self.max_span_steps)
            # KV for the span is taken (evicting LRU cache) when it commits, so a span cut short
            # by an arrival evicts only what its executed steps used
            a, q = decode_step(rf, b, kv), decode_growth(rf, b)
        return Plan(t, t + span(a, q, steps), steps, decode, items, a, q, self._head_path)

    def _commit(self, p: Plan, out: list[Completion]) -> None:
        t, steps, c = p.end, p.steps, self.counters
        if not p.prefill:
            # a step-by-step engine re-matches the blocked head of the queue every iteration,
            # keeping its cached prefix fresh in the LRU: do the same before taking KV
            if p.touched:
                self.cache.tree.stamp(p.touched, p.start + span(p.a, p.q, steps - 1))
            self._ensure_free(steps * len(p.decode))
        ending = False
        for r in p.decode:
            r.in_plan = False
            r.n_out += steps
            r.kv_len += steps
            r.private += steps
            if r.n_out >= r.target or r.aborted:
                ending = True
        self._private += steps * len(p.decode)
        gen = steps * len(p.decode)
        for r, n in p.prefill:
            r.kv_len += n
            r.private += n
            self._private += n
            c.prefill_tokens += n
            self._cache_prefix(r, t)
            if r.kv_len == r.fill_len:
                r.n_out += 1
                gen += 1
                if r.first_token_time is None:
                    r.first_token_time = t
                    c.ttft_sum += t - r.arrival
                    self.hist_ttft.observe(t - r.arrival)
                if self.chunked is r:
                    self.chunked = None
                r.state = RUNNING
                self.running.append(r)
                ending = ending or r.n_out >= r.target or r.aborted
        c.generation_tokens += gen
        c.iterations += 1
        c.busy_seconds += t - p.start
        if p.prefill:
            c.prefill_busy_seconds += t - p.start
        elif p.decode:
            _decode_moments(c.decode_moments, len(p.decode), steps, t - p.start)
        if p.decode:
            c.decode_steps += steps
            self.ratio = max(self.ratio - self._decay * steps, self._min_ratio)
        if ending:
            for r in self.running:
                if r.n_out >= r.target or r.aborted:
                    self._finish(r, t, out)
            self.running = [r for r in self.running if r.state == RUNNING]
        if self.chunked is not None and self.chunked.aborted:
            self._finish(self.chunked, t, out)
            self.chunked = None
        self._t = t
        self._window.append((t, c.generation_tokens, c.busy_seconds))

    def _cache_prefix(self, r: Req, t: float) -> None:
        """Insert the computed, page-aligned prefix of ``r`` and move its lock to the new end."""
        aligned = self._align(r.kv_len)
        if aligned <= r.tree_len:
            return
        last, _ = self.cache.insert(r.seq(aligned), t, r.last_node, 4 * r.tree_len)
        self.cache.extend_lock(r.last_node, last)
        r.last_node = last
        moved = aligned - r.tree_len
        r.private -= moved
        self._private -= moved
        r.tree_len = aligned

    def _finish(self, r: Req, t: float, out: list[Completion], error: str | None = None) -> None:
        if r.state in (PREFILL, RUNNING):
            aligned = self._align(r.kv_len)
            leaf = r.last_node
            if aligned > r.tree_len:
                leaf, _ = self.cache.insert(r.seq(aligned), t, r.last_node, 4 * r.tree_len)
            if r.session_id is not None and not r.aborted and error is None and self.cfg.server.enable_session_radix_cache:
                self.cache.refs.register(r.session_id, r.session_gen, leaf)
            self.cache.unlock(r.last_node)
            self._private -= r.private
            r.private = 0
        reason = "abort" if r.aborted or error else ("length" if r.target >= r.max_new else "stop")
        r.state = DONE
        r.in_plan = False
        del self.reqs[r.rid]
        c = self.counters
        dev, host, sto = r.cached or (0, 0, 0)
        c.prompt_tokens += r.prompt_len
        c.cached_device += dev
        c.cached_host += host
        c.cached_storage += sto
        c.e2e_sum += t - r.arrival
        self.hist_e2e.observe(t - r.arrival)
        if reason == "abort":
            c.requests_aborted += 1
        else:
            c.requests_finished += 1
        out.append(Completion(
            r.rid, t, self.dp_rank, r.prompt_len, r.n_out, dev + host + sto, dev, host, sto,
            r.out_ids[: r.n_out], reason, r.arrival, r.first_token_time, r.retractions, error,
        ))

    def _reap_aborted(self, t: float, out: list[Completion]) -> None:
        if not self._aborts:
            return
        self._aborts = False
        if any(r.aborted for r in self.running):
            for r in self.running:
                if r.aborted:
                    self._finish(r, t, out)
            self.running = [r for r in self.running if r.state == RUNNING]
        if self.chunked is not None and self.chunked.aborted:
            self._finish(self.chunked, t, out)
            self.chunked = None

    # ---- memory -------------------------------------------------------------------------
    def _free(self) -> int:
        return self.capacity - self.cache.device_tokens - self._private

    def _ensure_free(self, tokens: int) -> bool:
        free = self._free()
        if free < tokens:
            self.cache.evict_device(tokens - free)
        return self._free() >= tokens

    def _align(self, tokens: int) -> int:
        return tokens - tokens % self.page

    # ---- observation ----------------------------------------------------------------------
    def _inflight(self) -> tuple[int, int]:
        """(decode steps done, batch) of the span in progress at the last advance time."""
        p = self._plan
        if p is None or p.steps <= 1 or self._now <= p.start:
            return 0, 0
        return steps_within(p.a, p.q, self._now - p.start, p.steps), len(p.decode)

    def stats(self) -> EngineStats:
        """Snapshot at the last advance time (see ``metrics.engine_stats``)."""
        return engine_stats(self)


def _decode_moments(m: list[float], batch: int, steps: int, seconds: float) -> None:
    """Add a span of ``steps`` decode steps of ``batch`` requests lasting ``seconds`` in all to
    SGLang's moment sums (b is constant over the span, so Σb·t = b·Σt)."""
    us = seconds * 1e6
    m[0] += steps
    m[1] += steps * batch
    m[2] += us
    m[3] += steps * batch * batch
    m[4] += batch * us
    m[5] += steps * batch
