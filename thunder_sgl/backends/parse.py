"""Pure parsers: SGLang worker responses → numbers the scheduler uses.

No I/O here; the monitor fetches, these functions turn text/JSON into ``Tiers`` and ``Live``.
Field names follow SGLang 0.5.23 (sglang-surface.md §1.2–1.4, §2.2–2.3).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from thunder_sgl.backends.backend import INCLUSIVE_WRITE_POLICIES, Tiers


@dataclass(frozen=True)
class WorkerInfo:
    """What registration learns from ``/server_info`` (and ``/model_info``)."""

    model_path: str
    dp_size: int
    hbm_tokens: int
    """``max_total_num_tokens`` per DP rank."""
    page_size: int = 1
    hicache: bool = False
    hicache_ratio: float = 0.0
    hicache_size_gb: float = 0.0
    write_policy: str = "write_through"
    storage_backend: str | None = None
    storage_tokens: int = 0
    """Storage tier capacity: SGLang 0.5.23 reports none (a file tier is bounded by its disk);
    our simulator reports ``hicache_storage_capacity_tokens``; otherwise the router's
    ``monitor.storage_tokens`` (``Monitor._register``)."""
    kv_bytes_per_token: int = 0
    """Not in SGLang's /server_info either: derived from the HiCache backup counters
    (``TierReading.kv_bytes_per_token``) once a backup ran."""
    session_radix_cache: bool = False
    """``--enable-session-radix-cache``: requests with a ``session_id`` reference their KV,
    eviction takes unreferenced KV first, ``/close_session`` dereferences it."""
    version: str = ""
    tp_size: int = 1
    """GPUs of one engine in a weight update group: its TP rank r joins as ``rank_offset + r``."""
    context_length: int = 0
    """The model's context (prompt + output tokens of one request): our simulator reports it in
    /server_info; SGLang 0.5.23 reports ``context_length: null`` there and ``max_model_len`` in
    ``/v1/models`` (``parse_models``), which the monitor reads. 0: unknown."""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def tiers(self) -> Tiers:
        host = 0
        if self.hicache:
            if self.hicache_size_gb > 0 and self.kv_bytes_per_token > 0:
                host = int(self.hicache_size_gb * 1e9 / self.kv_bytes_per_token)
            else:
                host = int(self.hbm_tokens * (self.hicache_ratio or 2.0))
        return Tiers(
            hbm_tokens=self.hbm_tokens,
            host_tokens=host,
            storage_tokens=self.storage_tokens if self.hicache else 0,
            host_inclusive=self.write_policy in INCLUSIVE_WRITE_POLICIES,
            kv_bytes_per_token=self.kv_bytes_per_token,
        )


class ParseError(ValueError):
    """A worker answered something we cannot use."""


def _num(d: dict[str, Any], *keys: str, default: float | None = None) -> float:
    for k in keys:
        v = d.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    if default is None:
        raise ParseError(f"missing numeric field {keys[0]!r}")
    return default


def parse_server_info(data: Any) -> WorkerInfo:
    """``GET /server_info`` (or the deprecated ``/get_server_info``)."""
    if not isinstance(data, dict):
        raise ParseError("server_info is not a JSON object")
    hbm = data.get("max_total_num_tokens")
    if not isinstance(hbm, (int, float)):
        states = data.get("internal_states") or []
        if states and isinstance(states[0], dict) and "max_total_num_tokens" in states[0]:
            hbm = states[0]["max_total_num_tokens"]
    if not isinstance(hbm, (int, float)) or hbm <= 0:
        raise ParseError("server_info has no positive max_total_num_tokens")
    storage = data.get("hicache_storage_backend")
    return WorkerInfo(
        model_path=str(data.get("model_path") or data.get("served_model_name") or "unknown"),
        dp_size=int(_num(data, "dp_size", default=1)) or 1,
        hbm_tokens=int(hbm),
        page_size=int(_num(data, "page_size", default=1)) or 1,
        hicache=bool(data.get("enable_hierarchical_cache") or data.get("enable_hicache")),
        hicache_ratio=_num(data, "hicache_ratio", default=0.0),
        hicache_size_gb=_num(data, "hicache_size", default=0.0),
        write_policy=str(data.get("hicache_write_policy") or "write_through"),
        storage_backend=str(storage) if storage else None,
        storage_tokens=int(_num(data, "hicache_storage_capacity_tokens", default=0.0)),
        kv_bytes_per_token=int(_num(data, "kv_bytes_per_token", default=0.0)),
        session_radix_cache=bool(data.get("enable_session_radix_cache")),
        version=str(data.get("version") or ""),
        tp_size=int(_num(data, "tp_size", default=1)) or 1,
        context_length=int(_num(data, "context_length", default=0.0)),
        raw=data,
    )


def parse_models(data: Any) -> int:
    """``GET /v1/models``: the first model's ``max_model_len`` (SGLang's context length), 0 when
    it has none."""
    models = data.get("data") if isinstance(data, dict) else None
    if isinstance(models, list) and models and isinstance(models[0], dict):
        return int(_num(models[0], "max_model_len", default=0.0))
    return 0


@dataclass(frozen=True)
class RankLoad:
    """One DP rank's entry of ``/v1/loads``."""

    dp_rank: int
    used_tokens: int
    max_total_tokens: int
    running_reqs: int
    waiting_reqs: int
    token_usage: float
    cache_hit_rate: float
    retracted_reqs: int
    prefill_tokens_total: int = 0
    """``total_prefill_uncached_tokens``: tokens prefilled since start (a counter)."""
    prefill_busy_s_total: float = 0.0
    """``total_prefill_busy_us`` / 1e6: seconds spent in prefill since start (a counter)."""
    decode: DecodeMoments | None = None
    """Sums over decode iterations since start (None before the first one)."""
    gen_throughput: float = 0.0


