"""The previous default admission rule (``admission.mode: occupancy``): a controller on occupancy.

Kept beside ``goodput`` (the default) so benchmarks can run the two side by side. Its knobs are
in ``scheduler.admission`` (``occupancy_target``, ``gain``, ``decrease``, ``deadband``,
``max_step``, ``max_overcommit``, ``cost_ema_alpha``).

The fixed watermarks (``λ_max·pool``, ``λ_min·pool``) admit the programs whose KV fits. That is
right when recomputing a context costs much more than anything else (the GPU regime of the
paper: prefill is expensive, decode batches nearly for free), and wrong when the engine then
idles while every admitted program waits on a tool: an idle engine costs more than the recompute
that more programs would bring (small or KV-bound engines, long tool calls). The rule weighs the
two from measurements only, per backend, once per tick period:

- **occupancy** ``O``: the share of the last period with at least one request in flight from
  this router (``Backend.served``). ``1 − O`` is engine time that nothing used.
- **cost of one more program's step** ``w = s + c̄·r``: ``s`` the engine seconds per step (the
  engine's own prefill and decode busy time per completed step, ``/v1/loads``; the router-timed
  request duration where the engine does not report it), ``c̄·r`` a full recompute of a mean
  context at the engine's measured prefill seconds per token ``r`` — the pessimistic case of a
  program whose KV is gone each time it returns from its tool.
- **cycle** ``R + Z``: request time plus tool time (router-timed EMAs).

An extra program fills ``w / (R + Z)`` of the engine's time, so filling the idle share takes
``(target − O)·(R + Z) / w`` programs, ``c̄`` tokens each. The rule is a controller on ``O``:

    O < target − band, programs waiting, pool limit reached:  extra += gain·(target − O)·(R + Z)/w·c̄
    O > target + band, extra > 0:                              extra ×= 1 − decrease·(O − target)/(1 − target)

(additive increase while the engine idles, multiplicative decrease once it is saturated — when
more work displaces useful work with recompute), with ``0 ≤ extra ≤ max_overcommit·pool``, at
most ``max_step·pool`` per period. The watermarks become ``λ·pool + extra``. Its fixed point is
``O = target``; on a GPU-like engine, occupied whenever anything runs, ``extra`` stays 0 and the
policy is the fixed-threshold one. The KV of the programs admitted beyond ``λ_max·pool`` is not
referenced (``core``, ``session_refs``), so with SGLang's session radix cache it is evicted
before that of the programs that fit.

Pure: ``update`` takes the previous state, the backend's cumulative counters and time, and
returns the next state (the tick stores it on the backend through ``Decisions``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from thunder_sgl.backends.backend import Backend
from thunder_sgl.config import SchedulerConfig
from thunder_sgl.scheduler.goodput import BackendView
from thunder_sgl.smoothing import ema


@dataclass(frozen=True, slots=True)
class OccupancyState:
    extra: float = 0.0
    """Tokens admitted beyond the watermarks."""
    at: float | None = None
    """Time of the last update (None: not started)."""
    occupied: float = 0.0
    """``Backend.served.occupied`` at ``at``."""
    steps: int = 0
    engine_busy: float = 0.0
    prefill_s: float = 0.0
    prefill_tokens: int = 0
    occupancy: float = 1.0
    """Occupancy measured over the last period."""
    step_s: float = 0.0
    """EMA: engine seconds per completed step."""
    token_s: float = 0.0
    """EMA: engine prefill seconds per token."""

    @property
    def protect(self) -> float:
        """Every program within ``λ_max·pool`` keeps its references (as before)."""
        return math.inf

    @property
    def hbm_extra(self) -> float:
        """The HBM condition stays at ``hbm_lambda·HBM`` (as before)."""
        return 0.0

    def view(self) -> dict[str, object]:
        return {"rule": "occupancy", "extra_tokens": round(self.extra), "occupancy": round(self.occupancy, 4),
                "step_s": round(self.step_s, 6), "token_s": round(self.token_s, 9)}


def update(state: OccupancyState | None, b: Backend, v: BackendView, now: float, cfg: SchedulerConfig) -> OccupancyState:
    ac = cfg.admission
    st = state if state is not None else OccupancyState()
    if st.at is None:
        return _snapshot(st, b, now)
    dt = now - st.at
    if dt < cfg.tick_seconds:
        return st
    served, live = b.served, b.live
    occ = min(1.0, max(0.0, (served.occupied(now) - st.occupied) / dt))
    a = ac.cost_ema_alpha
    step_s, token_s = st.step_s, st.token_s
    dsteps = served.steps - st.steps
    if live.reports_busy and dsteps > 0:
        step_s = ema(step_s, (live.engine_busy_s_total - st.engine_busy) / dsteps, a)
    dtok = live.prefill_tokens_total - st.prefill_tokens
    if dtok > 0:
        token_s = ema(token_s, (live.prefill_busy_s_total - st.prefill_s) / dtok, a)
    extra = st.extra
    target, band = ac.occupancy_target, ac.deadband
    if occ < target - band and v.supply > v.active and v.demand >= v.limit_lo:
        step = step_s or served.request_s or cfg.tick_seconds
        w = step + v.mean_tokens * token_s
        cycle = (served.request_s + served.tool_s) or cfg.tick_seconds
        add = ac.gain * (target - occ) * cycle / w * v.mean_tokens
        extra += min(add, ac.max_step * v.pool)
    elif occ > target + band and extra > 0:
        extra *= max(0.0, 1.0 - ac.decrease * (occ - target) / (1.0 - target))
    extra = min(max(extra, 0.0), ac.max_overcommit * v.pool)
    return replace(_snapshot(st, b, now), extra=extra, occupancy=occ, step_s=step_s, token_s=token_s)


def _snapshot(st: OccupancyState, b: Backend, now: float) -> OccupancyState:
    s, lv = b.served, b.live
    return replace(st, at=now, occupied=s.occupied(now), steps=s.steps, engine_busy=lv.engine_busy_s_total,
                   prefill_s=lv.prefill_busy_s_total, prefill_tokens=lv.prefill_tokens_total)

