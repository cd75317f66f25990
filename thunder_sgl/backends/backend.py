"""The backend model: one capacity unit per (worker, dp_rank).

A backend has tier capacities in tokens — HBM (``max_total_num_tokens`` of the rank), HiCache
host memory and storage — reload bandwidths, live usage from the engine (``/v1/loads`` and
``/metrics``), health and the time of its last good reading. Stale readings, failing health and
a failed weight update (``weights_pending``) make the backend *unavailable*: it counts as full
and nothing is placed on it. An engine paused behind the router (``engine_paused``,
``backends.pause``) stays available but frozen: its programs stay, nothing new is placed there.

Pool size across tiers. With HiCache's default ``write_through`` policy every block on the
device is also written to host memory, so the host tier is *inclusive*: the distinct tokens a
rank can keep are ``max(HBM, host)``, not their sum. With ``write_back`` a block reaches host
memory only when evicted from HBM, so the tiers add up. The storage (L3) tier backs up the host
tier the same way. ``pool_tokens`` applies this; treating an inclusive host tier as additive
would let the scheduler overcommit by a whole HBM's worth of tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from thunder_sgl.backends.parse import RankLoad, TierReading


class AdmissionLevel(Protocol):
    """What the backend keeps of its admission rule's state (the rules: ``scheduler.goodput``,
    ``scheduler.occupancy``)."""

    @property
    def extra(self) -> float:
        """Tokens admitted beyond ``λ_max·pool``."""
        ...

    @property
    def protect(self) -> float:
        """Tokens of KV kept referenced (inf: all that fits)."""
        ...

    @property
    def hbm_extra(self) -> float:
        """Tokens by which the HBM condition's limit rises (``scheduler.gate``)."""
        ...

    def view(self) -> dict[str, object]:
        """What ``GET /workers`` and ``/metrics`` show of it."""
        ...

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
    prefill_tokens_total: int = 0
    """Tokens the engine prefilled since it started (``total_prefill_uncached_tokens``)."""
    engine_busy_s_total: float = 0.0
    """Seconds the engine spent in prefill and decode iterations since it started
    (``total_prefill_busy_us`` + Σt of ``decode_moments``)."""
    prefill_busy_s_total: float = 0.0
    decode_moments: tuple[float, ...] | None = None
    """SGLang's cumulative ``decode_moments`` [n, Σb, Σt (s), Σb², Σb·t (s)] (None: not reported);
    the goodput rule fits the decode iteration time on the batch size from their differences."""
    reports_busy: bool = False
    """The engine reports those counters (SGLang 0.5.23 does; older versions do not)."""
    tier: TierReading | None = None
    """The HiCache reading of ``/metrics`` (None: no HiCache, or not read yet)."""
    host_stale_since: tuple[int, int] | None = None
    """Set by ``flushed``: (prefill tokens, decode iterations) at the flush; while the engine's
    counters still show these, its host-used gauge is stale."""

    def read(self, r: RankLoad, now: float, host: TierReading | None = None) -> None:
        """Take one rank's ``/v1/loads`` entry (and its host-tier gauges) as read at ``now``."""
        self.used_tokens, self.running_reqs, self.waiting_reqs = r.used_tokens, r.running_reqs, r.waiting_reqs
        self.token_usage, self.cache_hit_rate, self.retracted_reqs = r.token_usage, r.cache_hit_rate, r.retracted_reqs
        self.prefill_tokens_total, self.prefill_busy_s_total = r.prefill_tokens_total, r.prefill_busy_s_total
        self.engine_busy_s_total = r.prefill_busy_s_total + (r.decode.busy_s if r.decode is not None else 0.0)
        dm = r.decode
        self.decode_moments = None if dm is None else (dm.n, dm.sum_b, dm.sum_t_us / 1e6, dm.sum_b2, dm.sum_bt / 1e6)
        self.reports_busy = self.reports_busy or r.prefill_busy_s_total > 0 or r.decode is not None
        if host is not None:
            self.tier = host
            batches = (r.prefill_tokens_total, int(dm.n) if dm is not None else 0)
            if self.host_stale_since is not None and batches == self.host_stale_since:
                self.host_used_tokens = 0  # flushed, and no batch ran since: the gauge is stale
            else:
                self.host_stale_since = None
                self.host_used_tokens = host.host_used_tokens
        self.updated_at = now

    def flushed(self) -> None:
        """The engine's device and host tiers were flushed (``/flush_cache``; storage stays).
        SGLang refreshes ``hicache_host_used_tokens`` only on its next batch, so until the
        engine's prefill or decode counters move, the host tier reads as empty."""
        self.used_tokens = 0
        self.host_used_tokens = 0
        dm = self.decode_moments
        self.host_stale_since = (self.prefill_tokens_total, int(dm[0]) if dm is not None else 0)


