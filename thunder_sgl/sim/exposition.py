"""What a worker reports: engine snapshots, ``/v1/loads`` entries and ``/metrics`` text.

Names follow SGLang 0.5.23 (sglang-surface.md §1.3, §1.4, §2.3). Definitions where SGLang's are
not obvious:

- ``num_used_tokens`` / ``token_usage``: capacity − free − evictable, as SGLang (cached prefixes
  nobody holds count as free); ``sim:device_used_tokens`` counts them as used.
- ``num_total_tokens``: KV tokens allocated in HBM, cached prefixes included.
- ``cache_hit_rate``: hit / (hit + new) tokens of the last prefill batch (a gauge, not cumulative;
  the cumulative rate is ``sglang:cached_tokens_total`` / ``sglang:prompt_tokens_total``).
- ``gen_throughput`` / ``utilization``: output tokens per second and busy fraction over the last
  5 simulated seconds.
- ``queues.retracted`` / ``sglang:num_retracted_reqs``: retracted requests now waiting.

Counters are monotonic; metrics with a ``sim:`` prefix are the simulator's own.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Any

from thunder_sgl.sim.request import PREFILL, EngineStats

if TYPE_CHECKING:  # pragma: no cover
    from thunder_sgl.sim.config import SimConfig
    from thunder_sgl.sim.engine import Engine

WINDOW_S = 5.0
"""Simulated seconds over which gen_throughput and utilization are measured."""
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)
LOAD_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class Histogram:
    """Cumulative Prometheus histogram with fixed buckets."""

    __slots__ = ("buckets", "counts", "sum", "count")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, v)] += 1
        self.sum += v
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, acc = [], 0
        for le, c in zip(self.buckets, self.counts, strict=False):
            acc += c
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {acc}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {self.sum!r}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


def engine_stats(e: Engine) -> EngineStats:
    """Snapshot of an engine at its last advance time (decode progress in flight included)."""
    now, cache, c = e._now, e.cache, e.counters
    steps, batch = e._inflight()
    inflight = steps * batch
    private = e._private + inflight
    # a decode span takes its KV when it commits; until then count what its steps used so far,
    # as evicted from the LRU cache if the pool is full
    overflow = max(0, cache.device_tokens + private - e.capacity)
    evictable = cache.evictable - overflow
    device_used = cache.device_tokens + private - overflow
    used = cache.protected + private
    while len(e._window) > 1 and e._window[1][0] <= now - WINDOW_S:
        e._window.popleft()
    gen = util = 0.0
    if e._window and now > e._window[0][0]:
        t0, g0, b0 = e._window[0]
        gen = (c.generation_tokens + inflight - g0) / (now - t0)
        util = min(1.0, (c.busy_seconds - b0) / (now - t0))
    prefilling = sum(1 for r in e.reqs.values() if r.state == PREFILL)
    keys = {r.routing_key for r in e.running if r.routing_key}
    host, sto = cache.host, cache.storage
    return EngineStats(
        time=now,
        dp_rank=e.dp_rank,
        num_running_reqs=len(e.running) + prefilling,
        num_waiting_reqs=len(e.waiting),
        num_retracted_waiting=sum(1 for r in e.waiting if r.retractions),
        num_waiting_uncached_tokens=sum(r.fill_len for r in e.waiting),
        max_running_requests=e.cfg.server.max_running_requests,
        max_total_num_tokens=e.capacity,
        device_used_tokens=device_used,
        num_used_tokens=used,
        evictable_tokens=evictable,
        free_tokens=e.capacity - device_used,
        num_active_tokens=sum(r.kv_len for r in e.running) + inflight,
        host_used_tokens=cache.host_used,
        host_total_tokens=host.capacity if host else 0,
        storage_used_tokens=cache.storage_used,
        storage_total_tokens=sto.capacity if sto else 0,
        token_usage=used / e.capacity,
        cache_hit_rate=e._hit_rate,
        gen_throughput=gen,
        utilization=util,
        new_token_ratio=e.ratio,
        num_unique_routing_keys=len(keys),
        counters=c,
        evicted_device_tokens=cache.counters.evicted_device,
        host_evicted_tokens=host.evicted if host else 0,
        storage_evicted_tokens=sto.evicted if sto else 0,
        host_backup_tokens=host.backed_up if host else 0,
        storage_backup_tokens=sto.backed_up if sto else 0,
        loaded_from_host_tokens=cache.counters.loaded_from_host,
        loaded_from_storage_tokens=cache.counters.loaded_from_storage,
    )


def loads_entry(s: EngineStats, cfg: SimConfig, include: set[str]) -> dict[str, Any]:
    """One DP rank's entry of ``/v1/loads`` (LoadSnapshot)."""
    d: dict[str, Any] = {
        "dp_rank": s.dp_rank,
        "num_running_reqs": s.num_running_reqs,
        "num_waiting_reqs": s.num_waiting_reqs,
        "num_waiting_uncached_tokens": s.num_waiting_uncached_tokens,
        "num_total_reqs": s.num_running_reqs + s.num_waiting_reqs,
        "max_running_requests": s.max_running_requests,
        "num_used_tokens": s.num_used_tokens,
        "num_total_tokens": s.device_used_tokens,
        "num_active_tokens": s.num_active_tokens,
        "max_total_num_tokens": s.max_total_num_tokens,
        "token_usage": round(s.token_usage, 6),
        "active_token_usage": round(s.num_active_tokens / s.max_total_num_tokens, 6),
        "gen_throughput": round(s.gen_throughput, 3),
        "cache_hit_rate": round(s.cache_hit_rate, 6),
        "utilization": round(s.utilization, 6),
        "total_prefill_uncached_tokens": s.counters.prefill_tokens,
        "total_prefill_busy_us": int(s.counters.prefill_busy_seconds * 1e6),
        "decode_moments": [round(x, 3) for x in s.counters.decode_moments] if s.counters.decode_moments[0] else None,
    }
    if "memory" in include or "all" in include:
        m, tp = cfg.model, cfg.server.tp_size
        d["memory"] = {
            "weight_gb": round((m.dense_params_b + m.expert_params_b) * m.weight_bytes_per_param / tp, 3),
            "kv_cache_gb": round(s.max_total_num_tokens * cfg.kv_bytes_per_token / 1e9, 3),
            "graph_gb": 0.5,
            "token_capacity": s.max_total_num_tokens,
        }
    if "queues" in include or "all" in include:
        d["queues"] = {
            "waiting": s.num_waiting_reqs,
            "grammar": 0,
            "paused": 0,
            "retracted": s.num_retracted_waiting,
            "prealloc_ready": 0,
        }
    return d


