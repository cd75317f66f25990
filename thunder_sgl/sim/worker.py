"""A simulated SGLang worker: ``dp_size`` engines, model description, faults, reports.

``SimWorker`` has the same driving API as one ``Engine`` (submit, next_event_time, advance,
abort) and picks the DP rank of each request: the request's own ``dp_rank`` if set, else round
robin (or the shortest queue, per ``server.dp_load_balance``). It holds no clock: the HTTP server
drives it from a scaled real-time clock, a discrete-event benchmark from its own.
"""

from __future__ import annotations

import time
from array import array
from typing import Any

from thunder_sgl.sim.config import SimConfig
from thunder_sgl.sim.engine import Engine
from thunder_sgl.sim.exposition import histogram_text, loads_entry, metrics_text
from thunder_sgl.sim.faults import Faults
from thunder_sgl.sim.request import (
    Completion,
    EngineCounters,
    EngineStats,
    SimRequest,
    SimRequestError,
)
from thunder_sgl.sim.tokenizer import ChatTemplate, Tokenizer


class SimWorker:
    """One worker process of SGLang (one ``--port``), made of dp_size independent engines."""

    def __init__(self, cfg: SimConfig, worker_id: int = 0) -> None:
        self.cfg = cfg
        self.worker_id = worker_id
        self.engines = [Engine(cfg, r) for r in range(cfg.server.dp_size)]
        self.tokenizer = Tokenizer()
        self.template = ChatTemplate(self.tokenizer)
        self.faults = Faults(cfg.faults, cfg.seed + 7919 * (worker_id + 1))
        self.start_time = time.time()
        self._rr = 0
        self._rank_of: dict[str, int] = {}
        # Engine control (``sim.control``): RL weight updates and memory release.
        self.paused: str | None = None
        """Mode of /pause_generation until /continue_generation (new requests wait meanwhile)."""
        self.updating = False
        """An /update_weights_from_disk is loading weights (new requests wait meanwhile)."""
        self.weight_version = "default"
        self.weight_updates = 0
        self.released: set[str] = set()
        """Memory occupation tags released (new requests wait until all are resumed)."""
        self.weight_groups: dict[str, dict[str, Any]] = {}
        """Weight update groups joined (``/init_weights_update_group``), by name."""
        self.lora_adapters: dict[str, str] = {}
        """LoRA adapters loaded: name → path."""

    @property
    def accepting(self) -> bool:
        """New requests may enter the engines (generation neither paused nor held)."""
        return self.paused is None and not self.updating and not self.released

    # ---- driving ----------------------------------------------------------------------
    def submit(self, request: SimRequest, now: float) -> int:
        """Queue a request; returns the DP rank it went to (raises SimRequestError)."""
        if request.rid in self._rank_of:
            raise SimRequestError(f"request id {request.rid!r} is already in use")
        rank = self._pick_rank(request.dp_rank)
        self.engines[rank].submit(request, now)
        self._rank_of[request.rid] = rank
        return rank

    def next_event_time(self) -> float | None:
        times = [t for t in (e.next_event_time() for e in self.engines) if t is not None]
        return min(times) if times else None

    def advance(self, until: float) -> list[Completion]:
        if len(self.engines) == 1:
            out = self.engines[0].advance(until)
        else:
            out = [ev for e in self.engines for ev in e.advance(until)]
            out.sort(key=lambda ev: ev.time)
        for ev in out:
            self._rank_of.pop(ev.rid, None)
        return out

    def abort(self, rid: str, now: float) -> bool:
        rank = self._rank_of.get(rid)
        return rank is not None and self.engines[rank].abort(rid, now)

    def abort_all(self, now: float) -> int:
        return sum(self.abort(rid, now) for rid in list(self._rank_of))

    def close_session(self, session_id: str) -> bool:
        """Dereference a session's KV on every DP rank (it lives on the ranks that served it)."""
        return any([e.close_session(session_id) for e in self.engines])

    def flush_cache(self) -> bool:
        if not all(e.can_flush() for e in self.engines):
            return False
        for e in self.engines:
            e.flush_cache()
        return True

    def visible_tokens(self, rid: str) -> int | None:
        rank = self._rank_of.get(rid)
        return None if rank is None else self.engines[rank].visible_tokens(rid)

    def output_ids(self, rid: str) -> array | None:
        """The answer tokens of a request in flight (all of them, decided at submission)."""
        rank = self._rank_of.get(rid)
        return None if rank is None else self.engines[rank].output_ids(rid)

    def _pick_rank(self, requested: int | None) -> int:
        n = len(self.engines)
        if requested is not None:
            if not 0 <= requested < n:
                raise SimRequestError(f"dp rank {requested} out of range [0, {n})")
            return requested
        if n == 1:
            return 0
        if self.cfg.server.dp_load_balance == "shortest_queue":
            return min(range(n), key=lambda r: (len(self.engines[r].reqs), r))
        self._rr = (self._rr + 1) % n
        return self._rr

    # ---- state for plots and reports ----------------------------------------------------
    def stats(self) -> list[EngineStats]:
        return [e.stats() for e in self.engines]

    @property
    def counters(self) -> EngineCounters:
        """Counters summed over DP ranks."""
        total = EngineCounters()
        for e in self.engines:
            for f in EngineCounters.__dataclass_fields__:
                setattr(total, f, getattr(total, f) + getattr(e.counters, f))
        return total

    @property
    def device_used_tokens(self) -> int:
        return sum(s.device_used_tokens for s in self.stats())

    @property
    def host_used_tokens(self) -> int:
        return sum(e.cache.host_used for e in self.engines)

    @property
    def evicted_tokens(self) -> int:
        """Tokens evicted from HBM so far (``sglang:evicted_tokens_total``), all ranks."""
        return sum(e.cache.counters.evicted_device for e in self.engines)

    @property
    def num_running(self) -> int:
        return sum(s.num_running_reqs for s in self.stats())

    @property
    def num_waiting(self) -> int:
        return sum(len(e.waiting) for e in self.engines)

    # ---- reports (HTTP payloads) ----------------------------------------------------------
    def loads(self, include: set[str] | None = None, dp_rank: int | None = None) -> dict[str, Any]:
        inc = include or {"core"}
        entries = [loads_entry(s, self.cfg, inc) for s in self.stats() if dp_rank is None or s.dp_rank == dp_rank]
        return {
            "timestamp": time.time(),
            "version": self.cfg.server.version,
            "accelerator": "cuda",
            "num_accelerators": self.cfg.server.tp_size * self.cfg.server.dp_size,
            "sim_time": max(e._now for e in self.engines),
            "loads": entries,
        }

    def metrics_text(self) -> str:
        hist = {
            "sglang:time_to_first_token_seconds": [(e.dp_rank, e.hist_ttft) for e in self.engines],
            "sglang:e2e_request_latency_seconds": [(e.dp_rank, e.hist_e2e) for e in self.engines],
        }
        if self.cfg.hicache.enabled:
            hist["sglang:load_back_duration_seconds"] = [(e.dp_rank, e.hist_load_back) for e in self.engines]
        return metrics_text(self.stats(), self.cfg) + histogram_text(hist, self.cfg)

    def model_info(self) -> dict[str, Any]:
        m = self.cfg.model
        return {
            "model_path": m.model_path,
            "tokenizer_path": m.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": m.model_type,
            "architectures": list(m.architectures),
        }

    def server_info(self) -> dict[str, Any]:
        c, s, h, m = self.cfg, self.cfg.server, self.cfg.hicache, self.cfg.model
        stats = self.stats()
        return {
            "model_path": m.model_path,
            "tokenizer_path": m.model_path,
            "served_model_name": m.name,
            "context_length": m.context_length,
            "tp_size": s.tp_size,
            "dp_size": s.dp_size,
            "pp_size": 1,
            "page_size": s.page_size,
            "chunked_prefill_size": s.chunked_prefill_size,
            "enable_session_radix_cache": s.enable_session_radix_cache,
            "enable_mixed_chunk": s.enable_mixed_chunk,
            "max_prefill_tokens": s.max_prefill_tokens,
            "max_running_requests": s.max_running_requests,
            "schedule_policy": "fcfs",
            "mem_fraction_static": s.mem_fraction_static,
            "kv_cache_dtype": s.kv_cache_dtype,
            "cuda_graph_max_bs": s.cuda_graph_max_bs,
            "enable_metrics": True,
            "enable_cache_report": s.enable_cache_report,
            "enable_dp_attention": False,
            "load_balance_method": s.dp_load_balance,
            "disaggregation_mode": "null",
            "is_embedding": False,
            "enable_hierarchical_cache": h.enabled,
            "hicache_ratio": h.ratio,
            "hicache_size": 0,
            "hicache_write_policy": h.write_policy,
            "hicache_io_backend": h.io_backend,
            "hicache_mem_layout": h.mem_layout,
            "hicache_storage_backend": h.storage_backend,
            "hicache_storage_prefetch_policy": h.storage_prefetch_policy,
            "hicache_host_total_tokens": c.host_tokens,
            "hicache_storage_capacity_tokens": c.storage_tokens,
            "kv_bytes_per_token": c.kv_bytes_per_token,
            "status": "ready",
            "max_total_num_tokens": s.max_total_num_tokens,
            "max_req_input_len": min(m.context_length, s.max_total_num_tokens) - 1,
            "startup_time": self.start_time,
            "version": s.version,
            "launch_command": f"python -m thunder_sgl.sim --config {c.name}",
            "internal_states": [
                {
                    "dp_rank": st.dp_rank,
                    "last_gen_throughput": st.gen_throughput,
                    "effective_max_running_requests_per_dp": s.max_running_requests,
                    "memory_usage": {"token_capacity": s.max_total_num_tokens, "kvcache": round(s.max_total_num_tokens * c.kv_bytes_per_token / 1e9, 3)},
                }
                for st in stats
            ],
            "sim": {"config": c.name, "worker_id": self.worker_id, "seed": c.seed},
        }