TOOL_BINS = tuple(0.05 * 1.5 ** i for i in range(30))
"""Upper edges (seconds) of the tool-time histogram: 0.05 s to ~6 hours, ×1.5 apart."""


@dataclass(slots=True)
class ToolTimes:
    """A decaying histogram of tool times on log-spaced bins (``TOOL_BINS``); each new time
    multiplies the old weights by ``keep``, so the last few hundred tool calls count."""

    weights: list[float] = field(default_factory=lambda: [0.0] * len(TOOL_BINS))
    keep: float = 0.995

    def add(self, seconds: float) -> None:
        w = self.weights
        for i in range(len(w)):
            w[i] *= self.keep
        for i, edge in enumerate(TOOL_BINS):
            if seconds <= edge or i == len(TOOL_BINS) - 1:
                w[i] += 1.0
                return

    def survival(self, seconds: float) -> float:
        """The share of tool calls longer than ``seconds`` (1 when none seen), log-linear
        within the bin that holds it."""
        total = sum(self.weights)
        if total <= 0:
            return 1.0
        below = 0.0
        lo = 0.0
        for edge, w in zip(TOOL_BINS, self.weights, strict=True):
            if seconds < edge:
                part = math.log(seconds / lo) / math.log(edge / lo) if lo > 0 else max(0.0, seconds) / edge
                below += w * part
                return max(0.0, 1.0 - below / total)
            below += w
            lo = edge
        return 0.0

    def points(self) -> tuple[tuple[float, float], ...]:
        """(bin middle seconds, share of tool calls) for the bins that hold any."""
        total = sum(self.weights)
        if total <= 0:
            return ()
        out = []
        lo = 0.0
        for edge, w in zip(TOOL_BINS, self.weights, strict=True):
            if w > 0:
                out.append(((lo + edge) / 2, w / total))
            lo = edge
        return tuple(out)


@dataclass(slots=True)
class Served:
    """What this router measured of a backend, cumulative: how long it had a request in flight
    (occupancy), and the steps of its programs with their prompt, cached and recomputed tokens
    and (EMAs) request and tool times. The admission rule reads differences of these."""

    steps: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    recompute_tokens: int = 0
    """Prompt tokens prefilled that the program had computed before (its context minus the
    part the engine still had cached), summed over steps."""
    new_tokens: int = 0
    """Prompt tokens new to their program (its observation; a first step's uncached prompt)."""
    output_tokens: int = 0
    """Completion tokens of the steps."""
    ended: int = 0
    """Programs that ended (released, or idle past their timeout) after their last step here ..."""
    ended_steps: int = 0
    """... and the steps they had taken in all: few steps per program is an open stream of
    programs (conversations that arrive, take a turn or two and leave), not a closed loop."""
    occupied_s: float = 0.0
    busy_since: float | None = None
    """When the backend last went from no request in flight to one (None: none in flight)."""
    request_s: float = 0.0
    """EMA of a request's duration (dispatch to last byte)."""
    tool_s: float = 0.0
    """EMA of the tool time between a program's requests."""
    tool_hist: ToolTimes = field(default_factory=lambda: ToolTimes())
    """The tool times' distribution (recent ones weigh most): how long KV sits idle. Measured
    at dispatch: a program paused in its tool counts from its restore. That is the goodput
    model's loop, which counts admitted programs only (a paused one is not in its n, nor its
    pause in the measured cycle). Read from ``returns`` instead (the client's whole silence),
    the model saw admitted programs idle longer than they are and probed levels that lost:
    ToolOrchestra DES, 8 seeds, N = 24/32/48 at 0.898/0.892/0.878 of the bound against
    0.899/0.893/0.892 (``bench/toolorchestra_seeds.py``, 2026-12-06)."""
    returns: ToolTimes = field(default_factory=lambda: ToolTimes())
    """The times from an answer to the program's next request, measured at its arrival (pauses,
    restores and holds do not cut them short): how long a live client stays silent, which the
    dormant rule of inferred programs reads (``programs.lengths``)."""

    def occupied(self, now: float) -> float:
        """Seconds with at least one request in flight, up to ``now``."""
        return self.occupied_s + (now - self.busy_since if self.busy_since is not None else 0.0)