def metrics_text(stats: list[EngineStats], cfg: SimConfig) -> str:
    """Prometheus text exposition of every DP rank."""
    gauges: dict[str, list[tuple[str, float]]] = {}
    counters: dict[str, list[tuple[str, float]]] = {}
    hicache = cfg.hicache.enabled
    base = f'model_name="{cfg.model.name}",engine_type="unified",tp_rank="0",pp_rank="0"'
    for s in stats:
        lb = f'{base},dp_rank="{s.dp_rank}"'
        c = s.counters

        def g(name: str, v: float, labels: str = lb) -> None:
            gauges.setdefault(name, []).append((labels, v))

        def k(name: str, v: float, labels: str = lb) -> None:
            counters.setdefault(name, []).append((labels, v))

        g("sglang:max_total_num_tokens", s.max_total_num_tokens)
        g("sglang:num_used_tokens", s.num_used_tokens)
        g("sglang:token_usage", s.token_usage)
        g("sglang:kv_used_tokens", s.num_used_tokens)
        g("sglang:kv_available_tokens", s.free_tokens)
        g("sglang:kv_evictable_tokens", s.evictable_tokens)
        g("sglang:num_running_reqs", s.num_running_reqs)
        g("sglang:num_queue_reqs", s.num_waiting_reqs)
        g("sglang:num_retracted_reqs", s.num_retracted_waiting)
        g("sglang:gen_throughput", s.gen_throughput)
        g("sglang:utilization", s.utilization)
        g("sglang:cache_hit_rate", s.cache_hit_rate)
        g("sglang:num_unique_running_routing_keys", s.num_unique_routing_keys)
        g("sim:device_used_tokens", s.device_used_tokens)
        g("sim:new_token_ratio", s.new_token_ratio)
        g("sim:virtual_time_seconds", s.time)
        k("sglang:prompt_tokens_total", c.prompt_tokens)
        k("sglang:generation_tokens_total", c.generation_tokens)
        for src, v in (("device", c.cached_device), ("host", c.cached_host), ("storage", c.cached_storage)):
            k("sglang:cached_tokens_total", v, f'{lb},cache_source="{src}"')
        k("sglang:evicted_tokens_total", s.evicted_device_tokens)
        k("sglang:num_requests_total", c.requests_finished)
        k("sglang:num_aborted_requests_total", c.requests_aborted)
        k("sglang:num_retracted_requests_total", c.retractions)
        k("sglang:num_retracted_input_tokens_total", c.retracted_input_tokens)
        k("sglang:num_retracted_output_tokens_total", c.retracted_output_tokens)
        k("sim:prefill_computed_tokens_total", c.prefill_tokens)
        k("sim:recomputed_tokens_total", c.recomputed_tokens)
        if hicache:
            b = cfg.kv_bytes_per_token
            loaded = s.loaded_from_host_tokens + s.loaded_from_storage_tokens
            g("sglang:hicache_host_total_tokens", s.host_total_tokens)
            g("sglang:hicache_host_used_tokens", s.host_used_tokens)
            k("sglang:load_back_tokens_total", loaded)
            k("sglang:load_back_bytes_total", loaded * b)
            k("sglang:hicache_backup_tokens_total", s.host_backup_tokens)
            k("sglang:hicache_backup_bytes_total", s.host_backup_tokens * b)
            k("sim:hicache_host_evicted_tokens_total", s.host_evicted_tokens)
            if cfg.hicache.storage_backend is not None:
                sl = f'{lb},storage_backend="{cfg.hicache.storage_backend}"'
                k("sglang:backuped_tokens_total", s.storage_backup_tokens, sl)
                k("sglang:prefetched_tokens_total", s.loaded_from_storage_tokens, sl)
                g("sim:hicache_storage_total_tokens", s.storage_total_tokens)
                g("sim:hicache_storage_used_tokens", s.storage_used_tokens)
                k("sim:hicache_storage_loaded_tokens_total", s.loaded_from_storage_tokens)
    lines: list[str] = []
    for kind, table in (("gauge", gauges), ("counter", counters)):
        for name, rows in table.items():
            lines.append(f"# HELP {name} {name.split(':', 1)[1].replace('_', ' ')}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(f"{name}{{{labels}}} {float(v)!r}" for labels, v in rows)
    return "\n".join(lines) + "\n"


def histogram_text(named: dict[str, list[tuple[int, Histogram]]], cfg: SimConfig) -> str:
    """Histograms of every DP rank: ``{name: [(dp_rank, histogram), ...]}``."""
    base = f'model_name="{cfg.model.name}",engine_type="unified",tp_rank="0",pp_rank="0"'
    lines: list[str] = []
    for name, rows in named.items():
        lines.append(f"# HELP {name} {name.split(':', 1)[1].replace('_', ' ')}")
        lines.append(f"# TYPE {name} histogram")
        for rank, h in rows:
            lines.extend(h.lines(name, f'{base},dp_rank="{rank}"'))
    return "\n".join(lines) + "\n" if lines else ""


def front_end_text(cfg: SimConfig, client_disconnects: int) -> str:
    """What the HTTP front end of a worker counts (not an engine's): requests whose client left
    before their answer ended, each aborted in its engine."""
    name = "sim:client_disconnects_total"
    return (f"# HELP {name} requests whose client left before the answer ended (aborted)\n"
            f"# TYPE {name} counter\n"
            f'{name}{{model_name="{cfg.model.name}"}} {float(client_disconnects)!r}\n')