@dataclass(frozen=True)
class DecodeMoments:
    """SGLang's ``decode_moments``: over decode iterations, [n, Σb, Σt, Σb², Σb·t, Σgenerated]
    with b the batch size and t the iteration time in µs (``scheduler._accumulate_decode_moment``).
    Differences of two readings give the iterations in between, from which the iteration time
    is regressed on the batch size."""

    n: float
    sum_b: float
    sum_t_us: float
    sum_b2: float
    sum_bt: float
    generated: float

    @classmethod
    def parse(cls, v: Any) -> DecodeMoments | None:
        if not isinstance(v, list) or len(v) < 6 or not all(isinstance(x, (int, float)) for x in v[:6]):
            return None
        return cls(*(float(x) for x in v[:6]))

    def __sub__(self, other: DecodeMoments) -> DecodeMoments:
        return DecodeMoments(self.n - other.n, self.sum_b - other.sum_b, self.sum_t_us - other.sum_t_us,
                             self.sum_b2 - other.sum_b2, self.sum_bt - other.sum_bt, self.generated - other.generated)

    @property
    def busy_s(self) -> float:
        return self.sum_t_us / 1e6


def parse_loads(data: Any) -> list[RankLoad]:
    """``GET /v1/loads?include=core,queues``: one entry per DP rank."""
    if not isinstance(data, dict) or not isinstance(data.get("loads"), list):
        raise ParseError("/v1/loads has no 'loads' list")
    out = []
    for i, e in enumerate(data["loads"]):
        if not isinstance(e, dict):
            raise ParseError("/v1/loads entry is not an object")
        q = e.get("queues")
        queues: dict[str, Any] = q if isinstance(q, dict) else {}
        out.append(
            RankLoad(
                dp_rank=int(_num(e, "dp_rank", default=float(i))),
                used_tokens=int(_num(e, "num_used_tokens", default=0.0)),
                max_total_tokens=int(_num(e, "max_total_num_tokens", "num_total_tokens", default=0.0)),
                running_reqs=int(_num(e, "num_running_reqs", default=0.0)),
                waiting_reqs=int(_num(e, "num_waiting_reqs", default=0.0)),
                token_usage=_num(e, "token_usage", default=0.0),
                cache_hit_rate=_num(e, "cache_hit_rate", default=0.0),
                retracted_reqs=int(_num(queues, "retracted", default=0.0)),
                prefill_tokens_total=int(_num(e, "total_prefill_uncached_tokens", default=0.0)),
                prefill_busy_s_total=_num(e, "total_prefill_busy_us", default=0.0) / 1e6,
                decode=DecodeMoments.parse(e.get("decode_moments")),
                gen_throughput=_num(e, "gen_throughput", default=0.0),
            )
        )
    return out


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_prometheus(text: str) -> Samples:
    """Prometheus text exposition → {metric name: [(labels, value), ...]}. Comments skipped."""
    out: Samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels_s, value_s = m.groups()
        try:
            value = float(value_s)
        except ValueError:
            continue
        if math.isnan(value):
            continue
        labels = dict(_LABEL.findall(labels_s)) if labels_s else {}
        out.setdefault(name, []).append((labels, value))
    return out