@dataclass(frozen=True, slots=True)
class PendingWeights:
    """A weight update through the router failed on this backend's worker: the worker is kept
    out of routing until it reports ``expected`` (its weight version; read from answers and
    ``/model_info``) or a later update through the router succeeds on it. With no version
    named (``expected`` None), any version other than ``previous`` brings it back."""

    expected: str | None
    previous: str | None
    since: float
    call: str
    """The route that failed (``/update_weights_from_distributed``…)."""
    message: str

    def met_by(self, version: str) -> bool:
        return version == self.expected if self.expected is not None else version != self.previous

    def describe(self) -> dict[str, Any]:
        return {"expected_version": self.expected, "previous_version": self.previous, "call": self.call,
                "message": self.message}


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
    idle_at: float = float("-inf")
    """When the router's requests on this backend last dropped to none (``control.kvdrop``)."""
    session_refs: bool = False
    """The worker runs with ``--enable-session-radix-cache`` (a ``session_id`` references KV)."""
    context_length: int = 0
    """The model's context, tokens of prompt + output of one request (``WorkerInfo``); 0:
    unknown. A request surely beyond it is sent at once (``Controller.submit``)."""
    served: Served = field(default_factory=Served)
    weight_version: str | None = None
    """The engine's weight version as last seen (in an answer, or ``/model_info``); None until
    then, and after an update through the router that named none."""
    weights_pending: PendingWeights | None = None
    """Set while the worker's last weight update through the router failed: not available
    (routed to like an unhealthy worker: nothing new placed, idle programs migrate)."""
    engine_paused_since: float | None = None
    """Set while the engine is paused behind the router and the router holds for it
    (``backends.pause``): its programs keep their place and their requests are held, nothing
    new is placed there, it stays healthy."""
    engine_paused_s: float = 0.0
    """Seconds the router held for this engine's pauses before ``engine_paused_since``."""
    admission: AdmissionLevel | None = None
    """The admission rule's state for this backend (``scheduler.goodput.AdmissionState``, or
    ``scheduler.occupancy.OccupancyState``; None until its first update). Written only from the
    tick's ``Decisions``."""

    def sent(self, now: float) -> None:
        """A request went to this backend."""
        if self.inflight == 0:
            self.served.busy_since = now
        self.inflight += 1

    def ended(self, now: float) -> None:
        """A request on this backend ended (answered, failed or aborted)."""
        self.inflight = max(0, self.inflight - 1)
        if self.inflight == 0:
            self.idle_at = now
        if self.inflight == 0 and self.served.busy_since is not None:
            self.served.occupied_s += now - self.served.busy_since
            self.served.busy_since = None

    @property
    def engine_paused(self) -> bool:
        """The engine is paused behind the router (``backends.pause``)."""
        return self.engine_paused_since is not None

    def engine_pause(self, now: float) -> None:
        if self.engine_paused_since is None:
            self.engine_paused_since = now

    def engine_resume(self, now: float) -> None:
        if self.engine_paused_since is not None:
            self.engine_paused_s += max(0.0, now - self.engine_paused_since)
            self.engine_paused_since = None

    def paused_seconds(self, now: float) -> float:
        """Seconds the engine has been held paused, in total up to ``now``: what a request
        waiting on it does not count towards its timeouts."""
        since = self.engine_paused_since
        return self.engine_paused_s + (max(0.0, now - since) if since is not None else 0.0)

    @property
    def key(self) -> str:
        return backend_key(self.worker_url, self.dp_rank)

    def stale(self, now: float, stale_after: float) -> bool:
        if not self.monitored:
            return False
        return self.live.updated_at is None or now - self.live.updated_at > stale_after

    def available(self, now: float, stale_after: float) -> bool:
        """Healthy, fresh, not draining and not waiting for weights (``weights_pending``): may
        receive programs and requests."""
        return self.healthy and not self.draining and self.weights_pending is None and not self.stale(now, stale_after)

    def under_pressure(self, waiting_threshold: int) -> bool:
        """The engine itself reports queueing or retraction, whatever our accounting says."""
        return self.live.waiting_reqs > waiting_threshold or self.live.retracted_reqs > 0
