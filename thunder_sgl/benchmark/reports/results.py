"""One measured run (a router at one concurrency), the unit of every benchmark report.

HTTP mode and DES mode fill the same record, so tables and plots do not care how a number
was obtained. Times are simulated seconds; rates are per simulated minute.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

ROUTERS = ("thunder", "thunder-paper", "sglang-cache_aware", "sglang-round_robin", "smg-cache_aware")
"""Routers of a sweep by default, by name: ours (tier-aware), ours as the paper describes it,
and the stock peers: sglang_router 0.3.2 with cache_aware and round_robin, smg 1.13.0 with
cache_aware."""

DIRECT = "direct"
"""No router: each client talks straight to one engine (the request-level engine)."""

THUNDER_FIXED = "thunder-fixed"
"""thunder with the admission fixed at the watermarks and no KV references (the default
before the cost-based rules)."""

THUNDER_OCCUPANCY = "thunder-occupancy"
"""thunder with the previous default admission rule (a controller on engine occupancy)."""

THUNDER_INFERRED = "thunder-inferred"
"""thunder (the default policy) whose clients send no program id: it infers the programs from
the messages (``control.conversations``). HTTP and real modes only."""

ALL_ROUTERS = (ROUTERS[0], THUNDER_INFERRED, THUNDER_OCCUPANCY, THUNDER_FIXED, *ROUTERS[1:], DIRECT)
"""Every router a sweep may name."""


@dataclass
class RunResult:
    router: str
    mode: str
    """"http" (real processes) or "des" (in-process, virtual time)."""
    programs: int
    """Concurrent agent programs (closed loop)."""
    nodes: int
    cluster: str
    """Simulator config name of each node."""
    profile: str
    seed: int
    window_s: float
    """Simulated seconds over which rates were measured (after warm-up)."""
    steps_per_min: float
    kv_hit_rate: float
    """Σ cached / Σ prompt tokens over the window."""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    recompute_tokens: int = 0
    """Prompt tokens prefilled that had been computed before for the same program."""
    cached_host_tokens: int = 0
    """Of the engines' cached prompt tokens in the window, those loaded back from the HiCache
    host tier (the engines' ``sglang:cached_tokens_total{cache_source="host"}``; http and real
    modes, 0 without HiCache)."""
    cached_storage_tokens: int = 0
    """The same from the HiCache storage tier."""
    cached_device_tokens: int = 0
    """The same from the device pool (engines with HiCache only)."""
    load_back_tokens: int = 0
    """Tokens the engines loaded host → device in the window (``sglang:load_back_tokens_total``)."""
    node_imbalance_mean: float = 0.0
    """Mean over time of max − min of per-node used/capacity (HBM)."""
    node_imbalance_max: float = 0.0
    program_completion_p50_s: float = 0.0
    program_completion_p99_s: float = 0.0
    step_latency_p50_s: float = 0.0
    step_latency_p99_s: float = 0.0
    held_wait_p50_s: float = 0.0
    held_wait_p99_s: float = 0.0
    held_wait_max_s: float = 0.0
    programs_completed: int = 0
    programs_failed: int = 0
    steps_completed: int = 0
    ideal_steps_per_min: float = 0.0
    """The physical bound of calibration.md §10 for the same configuration."""
    engine_busy: float = 0.0
    """Mean share of the window the engines spent in prefill or decode iterations (their own
    ``/v1/loads`` counters); 0 where not reported."""
    time_scale: float = 1.0
    wall_s: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    memory: list[tuple[float, list[float]]] = field(default_factory=list)
    """(time, per-node HBM used/capacity) samples, for the per-node memory plot."""
    notes: str = ""
    window_check: dict[str, Any] = field(default_factory=dict)
    """Whether the window measured the steady state (``measures.derived.window_check``):
    steps per program counted, program lifetimes ended before it, a warning ('' when fine)."""
    rollout: dict[str, Any] = field(default_factory=dict)
    """Rollout runs (``rollout.spec``): mode, windows, requests lost, per batch (sync) or per
    group (async) measures; empty for the closed-loop benchmark."""
    trace: dict[str, Any] = field(default_factory=dict)
    """Trace replays (``des.trace``): speed, requests offered and answered, TTFT and latency
    percentiles, SLO attainment, the trace's own counts; empty otherwise."""

    CSV_FIELDS = (
        "router", "mode", "programs", "nodes", "cluster", "profile", "seed", "window_s", "steps_per_min",
        "ideal_steps_per_min", "kv_hit_rate", "recompute_tokens", "prompt_tokens", "cached_tokens",
        "completion_tokens", "node_imbalance_mean", "node_imbalance_max", "program_completion_p50_s",
        "program_completion_p99_s", "step_latency_p50_s", "step_latency_p99_s", "held_wait_p50_s",
        "held_wait_p99_s", "held_wait_max_s", "programs_completed", "programs_failed", "steps_completed",
        "engine_busy", "time_scale", "wall_s",
    )

    def row(self) -> dict[str, Any]:
        """Flat fields for CSV and markdown tables."""
        return {k: getattr(self, k) for k in self.CSV_FIELDS}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunResult:
        known = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["memory"] = [(t, list(v)) for t, v in kw.get("memory", [])]
        return cls(**kw)