def metric_by_rank(samples: Samples, name: str) -> dict[int, float]:
    """Values of ``name`` per ``dp_rank`` label (0 when unlabelled), summed over other labels
    such as ``tp_rank`` only where a rank reports once per TP group (take the max)."""
    out: dict[int, float] = {}
    for labels, value in samples.get(name, []):
        rank = int(labels.get("dp_rank", "0") or 0)
        out[rank] = max(out.get(rank, float("-inf")), value)
    return out


@dataclass(frozen=True)
class TierReading:
    """One DP rank's HiCache figures from ``/metrics`` (SGLang 0.5.23 names; a real server's
    texts are in tests/data/sglang-0.5.23-cpu-hicache-metrics-*.txt).

    ``host_used_tokens`` (``sglang:hicache_host_used_tokens``) is a gauge SGLang refreshes only
    when a batch runs: right after ``/flush_cache`` it still shows the old value (``Live``
    discounts it). The counters are totals since the server started."""

    host_total_tokens: int
    host_used_tokens: int
    backup_tokens: int = 0
    """``sglang:hicache_backup_tokens_total``: tokens written device → host."""
    backup_bytes: int = 0
    load_back_tokens: int = 0
    """``sglang:load_back_tokens_total``: tokens loaded host → device (a host or storage hit)."""
    storage_backup_tokens: int = 0
    """``sglang:backuped_tokens_total``: tokens written host → storage."""
    storage_prefetch_tokens: int = 0
    """``sglang:prefetched_tokens_total``: tokens read storage → host."""

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token of the rank, from the backup counters (0 until a backup ran):
        SGLang reports no such figure in /server_info."""
        return self.backup_bytes // self.backup_tokens if self.backup_tokens > 0 else 0


def host_tier_by_rank(samples: Samples) -> dict[int, TierReading]:
    """HiCache tiers per DP rank; empty without HiCache. SGLang labels the host gauges with no
    ``dp_rank`` (rank 0 then) and the counters with it."""
    total = metric_by_rank(samples, "sglang:hicache_host_total_tokens")
    used = metric_by_rank(samples, "sglang:hicache_host_used_tokens")

    def counter(name: str, r: int) -> int:
        return int(sum(v for labels, v in samples.get(name, []) if int(labels.get("dp_rank", "0") or 0) == r))

    return {r: TierReading(int(total[r]), int(used.get(r, 0)),
                           backup_tokens=counter("sglang:hicache_backup_tokens_total", r),
                           backup_bytes=counter("sglang:hicache_backup_bytes_total", r),
                           load_back_tokens=counter("sglang:load_back_tokens_total", r),
                           storage_backup_tokens=counter("sglang:backuped_tokens_total", r),
                           storage_prefetch_tokens=counter("sglang:prefetched_tokens_total", r))
            for r in total}


CACHE_SOURCES = ("device", "host", "storage")


def cached_tokens_by_source(samples: Samples) -> dict[str, int]:
    """``sglang:cached_tokens_total{cache_source}``: prompt tokens served from each tier since
    the server started, summed over the server (SGLang gives this counter no rank label)."""
    out = dict.fromkeys(CACHE_SOURCES, 0)
    for labels, v in samples.get("sglang:cached_tokens_total", []):
        src = labels.get("cache_source", "device")
        out[src] = out.get(src, 0) + int(v)
    return out
