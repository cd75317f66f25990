"""Policies by name, and the stateless fallback for requests without a program id.

``POLICIES`` is the one registry: a name maps to a function that adjusts the scheduler
config. ``thunder`` is the full tier-aware policy; ``thunder-paper`` is the method exactly as
the ThunderAgent paper describes it (pool = HBM only, no HBM gate, λ_max = λ_min = 1), kept as
a baseline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from thunder_sgl.backends.backend import Backend
from thunder_sgl.config import SchedulerConfig
from thunder_sgl.errors import ConfigError
from thunder_sgl.scheduler.core import ThunderPolicy

POLICIES: dict[str, Callable[[SchedulerConfig], SchedulerConfig]] = {
    "thunder": lambda cfg: cfg,
    # The paper's method as published: pool = HBM, no HBM gate, both watermarks at 1.
    "thunder-paper": lambda cfg: dataclasses.replace(cfg, tier_aware=False, lambda_max=1.0, lambda_min=1.0),
}


def make_policy(name: str, cfg: SchedulerConfig, stale_after: float = float("inf")) -> ThunderPolicy:
    try:
        adjust = POLICIES[name]
    except KeyError:
        raise ConfigError(f"unknown program policy {name!r}; valid: {sorted(POLICIES)}") from None
    return ThunderPolicy(adjust(cfg), stale_after)


def least_loaded(backends: Sequence[Backend], now: float, stale_after: float) -> Backend | None:
    """Stateless requests (no program id): the available backend with the fewest requests in
    flight from this router plus those the engine reports waiting, then the lowest KV usage.
    None when no backend is available."""
    best: Backend | None = None
    best_key: tuple[int, float, str] | None = None
    for b in backends:
        if not b.available(now, stale_after):
            continue
        k = (b.inflight + b.live.waiting_reqs, b.live.token_usage, b.key)
        if best_key is None or k < best_key:
            best, best_key = b, k
    return best
