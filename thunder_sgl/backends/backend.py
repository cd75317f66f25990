"""The backend model: one capacity unit per (worker, dp_rank).

A backend has tier capacities in tokens — HBM (``max_total_num_tokens`` of the rank), HiCache
host memory and storage — reload bandwidths, live usage from the engine (``/v1/loads`` and
``/metrics``), health and the time of its last good reading. Stale readings and failing health
make the backend *unavailable*: it counts as full and nothing is placed on it.

Pool size across tiers. With HiCache's default ``write_through`` policy every block on the
device is also written to host memory, so the host tier is *inclusive*: the distinct tokens a
rank can keep are ``max(HBM, host)``, not their sum. With ``write_back`` a block reaches host
memory only when evicted from HBM, so the tiers add up. The storage (L3) tier backs up the host
tier the same way. ``pool_tokens`` applies this; treating an inclusive host tier as additive
would let the scheduler overcommit by a whole HBM's worth of tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

INCLUSIVE_WRITE_POLICIES = frozenset({"write_through", "write_through_selective"})


def backend_key(worker_url: str, dp_rank: int) -> str:
    """Stable key of a capacity unit: the worker URL, plus ``#dp<rank>`` for DP ranks > 0."""
    return worker_url if dp_rank == 0 else f"{worker_url}#dp{dp_rank}"


@dataclass(slots=True)
class Tiers:
    """Capacities in tokens and reload bandwidths in bytes/s of one rank."""

    hbm_tokens: int
    host_tokens: int = 0
    storage_tokens: int = 0
    host_inclusive: bool = True
    """True for write_through(_selective): host holds a copy of device blocks."""
    kv_bytes_per_token: int = 0
    host_bandwidth: float = 0.0
    storage_bandwidth: float = 0.0

    def pool(self, tier_aware: bool, host_weight: float = 1.0, storage_weight: float = 1.0) -> float:
        """Distinct tokens the rank can keep cached across tiers (HBM only if not tier-aware)."""
        h = float(self.hbm_tokens)
        if not tier_aware:
            return h
        host = host_weight * self.host_tokens
        storage = storage_weight * self.storage_tokens
        below = max(h, host) if self.host_inclusive else h + host
        # L3 backs up host pages (write-through to storage): inclusive of the levels above.
        return max(below, storage)

    def reload_seconds(self, tokens: int, tier: str = "host") -> float:
        """Time to load ``tokens`` of KV back into HBM from ``tier`` (0 if unknown bandwidth)."""
        bw = self.host_bandwidth if tier == "host" else self.storage_bandwidth
        if bw <= 0 or self.kv_bytes_per_token <= 0:
            return 0.0
        return tokens * self.kv_bytes_per_token / bw


@dataclass(slots=True)
class Live:
    """The latest engine readings for one rank (``/v1/loads`` + ``/metrics``)."""

    used_tokens: int = 0
    host_used_tokens: int = 0
    running_reqs: int = 0
    waiting_reqs: int = 0
    token_usage: float = 0.0
    cache_hit_rate: float = 0.0
    retracted_reqs: int = 0
    """Requests the engine retracted (queues.retracted) at the last reading."""
    updated_at: float | None = None
    """Router clock time of the last good reading; None: never read."""


@dataclass(slots=True, eq=False)
class Backend:
    """One scheduling target: a (worker, dp_rank) with its tiers, live numbers and health."""

    worker_url: str
    dp_rank: int
    tiers: Tiers
    live: Live = field(default_factory=Live)
    healthy: bool = True
    draining: bool = False
    """Removed from the pool: nothing new is placed, its programs migrate."""
    monitored: bool = False
    """True when a monitor feeds live readings; unmonitored backends are never stale
    (used in pure scheduler tests and in-process simulations)."""
    model_id: str = "unknown"
    dp_size: int = 1
    """DP ranks of the worker: with more than one, requests are pinned to this rank."""
    inflight: int = 0
    """Requests the router has in flight on this backend (program and stateless)."""

    @property
    def key(self) -> str:
        return backend_key(self.worker_url, self.dp_rank)

    def stale(self, now: float, stale_after: float) -> bool:
        if not self.monitored:
            return False
        return self.live.updated_at is None or now - self.live.updated_at > stale_after

    def available(self, now: float, stale_after: float) -> bool:
        """Healthy, fresh and not draining: may receive programs and requests."""
        return self.healthy and not self.draining and not self.stale(now, stale_after)

    def under_pressure(self, waiting_threshold: int) -> bool:
        """The engine itself reports queueing or retraction, whatever our accounting says."""
        return self.live.waiting_reqs > waiting_threshold or self.live.retracted_reqs > 0
