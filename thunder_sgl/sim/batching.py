"""Batch admission and retraction of one engine (what joins the running batch, what leaves it),
as SGLang 0.5's scheduler does them.

``schedule_prefill`` is the PrefillAdder under the FCFS policy: the queue head is admitted when
``extend + min(max_new − out, clip)`` fits in ``free + evictable − reserve`` (reserve =
new_token_ratio × the running requests' remaining output, clipped, plus one decode slot each,
plus what this round already admitted); it locks its prefix, loads host/storage hits back into
HBM and takes up to ``chunked_prefill_size`` new tokens; at most one request is chunked at a
time; the first request that does not fit blocks the rest. ``retract`` is ``retract_decode``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from thunder_sgl.sim.request import PREFILL, RUNNING, WAITING, Completion, Req
from thunder_sgl.sim.tiers import PrefixHit
from thunder_sgl.sim.timing import h2d_seconds, storage_fetch_seconds

if TYPE_CHECKING:  # pragma: no cover
    from thunder_sgl.sim.engine import Engine


def schedule_prefill(e: Engine, t: float) -> tuple[list[tuple[Req, int]], tuple[float, float]]:
    """Pick this iteration's prefill work (SGLang's PrefillAdder, FCFS); returns the (request,
    new tokens) chunks and the load-back seconds of their host/storage hits: (host→device
    copies, storage→host reads)."""
    if not e.waiting and e.chunked is None:
        return [], (0.0, 0.0)
    s, cache, rf = e.cfg.server, e.cache, e.roofline
    clip = s.clip_max_new_tokens
    rem_chunk, rem_input = s.chunked_prefill_size, s.max_prefill_tokens
    # reserve: the running requests' expected output, plus this iteration's decode slots
    offset = e.ratio * sum(min(r.max_new - r.n_out, clip) for r in e.running) + len(e.running)
    items: list[tuple[Req, int]] = []
    load_s = fetch_s = 0.0
    hit_tokens = new_tokens = 0
    c = e.chunked
    if c is not None:
        left = c.fill_len - c.kv_len
        n = min(left, rem_chunk, max(0, int(e._free() + cache.evictable - offset)))
        n = n if n == left else e._align(n)
        if n > 0:
            items.append((c, n))
            rem_chunk -= n
            rem_input -= n
            offset += n
            new_tokens += n
    n_running = len(e.running) + (c is not None)
    while e.waiting and rem_chunk > 0 and n_running < s.max_running_requests:
        r = e.waiting[0]
        hit = cache.match(r.seq(e._align(r.fill_len - 1)), t)
        extend = r.fill_len - hit.device_tokens
        total = extend + min(r.max_new - r.n_out, clip)
        idle = not e.running and not items and e.chunked is None
        if not fits(e, total, extend, offset, idle):
            e._head_path = hit.path
            break
        left = r.fill_len - hit.total
        if (left > rem_chunk and e.chunked is not None) or (left >= rem_input and items):
            break
        last = hit.path[-1] if hit.path else cache.tree.root
        cache.lock(last)  # locking the hit may shrink what is evictable: check again
        if not fits(e, total, extend, offset, idle):
            cache.unlock(last)
            e._head_path = hit.path
            break
        if hit.storage_tokens:  # storage → host first (SGLang prefetches when the request arrives)
            hit, last = cache.prefetch_locked(hit, last, t)
            left = r.fill_len - hit.total
        if hit.load_tokens:
            if e._ensure_free(hit.load_tokens):
                cache.promote(hit)
                h2d = h2d_seconds(rf, hit.host_tokens + hit.storage_tokens)
                fs = storage_fetch_seconds(rf, hit.storage_tokens)
                dt = h2d + fs  # L3 hits are read into host first, then copied
                load_s += h2d
                fetch_s += fs
                e.counters.load_back_seconds += dt
                e.hist_load_back.observe(dt)
                e.counters.load_back_ops += 1
            else:  # no room to load back: recompute the continuation
                cache.unlock(last)
                hit = PrefixHit(hit.path[: hit.device_nodes], hit.device_tokens, 0, 0, hit.device_nodes)
                last = hit.path[-1] if hit.path else cache.tree.root
                cache.lock(last)
                left = r.fill_len - hit.total
        e.waiting.popleft()
        r.state, r.last_node = PREFILL, last
        r.kv_len = r.tree_len = hit.total
        if r.cached is None:
            r.cached = (hit.device_tokens, hit.host_tokens, hit.storage_tokens)
        if r.recompute_upto:
            e.counters.recomputed_tokens += max(0, r.recompute_upto - hit.total)
            r.recompute_upto = 0
        n = min(left, rem_chunk)
        if n < left:
            n = e._align(n)
            e.chunked = r
        items.append((r, n))
        hit_tokens += hit.total
        new_tokens += n
        offset += n + (min(r.max_new - r.n_out, clip) if n == left else 0)
        rem_chunk -= n
        rem_input -= n
        n_running += 1
        if e.chunked is r:
            break
    if hit_tokens + new_tokens:
        e._hit_rate = hit_tokens / (hit_tokens + new_tokens)
    return items, (load_s, fetch_s)


def retract(e: Engine, t: float, out: list[Completion]) -> None:
    """Decode does not fit: retract requests (fewest output tokens first, then longest prompt)
    until free KV covers ``retract_decode_steps`` steps of the rest, and re-estimate the ratio."""
    s = e.cfg.server
    order = sorted(e.running, key=lambda r: (r.n_out, -r.prompt_len), reverse=True)
    retracted: list[Req] = []
    first = True
    while first or e._free() + e.cache.evictable < s.retract_decode_steps * len(order):
        if len(order) == 1:
            break
        first = False
        r = order.pop()
        release(e, r)
        r.retractions += 1
        e.counters.retractions += 1
        e.counters.retracted_input_tokens += r.prompt_len
        e.counters.retracted_output_tokens += r.n_out
        retracted.append(r)
    if len(order) == 1 and e._free() + e.cache.evictable < 1:
        e._finish(order[0], t, out, error="KV cache out of memory for a single request")
        order = []
    e.running = [r for r in e.running if r.state == RUNNING]
    e.waiting.extendleft(reversed(retracted))
    if order:
        decoded = sum(r.n_out for r in order) + s.retract_decode_steps * len(order)
        e.ratio = min(1.0, decoded / max(1, sum(r.max_new for r in order)))


def release(e: Engine, r: Req) -> None:
    """Free a request's KV (its cached prefix stays, unlocked) and send it back to wait."""
    e.cache.unlock(r.last_node)
    e._private -= r.private
    r.private = 0
    r.recompute_upto = max(r.recompute_upto, r.kv_len)
    r.kv_len = r.tree_len = 0
    r.last_node = e.cache.tree.root
    r.fill_len = r.prompt_len + r.n_out
    r.state = WAITING
    r.in_plan = False


def fits(e: Engine, total: int, extend: int, offset: float, idle: bool) -> bool:
    """SGLang's admission test; an idle engine takes its head whenever the prompt fits."""
    room = e._free() + e.cache.evictable
    return total < room - offset or (idle and extend < room)


def may_admit_during_span(e: Engine, batch: int) -> bool:
    """Could the blocked queue head become admissible during a pure decode span?

    Per step, free + evictable KV shrinks by ``batch`` while the reserve shrinks by at most
    ``ratio × batch`` (each running request's remaining output drops by one) plus
    ``decay × Σ remaining`` (the ratio decays). Unless the second outweighs the first, the room
    for admission only shrinks until the span ends, and the span needs no re-check.
    """
    if batch >= e.cfg.server.max_running_requests or e.ratio <= e._min_ratio:
        return False
    clip = e.cfg.server.clip_max_new_tokens
    remaining = sum(min(r.max_new - r.n_out, clip) for r in e.running)
    return e._decay * remaining > batch * (1.0 - e.ratio)
