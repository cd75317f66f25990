"""Admission from goodput: how far to fill each backend, chosen by predicted and measured steps/s.

The fixed watermarks admit the programs whose KV fits the pool. That is right when recomputing
a context costs more than anything else (a GPU: prefill is expensive, decode batches nearly
for free) and wrong when the admitted programs leave the batch under-filled while they wait on
tools and a recompute is cheap (small or KV-bound engines, a pool that holds a few contexts).
This rule predicts the steps per second of each admission level from a model of the engine
fitted online and a model of the closed loop of programs, picks the best, and checks the pick
against measurement. Per backend, once per period (``tick_seconds``):

**1. The engine, fitted from its own counters** (``/v1/loads``, SGLang 0.5.23; the simulator
reports the same). Discounted least squares (half-life ``fit_half_life_periods``) over:

- decode iterations: ``t_dec(B) = d0 + d1·B`` from the differences of SGLang's
  ``decode_moments`` ``[n, Σb, Σt, Σb², Σb·t]`` (the KV the batch holds grows with B and is
  folded into d1: the counters carry no per-iteration KV);
- prefill, per block of periods with at least ``probe_min_steps`` steps (a step's prefill and
  its completion fall in different periods; blocks keep them together):
  ``busy = a·steps + β·uncached`` (engine prefill seconds against the router's completed
  steps and the engine's uncached prefill tokens): ``a`` is what a step
  costs whatever is cached (fixed costs, and attention over the whole sequence on
  ``torch_native``), ``β`` what each recomputed token adds. Until the periods vary enough to
  tell the two apart, the last split is kept, rescaled to the data; before any split,
  everything is charged per token (``a = 0``: recompute looks as dear as it can, the
  conservative side).

**2. The closed loop** (router timings, ``Backend.served``): each of n programs cycles
``tool Z`` → ``request R``. A step prefills ``u`` tokens — its new observation ``g`` if its KV
survived the tool call, plus its private context ``c`` when it did not — and decodes ``o``
tokens. With B requests in flight the engine spends ``R(B) = B·T̄ + o·t_dec(B)`` per request
(every request in flight prefills once while one request decodes o tokens), ``T̄ = a + β·ū``.
Little's law on the loop, ``B = n·R(B)/(Z + R(B))``, is a quadratic in B for ``R = αB + γ``;
the steps per second are ``X = B/R(B)``. B is capped by HBM: requests in flight hold
``c + o`` each beside the shared prefix and the idle protected KV that must stay on the device.
Which contexts survive a tool call: of n programs, ``k`` are *protected* (referenced, counted,
``kvrefs``), always kept; the others share the cache left over (pool − shared − protected −
running), which holds ``min(1, left/(idle·c))`` of their idle KV; evicting the longest idle
first, a context survives when its tool call ends before the eviction age (Che's
approximation over the measured tool-time distribution, ``_lru_survival``): with heavy-tailed
tools a small overcommit evicts only the long waits. Without session references no
KV is protected and all idle programs share the LRU.

The quadratic is a mean-value model: it takes the requests to arrive evenly. They do not (a
restored context's prefill holds the steps behind it, programs come back from their tools
together), and an engine that a few programs leave idle part of the time makes its requests
wait longer than the model says. The measured loop says by how much: over the fit's
half-life, the programs running (program-seconds per second) over the steps per second is
the cycle; less the tool time and the model's request time at the measured rate, what is
left is the *slack*, the seconds per cycle the model does not see (``_slack``). It is added to
the tool time of every level's prediction: it costs a level that leaves the engine idle and
vanishes at a level that saturates it (the closed loop's rate is then the engine's whatever
the cycle). It is read only while the engine's counters show it idle (busy below
``SLACK_BUSY``, averaged over the fit's half-life), and kept when the engine is busy: there a
gap between model and measurement is the engine's, and read as cycle time it would make every
level that idles look worse than it is (ToolOrchestra DES: the top level, 0.80 of the bound
against 0.89). Never negative (a model that underrates a level is corrected by probes), at most
the tool time. (CPU-engine DES, ctx20-tool2-out16-x6 at steady state: without it the model put
the fixed watermarks 23% above what they ran, 4–5 programs and the engine 60% busy, 0.95 of
request-level routing on one engine and 0.91 on two; with it, 1.02 on both.)

The programs running are the admitted ones, and an agent that ended without saying so (an
inferred program) stays admitted, silent, until it is made dormant or released. Each tick the
controller reads its probability of having ended (``Program.ended_p``); their sum
(``BackendView.ended``) is counted out of the programs that cycle, in the measured loop and
in every level's prediction (a level keeps its n places, n − ended of them cycle). Counted
in, the ended agents made the loop look slower than it ran (read as slack) and the fixed
watermarks, where some places hold ended agents, predict as well as admitting all while live
programs waited (``cpu-agent`` DES, N = 8: 0.991 of explicit ids' steps/min before, 1.001
after; ``bench/results/inferred-des/``).

**3. The choice.** Levels ``j = 0…levels``: extra tokens ``E·(g^j − 1)/(g^levels − 1)`` above
``λ_max·pool`` (level 0 = the fixed watermarks; g = ``LEVEL_GROWTH``: fine steps just above
the watermarks, coarse ones far above), ``E`` what the backend's *supply* needs beyond what
fits, each program counted whole, at most ``max_overcommit·pool``; so ``n_j`` programs of the
mean weighted demand. The supply is the backend's share, by pool, of every program there is to
run (the open backends' and the global queue's; its own where they are more,
``ThunderScheduler._shares``): with one backend, all of them; on several, a backend admitted
above the watermarks takes no program beyond its share (``BackendLoad.max_active``). Each level is predicted with every program
within ``λ_max·pool`` protected, and (on backends with references) with none protected; the
best wins. Leaving level 0, or the model's current choice, needs a predicted gain of
``min_gain`` (returning to level 0, a gain below ``min_gain/2``: a band), and a new choice
must hold a whole program cycle (tool + request, at least ``MODEL_HOLD`` periods) running
before the model takes it: a level acts only once its programs
have cycled, and a preference that swings faster moved the level back and forth, each move
paying the restores of the programs it admitted (ToolOrchestra DES: level 0 → the top level →
level 0 within a minute, several times a run). The
predictions compared are smoothed over periods (EMA, ``cost_ema_alpha``): one period's inputs
— the tool times and the steps that ended in it — swing them, and unsmoothed the choice
flipped between the lowest and the highest level every few periods. The
level's extra tokens also raise the HBM condition of requests (``hbm_extra``, ``scheduler.gate``):
the programs admitted beyond the pool run best-effort, their requests queued by the engine.

**The calibration** (``calibrate``, on by default). Two arms, level 0 and the levels above
it, each keep the steps measured in the settled periods run there outside probes and the
steps the model predicted for those periods, discounted over the fit's half-life; each
level's prediction is multiplied by its arm's factor, measured over predicted
(``_calibration``), before the choice. The model is a mean-value one and errs by level: where
the levels above the watermarks thrash (contexts evicted under LRU more than the survival
model says, restores bunched after each change of level) it rates them above what they run,
and where its predictions of all the levels lie within a few percent of each other the
smoothed choice swung between level 0 and the top every 20-40 s, each swing pausing or
restoring half the programs, while the top ran at 0.7 of its prediction (DES of the real
HiCache CPU engine, ``cpu-agent`` N = 32 at steady state: 84-147 steps/min over 8 seeds, mean
114; calibrated 119-145, mean 134, beside thunder-paper's 89 and request-level's 87). An arm
with no evidence takes the other's factor, so an error common to both changes nothing (the
CPU-engine DES grid, two seeds: 50 of 72 cells unchanged, the others 0.96-1.04, geometric
mean 1.001; the DES hash runs identical), and evidence against a level fades over the
half-life, after which the model may try it again. Probes are still the exploration: the
calibration only rates the levels the model chose by what they measured.

**An open stream** (``_open``). The model is of a closed loop: a set of programs that cycle.
Where the programs that end here took fewer than ``OPEN_STEPS`` steps each (discounted over the
fit's half-life, at least ``OPEN_MIN_ENDS`` of them; shown as ``open_stream`` and
``steps_per_ended_program``), they are an open stream — conversations that arrive, take a turn
or two and leave — and the steps per second are the arrivals' whatever the level: a probe
measures only noise, and a level below the top only holds new conversations at the router
while the engine has room (Mooncake conversation trace on two CPU engines, DES: TTFT p99
10.7 s and 95.1% within 5 s against request-level routing's 1.2 s and 100%; at the top level
1.1 s and 100%, with twice its KV hit rate). There the model's choice is the top level, at
once, with no probes (a probe down measures nothing until the engine saturates, and for its
window holds new conversations at the router); the top level then admits every program there
is, beyond ``max_overcommit``, placements ignore the engine's own queue
(``BackendLoad.request_level``) and the HBM condition is off (``hbm_extra``): request-level
service, with KV references for the conversations that fit. A closed loop never reads as open: at its start no program has ended,
and agents take ten steps and more.

**4. The guard: measurement.** Goodput is measured per level over a window of whole periods
(the period after a change is skipped: transient). Every ``probe_every_periods`` the level
moves up or down (alternating; down only while the engine is busy, ``probe_down_busy``) for
``probe_periods`` — longer, up to 4×, until it has counted
``probe_min_steps`` steps — to the nearest level whose change of programs its window can
measure: in a closed loop steps/s cannot grow faster than the programs that run, so a probe
smaller than the noise could never win and is not made (on a GPU, where a window of a few
seconds cannot see a few percent, probes are rare; on a small engine they are large). If the probe's measured
rate beats the window before it by more than the noise — a log ratio above
``max(log(1 + probe_margin), σ·√(φ·(1/n₁ + 1/n₂)))`` for n₁, n₂ steps counted, σ =
``probe_sigmas`` and φ the dispersion of the periods' step counts (``_dispersion``: programs
that start, end and swing together make counts vary far more than Poisson's φ = 1), so a
decision needs evidence (hysteresis) — the bias moves one level that way, bounded by
``±max_bias``; otherwise the level returns. A prediction that is wrong is
corrected by the bias: probes down that win walk it down one measurable step at a time. A
negative bias expires a level at a time when no probe has moved it for ``MAX_BACKOFF`` probe
intervals (from below the model's choice a probe up may be unmeasurable or barred, so a verdict
won in a transient would stand for good; where it was right, the next probe down restores it). With
``reference_probes`` every other probe down from above level 1 goes straight to level 0, the
fixed watermarks, measured beside the window just before it; when the watermarks win — the
predicted gain is not there — the choice falls back to level 0 and is capped there (each probe
up that wins from the cap raises it one level). Off by default: from a high level such a probe
pauses most programs at once (52 of 60 in the DES grid cell ctx10-tool8-out16-x6), and their
restores cost more than the check is worth. A probe that loses doubles the wait before the next one in its direction (up to
16×). Probes up test levels above the model's choice; they cost the recompute of what they
admit and then pause, which on a saturated engine outweighs anything they can find, so by
default (``probe_up: idle``) they run only while the engine's own counters show it busy less
than ``probe_up_busy`` of the time, both lately (averaged over the fit's half-life) and over the
window the probe would be compared with: where there is idle time to fill (a small engine whose
model, fitted at low concurrency, underrates how well prefills batch), not a moment when every
admitted program of a saturated engine is in a tool at once. A probe up skips a
whole program cycle (tool + request) before it counts — the programs it admits first send the
requests they had waiting, a burst the level cannot keep — and one that wins is kept only
once a fresh window at its level, after the same settling, beats the rate before the probe
(``_confirm``).

On an engine whose batch gains nothing (``d0 = 0``, ``a = 0``) and that the programs that fit
already keep busy, more programs only add
recompute, so level 0 wins and the rule is the fixed watermarks. Pure and deterministic:
``update`` takes the previous state, the backend's counters and time, returns the next state,
a new one (the state it is given is never written; the tick stores the new one on the backend
through ``Decisions``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import cache
from operator import attrgetter
from typing import Any, NamedTuple

from thunder_sgl.backends.backend import Backend
from thunder_sgl.config import AdmissionConfig, SchedulerConfig

_MOMENTS = 5  # n, Σb, Σt (s), Σb², Σb·t (s)
MAX_BACKOFF = 16
"""A lost probe doubles the wait before the next in its direction, up to this many times; a
fallback's cap and a negative bias expire after this many probe intervals."""
SLACK_BUSY = 0.8
"""The slack (module header, part 2) is read only while the engine is busy less than this share
of the time (averaged over the fit's half-life); above it the last reading is kept."""
MODEL_HOLD = 2
"""Fewest periods running a new preference of the model must hold before the model's choice
follows it (and a whole program cycle, tool + request, when that is longer)."""
OPEN_STEPS = 4.0
"""Programs that end after fewer steps than this on average (discounted over the fit's
half-life) make an open stream, not a closed loop (``_open``)."""
OPEN_MIN_ENDS = 8.0
"""Programs that must have ended (discounted) before the stream is judged open."""


# ---- 1. the engine, fitted ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DecodeFit:
    """Discounted sums of decode iterations: t = d0 + d1·b by least squares."""

    n: float = 0.0
    sb: float = 0.0
    st: float = 0.0
    sbb: float = 0.0
    sbt: float = 0.0

    def add(self, d: tuple[float, ...], keep: float) -> DecodeFit:
        return DecodeFit(keep * self.n + d[0], keep * self.sb + d[1], keep * self.st + d[2],
                         keep * self.sbb + d[3], keep * self.sbt + d[4])

    def line(self) -> tuple[float, float] | None:
        """(d0, d1) in seconds; None before any iteration. A batch that never varied gives
        no slope: then d1 = 0 (all fixed), the optimistic side for batching, which a probe
        up then tests against measurement."""
        if self.n <= 0:
            return None
        mb, mt = self.sb / self.n, self.st / self.n
        var = self.sbb / self.n - mb * mb
        if var <= 1e-6 * max(1.0, mb * mb):
            return max(mt, 0.0), 0.0
        d1 = (self.sbt / self.n - mb * mt) / var
        d1 = max(d1, 0.0)
        d0 = mt - d1 * mb
        if d0 < 0.0:  # no negative fixed cost: all per request
            d0, d1 = 0.0, mt / mb if mb > 0 else 0.0
        return d0, d1


@dataclass(frozen=True, slots=True)
class PrefillFit:
    """Discounted normal equations of ``busy = a·steps + β·tokens`` over periods."""

    s11: float = 0.0
    s12: float = 0.0
    s22: float = 0.0
    s1y: float = 0.0
    s2y: float = 0.0

    def add(self, steps: float, tokens: float, busy: float, keep: float) -> PrefillFit:
        return PrefillFit(keep * self.s11 + steps * steps, keep * self.s12 + steps * tokens,
                          keep * self.s22 + tokens * tokens, keep * self.s1y + steps * busy,
                          keep * self.s2y + tokens * busy)

    @property
    def tokens_per_step(self) -> float:
        """Tokens the engine prefilled per step over the fit's memory (steps-weighted); 0
        before any block."""
        return self.s12 / self.s11 if self.s11 > 0 else 0.0

    def coefficients(self, prev: tuple[float, float] | None = None) -> tuple[float, float] | None:
        """(a, β); None before any prefill. While the two regressors are too collinear to tell
        apart, the previous split is kept, rescaled to the data (continuity), or — with none —
        everything is charged per token (the conservative side: recompute as dear as it can be)."""
        if self.s22 <= 0:
            return None
        det = self.s11 * self.s22 - self.s12 * self.s12
        per_token = (0.0, max(self.s2y / self.s22, 0.0))
        if prev is not None and (prev[0] > 0 or prev[1] > 0):
            scaled = prev[0] * self.s11 + prev[1] * self.s12
            fallback = (prev[0] * self.s1y / scaled, prev[1] * self.s1y / scaled) if scaled > 0 and self.s1y > 0 \
                else per_token
        else:
            fallback = per_token
        # The sums are not centred (no intercept): 1 − det/(s11·s22) is the squared cosine of
        # the steps and tokens vectors, near 1 whenever tokens per step vary little; below
        # 1 − 0.01 the per-step and per-token parts are told apart.
        if det <= 0.01 * self.s11 * self.s22:
            return fallback
        a = (self.s22 * self.s1y - self.s12 * self.s2y) / det
        b = (self.s11 * self.s2y - self.s12 * self.s1y) / det
        if a < 0 or b < 0:
            return fallback
        return a, b


@dataclass(frozen=True, slots=True)
class Engine:
    d0: float
    """Decode: seconds per iteration, fixed."""
    d1: float
    """Decode: seconds per iteration per request in the batch."""
    a: float
    """Prefill: seconds per step whatever is cached."""
    b: float
    """Prefill: seconds per uncached token."""


@dataclass(frozen=True, slots=True)
class Loop:
    """The programs' closed loop on one backend, as the router measured it."""

    tool_s: float
    """Z: mean tool time between a program's requests."""
    context: float
    """c: mean private context (tokens) of a program."""
    shared: float
    """Shared-prefix tokens on the backend (cached once)."""
    output: float
    """o: mean output tokens per step."""
    new_tokens: float
    """g: mean new prompt tokens per step (the observation)."""
    hbm: float
    """Device KV tokens."""
    cache: float
    """Tokens the backend keeps across tiers (the pool)."""
    refs: bool
    """The engine keeps referenced KV first (session radix cache)."""
    tools: tuple[tuple[float, float], ...] = ()
    """The tool times' distribution: (seconds, share) points (``ToolTimes.points``); empty:
    every idle context equally likely to be evicted."""
    slack: float = 0.0
    """Seconds of each program cycle the model does not see (measured, ``_slack``)."""


@dataclass(frozen=True, slots=True)
class Prediction:
    rate: float
    """Steps per second."""
    batch: float
    """Requests in flight on the engine."""
    survive: float
    """Share of unprotected contexts that survive a tool call."""
    uncached: float
    """Mean tokens a step prefills."""


def predict(n: float, k: float, e: Engine, lp: Loop, churn: float = 0.0) -> Prediction:
    """Steps per second of n programs, k of them protected (see the module header, part 2);
    ``churn``: tokens every step prefills beyond the model's (measured, ``update``)."""
    if n <= 0:
        return Prediction(0.0, 0.0, 1.0, 0.0)
    c, o, g, z = max(lp.context, 1.0), max(lp.output, 1.0), min(lp.new_tokens, lp.context), max(lp.tool_s, 0.0)
    if not lp.refs:
        k = 0.0
    k = min(k, n, max(0.0, (lp.cache - lp.shared) / c))
    survive, x, batch, u = 1.0, 0.0, 0.0, g
    for _ in range(4):  # survival depends on the batch, the batch on survival: a few rounds settle
        u_free = g + (1.0 - survive) * (c - g)
        u = (k * g + (n - k) * u_free) / n + churn
        t_pre = e.a + e.b * u
        alpha = t_pre + o * e.d1
        gamma = o * e.d0
        batch = _in_flight(n, z + lp.slack, alpha, gamma, t_pre + o * (e.d0 + e.d1))
        idle = n - batch
        idle_k = k * idle / n
        pinned = idle_k * c if lp.cache <= lp.hbm else max(0.0, idle_k * c - (lp.cache - lp.hbm))
        cap = max(1.0, (lp.hbm - lp.shared - pinned) / (c + o))
        run = min(batch, cap)
        r = max(run, 1.0) * t_pre + o * (e.d0 + e.d1 * max(run, 1.0))
        x = run / r if run >= 1.0 else batch / r
        left = lp.cache - lp.shared - k * c - run * (c + o) * (n - k) / n
        idle_free = (n - k) * idle / n
        share = 1.0 if idle_free <= 1e-9 else min(1.0, max(0.0, left) / (idle_free * c))
        new_survive = _lru_survival(share, lp.tools)
        if abs(new_survive - survive) < 1e-4:
            survive = new_survive
            break
        survive = new_survive
    return Prediction(x, batch, survive, u)


def _lru_survival(share: float, tools: tuple[tuple[float, float], ...]) -> float:
    """Share of idle contexts that outlive their tool call when the cache keeps ``share`` of
    the idle KV, evicting the longest idle first (LRU). Che's approximation: a context is
    evicted once it has been idle for T, where T makes the KV held — each idle context
    counted for the part of its tool call before T, ``E[min(Z, T)] / E[Z]`` — equal to
    ``share``; it survives when its tool call is shorter: ``P(Z < T)``. With heavy-tailed
    tool times a small shortfall of cache evicts only the long waits; without a
    distribution, or for exponential ones, survival is ``share`` itself."""
    if share >= 1.0 or not tools:
        return max(0.0, min(1.0, share))
    if share <= 0.0:
        return 0.0
    mean = sum(z * w for z, w in tools)
    if mean <= 0:
        return share
    lo, hi = 0.0, max(z for z, _ in tools)
    for _ in range(40):
        t = (lo + hi) / 2
        held = sum(min(z, t) * w for z, w in tools) / mean
        if held < share:
            lo = t
        else:
            hi = t
    t = (lo + hi) / 2
    return sum(w for z, w in tools if z < t) + 0.5 * sum(w for z, w in tools if z == t)


def _slack(e: Engine, lp: Loop, loop: tuple[float, float, float], v: BackendView, churn: float) -> float:
    """Seconds per program cycle the model does not see (module header, part 2): the measured
    cycle of the programs running (``loop``: steps, seconds, program-seconds) less the tool time
    and the request time the model gives at the measured rate; at least 0, at most the tool
    time."""
    steps, secs, prog_s = loop
    if steps < 1.0 or secs <= 0.0:
        return 0.0
    x = steps / secs
    n = prog_s / secs
    c = max(lp.context, 1.0)
    k = min(n, max(0.0, (v.fit_limit - v.shared) / c))
    p = predict(n, k, e, lp, churn)
    t_pre = e.a + e.b * p.uncached
    o = max(lp.output, 1.0)
    alpha, gamma = t_pre + o * e.d1, o * e.d0
    if alpha * x >= 1.0:
        return 0.0
    r = max(gamma / (1.0 - alpha * x), t_pre + o * (e.d0 + e.d1))
    return min(max(0.0, n / x - max(lp.tool_s, 0.0) - r), max(lp.tool_s, 0.0))


def _in_flight(n: float, z: float, alpha: float, gamma: float, alone: float) -> float:
    """B solving ``B = n·R/(Z + R)`` with ``R = α·B + γ`` (B ≥ 1), or ``R = alone`` below 1."""
    if z <= 0:
        return n
    low = n * alone / (z + alone)
    if low < 1.0 or alpha <= 0:
        return min(n, low) if alpha <= 0 else low
    bq = z + gamma - n * alpha
    return (-bq + math.sqrt(bq * bq + 4.0 * alpha * n * gamma)) / (2.0 * alpha)


# ---- state ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AdmissionState:
    """The rule's state on one backend (``Backend.admission``)."""

    extra: float = 0.0
    """Tokens admitted beyond ``λ_max·pool``."""
    protect: float = math.inf
    """Tokens of KV kept referenced (programs past it in pause order run unreferenced)."""
    level: int = 0
    model_level: int = 0
    model_next: int = 0
    """The model's preference last period: ``model_level`` follows a preference held a program
    cycle (at least ``MODEL_HOLD`` periods)."""
    model_streak: int = 0
    """Periods running the model has preferred ``model_next``."""
    smoothed: tuple[float, ...] = ()
    """Each level's predicted steps/s, smoothed over periods (EMA, ``cost_ema_alpha``): one
    period's inputs (the tool times and the steps that ended in it) swing the prediction."""
    bias: int = 0
    """Levels that measurement moved the choice away from the model's (bounded by ``max_bias``)."""
    ceiling: int = 1 << 30
    """Highest level allowed: set by a fallback (a probe down that won with the bias at its
    bound), raised by each probe up that wins beyond it."""
    ceiling_at: float = 0.0
    """When the cap was set (it expires after ``MAX_BACKOFF × probe_every_periods`` periods)."""
    bias_at: float = 0.0
    """When a probe last moved the bias, or won against it at its bound: a negative bias expires
    one level at a time, each ``MAX_BACKOFF × probe_every_periods`` periods without one
    (``_expire``)."""
    predicted: float = 0.0
    """Steps/s the model predicts at ``level``."""
    predicted_fixed: float = 0.0
    """Steps/s the model predicts at level 0 (the fixed watermarks)."""
    measured: float = 0.0
    """Steps/s measured over the current window."""
    at_fixed: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Steps, seconds and the steps the model predicted of the settled periods run at level 0
    outside probes, discounted over the fit's half-life (``_calibration``)."""
    above_fixed: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """The same over the periods run above level 0 at the model's choice (outside probes)."""
    factors: tuple[float, float] = (1.0, 1.0)
    """The calibration's factors of level 0 and of the levels above it (``_calibration``)."""
    probe: int = 0
    """Direction of the probe under way (0: none)."""
    probe_left: int = 0
    probe_from: int = 0
    """The level the probe under way left."""
    next_probe: int = 1
    since_probe: int = 0
    up_wait: int = 1
    """Multiplier of ``probe_every_periods`` before the next probe up (doubles after a lost
    probe, up to ``MAX_BACKOFF``)."""
    down_wait: int = 1
    base_rate: float = 0.0
    base_steps: int = 0
    reference: bool = False
    """The probe under way goes to level 0 (the fixed watermarks) to check the gain is there."""
    next_reference: bool = False
    """The next probe down is a reference probe."""
    confirm: bool = False
    """A probe up won and moved the bias one level up, until a whole window at its level
    confirms it."""
    confirm_rate: float = 0.0
    """The rate before that probe, which the confirming window must beat."""
    fallbacks: int = 0
    probes: int = 0
    probes_won: int = 0
    win_steps: int = 0
    win_s: float = 0.0
    win_n: int = 0
    """Periods in the window ..."""
    win_sq: float = 0.0
    """... and the sum of their squared step counts (the counts' dispersion)."""
    win_busy: float = 0.0
    """Seconds of the window the engine spent in prefill and decode iterations."""
    base_phi: float = 1.0
    """Dispersion of the window a probe is compared with."""
    settle: int = 1
    """Periods still skipped before the window counts (a change's transient)."""
    changes: int = 0
    busy: float = 1.0
    """The share of time the engine spent in prefill and decode iterations, averaged over the fit's half-life."""
    block: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Steps, prefill tokens and prefill seconds of the periods not yet in the prefill fit."""
    churn: float = 0.0
    """Tokens per step prefilled beyond the model's at the current level (program rotation)."""
    ends: tuple[float, float] = (0.0, 0.0)
    """Programs that ended after their last step here and their steps, discounted over the
    fit's half-life: few steps per program is an open stream (``open_stream``)."""
    loop: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Steps, seconds and program-seconds running, discounted over the fit's half-life: the
    measured closed loop that ``slack`` is read from."""
    slack: float = 0.0
    """Seconds per program cycle the model does not see (``_slack``)."""
    at: float | None = None
    snap: tuple[float, ...] = ()
    """Counters at ``at``: steps, prefill tokens, prefill s, new tokens, output tokens, moments."""
    dec: DecodeFit = DecodeFit()
    pre: PrefillFit = PrefillFit()
    engine: Engine | None = None
    n: float = 0.0
    """Programs the level admits (predicted)."""
    k: float = 0.0
    """Of them protected."""
    ended: float = 0.0
    """Of the backend's active programs, how many are likely ended (``BackendView.ended`` at
    the last period): counted out of those that cycle."""

    @property
    def fixed_rate(self) -> float:
        """Steps/s measured at level 0, over every settled period there (``at_fixed``; 0: none yet)."""
        steps, secs, _ = self.at_fixed
        return steps / secs if secs > 0 else 0.0

    @property
    def open_stream(self) -> bool:
        """The backend is fed an open stream of programs (``_open``): the model's choice is the
        top level."""
        return _open(self.ends)

    @property
    def hbm_extra(self) -> float:
        """The HBM condition rises with the level: requests of the programs admitted beyond the
        pool go to the engine, whose own scheduler queues what its KV cannot hold, instead of
        waiting at the router (which releases them later and sizes them coarsely). On an open
        stream there is no condition at all: the engine queues every request, as under
        request-level routing (held at the router past a few pools in flight, they were
        released out of their order of arrival and the TTFT tail grew: real CPU engines at
        overload, p99 78 s against direct's 50 s)."""
        return math.inf if self.open_stream else self.extra

    def view(self) -> dict[str, object]:
        """What ``GET /workers`` and ``/metrics`` show."""
        e = self.engine
        return {
            "rule": "goodput", "level": self.level, "model_level": self.model_level, "bias": self.bias,
            "ceiling": None if self.ceiling >= 1 << 30 else self.ceiling,
            "extra_tokens": round(self.extra),
            "protected_tokens": None if math.isinf(self.protect) else round(self.protect),
            "programs": round(self.n, 2), "protected_programs": round(self.k, 2),
            "likely_ended_programs": round(self.ended, 2),
            "predicted_steps_per_s": round(self.predicted, 4),
            "predicted_fixed_steps_per_s": round(self.predicted_fixed, 4),
            "measured_steps_per_s": round(self.measured, 4),
            "fixed_measured_steps_per_s": round(self.fixed_rate, 4),
            "probe": {0: "none", 1: "up", -1: "down"}[self.probe],
            "probes": self.probes, "probes_won": self.probes_won, "fallbacks": self.fallbacks,
            "level_changes": self.changes, "churn_tokens_per_step": round(self.churn, 1),
            "slack_s": round(self.slack, 3),
            "calibration_fixed": round(self.factors[0], 3), "calibration_above": round(self.factors[1], 3),
            "open_stream": self.open_stream,
            "steps_per_ended_program": round(self.ends[1] / self.ends[0], 2) if self.ends[0] > 0 else None,
            "engine": None if e is None else {"decode_fixed_s": e.d0, "decode_per_request_s": e.d1,
                                              "prefill_per_step_s": e.a, "prefill_per_token_s": e.b},
        }



_STATE_FIELDS = tuple(f.name for f in fields(AdmissionState))
_state_values = attrgetter(*_STATE_FIELDS)
_state_setters = tuple(getattr(AdmissionState, name).__set__ for name in _STATE_FIELDS)
_set = object.__setattr__


def _with(st: AdmissionState, **changes: Any) -> AdmissionState:
    """``dataclasses.replace(st, **changes)`` at 40% of its cost: ``update`` derives a
    backend's state in several such steps every period, and ``replace`` (every field passed
    through the frozen ``__init__``) was a third of the tick of a router that keeps the states
    (64 backends). A copy through the slots, then the changes: the same state, since every
    field is an ``__init__`` field and nothing runs after it (a test holds the two equal)."""
    new = object.__new__(AdmissionState)
    for setter, value in zip(_state_setters, _state_values(st), strict=True):
        setter(new, value)
    for name, value in changes.items():
        _set(new, name, value)
    return new


def _write(st: AdmissionState, **changes: Any) -> None:
    """Write ``changes`` into ``st``, a state that ``update`` copied this period (``_with``)
    and has not returned yet: no one else holds it, so it is still being built, as the
    frozen ``__init__`` builds a state. ``update`` copies the state it is given once and
    writes each later step of the period into that copy (it and its step functions below:
    ``_confirm``, ``_set_level``, ``_maybe_probe``, ``_end_probe``, ``_apply``) instead of
    copying every field at each step, seven on average — 1.8 ms of a tick over 64 backends.
    The state given and the state returned stay immutable; only the one in the making is
    written."""
    for name, value in changes.items():
        _set(st, name, value)


@dataclass(frozen=True, slots=True)
class BackendView:
    """What the tick knows of a backend when it updates the rule."""

    pool: float
    fit_limit: float
    """``λ_max·pool``."""
    demand: float
    shared: float
    """Shared-prefix tokens counted on the backend."""
    active: int
    context: float
    """Mean private context (tokens) of the backend's programs."""
    output: float
    """Mean expected output tokens per step."""
    supply: int
    """Programs that could run here: the backend's active ones plus the global queue."""
    limit_lo: float = 0.0
    """The low watermark with the current extra (the occupancy rule reads it)."""
    mean_tokens: float = 0.0
    """Mean whole context c of the backend's programs (the occupancy rule reads it)."""
    ended: float = 0.0
    """Of the active programs, how many are expected to have ended (Σ ``Program.ended_p``:
    inferred programs whose clients have been silent for long); they do not cycle."""


def _counters(b: Backend) -> tuple[float, ...]:
    s, lv = b.served, b.live
    m = lv.decode_moments or (0.0,) * _MOMENTS
    return (float(s.steps), float(lv.prefill_tokens_total), lv.prefill_busy_s_total, float(s.new_tokens),
            float(s.output_tokens), *m[:_MOMENTS], float(s.ended), float(s.ended_steps))


def update(state: AdmissionState | None, b: Backend, v: BackendView, now: float, cfg: SchedulerConfig) -> AdmissionState:
    ac = cfg.admission
    if state is None:  # built at once: a default state and a replace cost three times as much
        return AdmissionState(at=now, snap=_counters(b))
    st = state
    if st.at is None:
        return _with(st, at=now, snap=_counters(b))
    dt = now - st.at
    if dt < cfg.tick_seconds:
        return st
    cur = _counters(b)
    d = [x - y for x, y in zip(cur, st.snap, strict=True)] if len(st.snap) == len(cur) else [0.0] * len(cur)
    if any(x < 0 for x in d):  # an engine restarted: its counters went back; skip this period
        d = [0.0] * len(cur)
    dsteps, dtok, dpre, dnew, dout = d[0], d[1], d[2], d[3], d[4]
    dend, dend_steps = d[5 + _MOMENTS], d[6 + _MOMENTS]
    keep = 0.5 ** (1.0 / ac.fit_half_life_periods)
    dec = st.dec.add(tuple(d[5:5 + _MOMENTS]), keep) if d[5] > 0 else st.dec
    pre = st.pre
    bs, bt, bp = st.block[0] + dsteps, st.block[1] + dtok, st.block[2] + dpre
    if bs >= ac.probe_min_steps and bt > 0:
        pre = pre.add(bs, bt, bp, keep)
        bs = bt = bp = 0.0
    engine = _engine(dec, pre, st.engine) or st.engine
    # not clipped per period, and averaged over the fit's half-life: counters arrive in lumps
    # (a poll between the iterations of a long decode), and clipping each period's share at 1,
    # or a short average, read a saturated engine as idle a third of the time
    busy = max(0.0, (dpre + d[7]) / dt) if b.live.reports_busy else 1.0
    # the period's one copy of the state: every later step of this update writes into it (``_write``)
    ends = (keep * st.ends[0] + dend, keep * st.ends[1] + dend_steps)
    st = _with(st, at=now, snap=cur, dec=dec, pre=pre, engine=engine, block=(bs, bt, bp),
               busy=st.busy + (1.0 - keep) * (busy - st.busy), ends=ends)
    # 4. the window measured at the current level
    if st.settle:
        _write(st, settle=st.settle - 1)
    else:
        _write(st, win_steps=st.win_steps + int(dsteps), win_s=st.win_s + dt, win_n=st.win_n + 1,
               win_sq=st.win_sq + dsteps * dsteps, win_busy=st.win_busy + busy * dt)
    _write(st, measured=st.win_steps / st.win_s if st.win_s > 0 else 0.0)
    # the two arms of the calibration: level 0 and the levels above it, period by period
    af, ab = st.at_fixed, st.above_fixed
    af, ab = (keep * af[0], keep * af[1], keep * af[2]), (keep * ab[0], keep * ab[1], keep * ab[2])
    if not st.settle and not st.probe and not st.confirm and dt > 0 and st.smoothed:
        pred = st.smoothed[min(st.level, len(st.smoothed) - 1)] * dt
        if st.level == 0:
            af = (af[0] + dsteps, af[1] + dt, af[2] + pred)
        else:
            ab = (ab[0] + dsteps, ab[1] + dt, ab[2] + pred)
    _write(st, at_fixed=af, above_fixed=ab)
    # 2–3. the model and its choice
    lp = Loop(tool_s=b.served.tool_s, context=v.context, shared=v.shared,
              output=dout / dsteps if dsteps > 0 else v.output,
              new_tokens=dnew / dsteps if dnew > 0 and dsteps > 0 else 0.1 * v.context,
              hbm=float(b.tiers.hbm_tokens), cache=v.pool, refs=b.session_refs and cfg.session_refs,
              tools=b.served.tool_hist.points())
    ls, lt, la = st.loop
    loop = (keep * ls + dsteps, keep * lt + dt, keep * la + max(0.0, v.active - v.ended) * dt)
    _write(st, loop=loop, ended=v.ended)
    if st.busy < SLACK_BUSY and engine is not None and loop[0] >= 2 * ac.probe_min_steps:
        _write(st, slack=_slack(engine, lp, loop, v, st.churn))  # read only while the engine idles
    slack = st.slack
    lp = Loop(lp.tool_s, lp.context, lp.shared, lp.output, lp.new_tokens, lp.hbm, lp.cache, lp.refs, lp.tools, slack)
    opened = st.open_stream
    choices, churn = _choices(v, lp, engine, ac, st.level, pre.tokens_per_step, opened)
    # one program cycle (tool + request), in whole periods: what a probe up skips first
    cycle = max(1, math.ceil((b.served.tool_s + b.served.request_s) / cfg.tick_seconds))
    rates = [c.rate for c in choices]
    if len(st.smoothed) == len(rates) and all(r > 0 for r in st.smoothed):
        rates = [m + ac.cost_ema_alpha * (r - m) for m, r in zip(st.smoothed, rates, strict=True)]
    _write(st, smoothed=tuple(rates))
    if ac.calibrate:
        f0, f1 = _calibration(st.at_fixed, st.above_fixed, ac), _calibration(st.above_fixed, st.at_fixed, ac)
        rates = [r * (f0 if j == 0 else f1) for j, r in enumerate(rates)]
        _write(st, factors=(f0, f1))
    best = ac.levels if opened else _best(rates, ac.min_gain, st.model_level)
    streak = st.model_streak + 1 if best == st.model_next else 1
    if opened:  # at once (its "cycle" is a think time), and no probe's verdict holds it below
        _write(st, model_level=best, model_next=best, model_streak=streak, churn=churn, bias=0, ceiling=1 << 30,
               confirm=False)
    elif best != st.model_level and streak >= max(MODEL_HOLD, cycle):  # a preference held a cycle
        _write(st, model_level=best, model_next=best, model_streak=streak, churn=churn)
    else:
        _write(st, model_next=best, model_streak=streak, churn=churn)
    if st.probe:
        # a probe lasts probe_periods, and longer (up to 4×) until it has counted as many
        # steps as the window it is compared with needs (probe_min_steps)
        short = st.win_steps < ac.probe_min_steps and st.probe_left > -3 * ac.probe_periods
        if st.probe_left > 1 or short:
            _write(st, probe_left=st.probe_left - 1)
        else:
            _end_probe(st, ac, now, cycle)
    else:
        _write(st, since_probe=st.since_probe + 1)
    expiry = MAX_BACKOFF * ac.probe_every_periods * cfg.tick_seconds
    if st.ceiling < 1 << 30 and now - st.ceiling_at > expiry:
        _write(st, ceiling=1 << 30)
    if st.bias < 0 and not st.probe and not st.confirm and now - st.bias_at > expiry:
        _expire(st, now)
    if st.confirm and st.probe == 0 and st.win_steps >= ac.probe_min_steps \
            and st.win_s >= ac.probe_periods * cfg.tick_seconds:
        _confirm(st, ac, now)
    target = min(max(st.model_level + st.bias, 0), ac.levels, st.ceiling)
    if st.probe == 0 and target != st.level:
        _set_level(st, target)
        if st.confirm:  # the level a won probe led to: confirmed afresh after a whole cycle
            _write(st, settle=cycle)
    elif st.probe == 0 and not st.confirm and st.win_steps >= ac.probe_min_steps and not opened:
        _maybe_probe(st, ac, v, choices, cfg.tick_seconds, cycle)
    _apply(st, choices)
    return st


def _calibration(arm: tuple[float, float, float], other: tuple[float, float, float], ac: AdmissionConfig) -> float:
    """What the model's predictions are worth on one arm, level 0 or the levels above it
    (module header, part 3): the steps measured there over the steps the model predicted for
    the same periods (``at_fixed``, ``above_fixed``), with ``probe_min_steps`` steps of prior
    at the other arm's factor (itself shrunk towards 1 by as many), within [1/2, 2]. An arm
    not measured yet, or whose evidence has faded, takes the other's factor: an error common
    to both moves neither, and a model found optimistic at level 0 does not make the levels
    never run look better than they are."""
    m = float(ac.probe_min_steps)
    prior = (other[0] + m) / (other[2] + m)
    return min(2.0, max(0.5, (arm[0] + m * prior) / (arm[2] + m)))


def _expire(st: AdmissionState, now: float) -> None:
    """A negative bias moves one level back toward the model's choice once it has stood
    ``MAX_BACKOFF`` probe intervals unmoved. It holds the level below the model's, and from
    there it may never be tested again: a probe up to a level that admits too few more
    programs for its window to tell is not made (``_probe_level``), and ``probe_up: idle`` bars
    probes up while the engine is busy. So one probe down won in a start-up transient would
    stand for the rest of a run (the CPU-engine DES cell ctx20-tool8-out16-x4, seed 1: a probe
    down won at 300 s and held 16 of 20 programs to the end, 0.90 of direct; 0.98 with the
    expiry). Where the bias was right, the next probe down wins again and restores it. A
    positive bias needs no expiry: a fresh window confirmed it (``_confirm``), and probes down
    always run from above it."""
    _write(st, bias=st.bias + 1, bias_at=now)


def _confirm(st: AdmissionState, ac: AdmissionConfig, now: float) -> None:
    """A probe up that won is kept only if a whole window at its level, measured afresh after
    a settling period, beats the rate before the probe: a probe up is measured while the
    programs it admits send the requests they had waiting, a burst the level cannot keep up
    once their evictions come due. Otherwise the bias returns and the next probe up waits
    twice as long."""
    if st.measured > st.confirm_rate:
        _write(st, confirm=False, up_wait=1)
    else:
        _write(st, confirm=False, bias=max(st.bias - 1, -ac.max_bias), bias_at=now,
               up_wait=min(MAX_BACKOFF, st.up_wait * 2))


def _engine(dec: DecodeFit, pre: PrefillFit, prev: Engine | None) -> Engine | None:
    line, coef = dec.line(), pre.coefficients((prev.a, prev.b) if prev is not None else None)
    if line is None or coef is None:
        return None
    return Engine(line[0], line[1], coef[0], coef[1])


class Choice(NamedTuple):
    """What one admission level means on a backend, and what the model predicts of it."""

    extra: float
    """Tokens admitted beyond the watermarks."""
    protect: float
    """Tokens kept referenced (inf: all that fit)."""
    n: float
    """Programs running."""
    k: float
    """Programs with their KV protected."""
    rate: float
    """Predicted steps/s (0: no engine model yet)."""


def _choices(v: BackendView, lp: Loop, e: Engine | None, ac: AdmissionConfig, level: int,
             tokens_per_step: float, open_stream: bool = False) -> tuple[list[Choice], float]:
    """Every level's choice, and the churn: the tokens per step the engine prefilled beyond
    what the model predicts at the current level. Churn comes from programs rotating through
    the backend (paused, their KV dropped, restored later); it shrinks as a level runs more of
    the programs there are (none once all run)."""
    per = v.demand - v.shared
    w = per / v.active if v.active and per > 0 else max(lp.context, 1.0)
    base = max(v.fit_limit - v.shared, 0.0)
    k_fit = base / w
    # the levels span what the programs there are need beyond what fits, up to max_overcommit,
    # spaced geometrically: fine just above the watermarks, where a GPU's cliff is, coarse far
    # above them
    # what they need counts each program whole (undecayed): counted at the decayed mean, the
    # span followed the tool calls in progress, and with every program already running the top
    # level sat just above the demand of the moment — programs back from their tools pushed the
    # demand over it and were paused, to be restored a tick later (DES, two engines, cell
    # ctx05-tool2-out16-x2: 113 pauses at the top level in 1,200 s)
    need = max(0.0, float(v.supply) * max(w, v.context) - base) if v.supply else ac.max_overcommit * v.pool
    top = max(min(ac.max_overcommit * v.pool, need), w)
    extras = [top * share for share in level_shares(ac.levels)]
    # the top level admits everything there is with room to spare (demand swings as acting
    # programs' weights decay and come back): up to max_overcommit, so at the top nothing is
    # paused for lack of room — request-level service, with the references that pay
    extras[-1] = max(extras[-1], min(ac.max_overcommit * v.pool, 2.0 * top))
    if open_stream:  # every program there is, beyond max_overcommit: request-level service with
        # references. An open stream's programs wait minutes between turns; capped, they kept
        # their places and held new conversations at the router on an engine that had room
        # (one CPU engine 0.91 busy: 68% of first tokens within 5 s against 100% for direct)
        extras[-1] = max(extras[-1], 2.0 * need + ac.max_overcommit * v.pool)
    ns = [max(1.0, min(float(v.supply), (base + x) / w) if v.supply else (base + x) / w) for x in extras]
    if e is None:
        return [Choice(x, math.inf, n, min(n, k_fit), 0.0) for x, n in zip(extras, ns, strict=True)], 0.0
    n_cur = ns[min(level, ac.levels)]
    churn = 0.0
    if tokens_per_step > 0:
        churn = max(0.0, tokens_per_step - predict(n_cur, min(n_cur, k_fit), e, lp).uncached)
    rotating = float(v.supply) - n_cur
    out: list[Choice] = []
    for j, n in enumerate(ns):
        c = churn * max(0.0, float(v.supply) - n) / rotating if rotating > 0 else 0.0
        k = min(n, k_fit)
        cycling = max(1.0, n - v.ended)  # the programs likely ended hold places at every level
        choice = Choice(extras[j], math.inf, n, k, predict(cycling, min(k, cycling), e, lp, c).rate)
        if lp.refs and j > 0:  # none protected (only the shared prefix), if that predicts better
            none = predict(cycling, 0.0, e, lp, c).rate
            if none > choice.rate * (1.0 + ac.min_gain):
                choice = Choice(extras[j], v.shared, n, 0.0, none)
        out.append(choice)
    return out, churn


LEVEL_GROWTH = 1.35
"""Ratio of successive level steps: level j holds ``(g^j − 1)/(g^L − 1)`` of the span."""


def level_share(j: int, levels: int) -> float:
    """Share of the span above the watermarks that level ``j`` of ``levels`` admits."""
    g = LEVEL_GROWTH
    return (g ** j - 1.0) / (g ** levels - 1.0)


@cache
def level_shares(levels: int) -> tuple[float, ...]:
    """``level_share`` of every level ``0…levels`` (computed once per ``levels``)."""
    return tuple(level_share(j, levels) for j in range(levels + 1))


def _best(rates: list[float], min_gain: float, current: int) -> int:
    """The level with the highest predicted rate (``rates``, by level), with hysteresis: leaving
    level 0, or the current choice, needs a predicted gain of ``min_gain``; among levels within
    it of the best, the lowest (fewer programs, less at risk). Back to level 0 from a current
    choice within ``min_gain`` of the best only once that choice's gain over level 0 falls
    below ``min_gain/2``: a band, not one threshold both ways (with one, a smoothed gain
    hovering near ``min_gain`` flipped the choice between level 0 and the top level every few
    minutes on an engine with idle time, each flip pausing the programs the top level ran —
    the CPU-engine DES cell ctx05-tool8-out16-x2: 0.969 of direct, 0.979 with the band)."""
    top = max(rates)
    if top <= 0:
        return 0
    if 0 < current < len(rates) and top <= rates[current] * (1.0 + min_gain) \
            and rates[current] > rates[0] * (1.0 + min_gain / 2):
        return current  # within the band: stay
    if top <= rates[0] * (1.0 + min_gain):
        return 0
    if 0 <= current < len(rates) and top <= rates[current] * (1.0 + min_gain):
        return current
    for j, r in enumerate(rates):
        if r * (1.0 + min_gain / 2) >= top:
            return j
    return 0


def _beats(rate: float, steps: int, other: float, other_steps: int, floor: float, sigmas: float,
           phi: float = 1.0) -> bool:
    """Whether ``rate`` (measured over ``steps`` steps) exceeds ``other`` beyond the noise:
    their log ratio above ``sigmas`` standard deviations of a log ratio of counts,
    ``√(φ·(1/n₁ + 1/n₂))`` (φ = 1: Poisson counts; more when the periods' counts vary more,
    ``_dispersion``), and above ``log(1 + floor)``."""
    if rate <= 0 or steps <= 0 or other_steps <= 0:
        return False
    if other <= 0:
        return True
    return math.log(rate / other) > max(math.log1p(floor), sigmas * math.sqrt(phi * (1.0 / steps + 1.0 / other_steps)))


def _dispersion(st: AdmissionState) -> float:
    """φ: the variance of the window's per-period step counts over their mean (1 for Poisson
    counts; at least 1). Programs that start, end and swing between tools and requests
    together make counts vary far more than Poisson (in the DES grid, windows of 100 steps at
    one level differed by 1.5×): a test that assumed Poisson would take that for a gain."""
    n = st.win_n
    if n < 3 or st.win_steps <= 0:
        return 1.0
    mean = st.win_steps / n
    var = (st.win_sq - n * mean * mean) / (n - 1)
    return max(1.0, var / mean)


def _set_level(st: AdmissionState, level: int) -> None:
    if level != st.level:
        _write(st, level=level, win_steps=0, win_s=0.0, win_n=0, win_sq=0.0, win_busy=0.0, settle=1,
               changes=st.changes + 1, since_probe=0)


def _maybe_probe(st: AdmissionState, ac: AdmissionConfig, v: BackendView, choices: list[Choice],
                 tick: float, cycle: int) -> None:
    """Every ``probe_every_periods`` (times the direction's back-off) move up or down
    (alternating) to measure a level against the window so far; every other probe down from
    above level 1 is a reference probe, straight to level 0 (with ``reference_probes``).

    A probe goes only as far as it can be measured: in a closed loop the steps/s cannot grow
    faster than the programs run, so a probe up whose change of programs, ``log(n'/n)``, is
    below what its window can tell from noise (``_detectable``) could never win and is not
    made — the nearest level far enough is probed instead, or none. Down, a level that thrashes
    can lose far more than its share of programs, so when no level is far enough the probe goes
    to the watermarks. Up only where there is more to
    admit, and (``probe_up: idle``, the default) while the engine is busy less than
    ``probe_up_busy`` of the time — a probe up costs the recompute of what it admits and of
    the programs paused when it ends (in the DES of 2 saturated GLM nodes, 4% of a 25-minute
    run for probes none of which won) — or (``on``) where the model predicts ``min_gain``.
    Probes down guard the side where a wrong model hurts most: admitting too much, which
    shows as an engine kept busy; while it idles (busy below ``probe_down_busy`` lately and over
    the window) they wait: fewer programs cannot relieve it, and a probe down there only holds
    back programs it has room for."""
    need = _detectable(st.measured, st.win_steps, ac, tick)
    for d in (st.next_probe, -st.next_probe):
        wait = ac.probe_every_periods * (st.up_wait if d > 0 else st.down_wait)
        if not (0 <= st.level + d <= ac.levels and st.since_probe >= wait):
            continue
        if d > 0 and (v.supply <= v.active or ac.probe_up == "off"
                      or (ac.probe_up == "idle" and not _idle(st, ac))):
            continue  # nothing more to admit, or probes up are off (or the engine has no idle time)
        if d < 0 and not _busy(st, ac.probe_down_busy):
            continue  # the engine idles: fewer programs cannot relieve it (``probe_down_busy``)
        reference = ac.reference_probes and d < 0 and st.next_reference and st.level > 1
        to = 0 if reference else _probe_level(st.level, d, choices, need)
        if to is None and d < 0:
            to = 0  # down, a thrashing level can lose more than its programs: the watermarks
        if to is None:
            continue
        if d > 0 and ac.probe_up == "on" and choices[to].rate < (1.0 + ac.min_gain) * choices[st.level].rate:
            continue
        _write(st, base_rate=st.measured, base_steps=st.win_steps, base_phi=_dispersion(st), reference=reference,
               probe_from=st.level, next_probe=-d, probes=st.probes + 1,
               next_reference=(not st.next_reference) if d < 0 else st.next_reference)
        _set_level(st, to)
        if d > 0:  # the programs it admits send what they had waiting: skip a whole cycle
            _write(st, settle=cycle)
        _write(st, probe=d, probe_left=ac.probe_periods + st.settle)
        return


def _detectable(rate: float, steps: int, ac: AdmissionConfig, tick: float) -> float:
    """The smallest log ratio of rates a probe can tell from noise: ``probe_sigmas`` standard
    deviations of a log ratio of Poisson counts, the window so far against a probe window of
    ``probe_periods`` at about the same rate (and at least ``log(1 + probe_margin)``). Poisson,
    not the measured dispersion: a larger probe pauses more programs when it ends, and a
    probe down that finds no level far enough goes to the watermarks; the dispersion makes
    the comparison stricter instead (``_end_probe``)."""
    expected = max(rate * ac.probe_periods * tick, ac.probe_min_steps)
    return max(math.log1p(ac.probe_margin), ac.probe_sigmas * math.sqrt(1.0 / max(steps, 1) + 1.0 / expected))


def _idle(st: AdmissionState, ac: AdmissionConfig) -> bool:
    """The engine has idle time a probe up could fill: busy less than ``probe_up_busy`` both
    lately (``busy``, averaged over the fit's half-life) and over the whole window the probe
    would be compared with. A dip of the average inside a window the engine kept busy — a
    moment when every admitted program was in a tool at once, on a saturated engine — is not
    idle time a level can fill: admitting for it only adds recompute."""
    return not _busy(st, ac.probe_up_busy)


def _open(ends: tuple[float, float]) -> bool:
    """Whether the programs ending here took fewer than ``OPEN_STEPS`` steps each on average
    (at least ``OPEN_MIN_ENDS`` of them, discounted over the fit's half-life): an open stream
    of programs — conversations that arrive, take a turn or two and leave — not the closed
    loop the model is of. There the steps per second are the arrivals' whatever the level (a
    probe measures nothing but noise), and what a lower level buys is a queue at the router:
    new conversations held back while the engine has room (Mooncake conversation trace on two
    CPU engines: the p99 TTFT 10.7 s against request-level routing's 1.2 s). A closed loop
    never reads as open: at its start no program has ended, and agents take 10 steps and
    more."""
    return ends[0] >= OPEN_MIN_ENDS and ends[1] < OPEN_STEPS * ends[0]


def _busy(st: AdmissionState, share: float) -> bool:
    """The engine was busy at least ``share`` of the time lately (``busy``, averaged over the
    fit's half-life) or over the current window: where a probe down may find a level that
    relieves it (``probe_down_busy``)."""
    window = st.win_busy / st.win_s if st.win_s > 0 else st.busy
    return st.busy >= share or window >= share


def _probe_level(level: int, d: int, choices: list[Choice], need: float) -> int | None:
    """The nearest level the ``d`` way whose program count differs from the current one by a
    log ratio of at least ``need``; None when none does."""
    n0 = max(choices[level].n, 1.0)
    j = level + d
    while 0 <= j < len(choices):
        if abs(math.log(max(choices[j].n, 1.0) / n0)) >= need:
            return j
        j += d
    return None


def _end_probe(st: AdmissionState, ac: AdmissionConfig, now: float, cycle: int) -> None:
    """Compare the probe's window with the one before it: the bias moves one level the
    probe's way when it wins by more than the noise; a probe down that wins with the bias
    already at ``−max_bias`` caps the level at the probe's (a fallback: the model is wrong by
    more than the bias may correct; the cap expires after ``MAX_BACKOFF`` probe cycles); a
    lost probe doubles the wait before the next in its direction (up to ``MAX_BACKOFF``)."""
    phi = max(_dispersion(st), st.base_phi)
    won = st.base_rate > 0 and _beats(st.measured, st.win_steps, st.base_rate, st.base_steps, ac.probe_margin,
                                      ac.probe_sigmas, phi)
    d = st.probe
    if won and st.reference:  # the fixed watermarks beat the level the model chose: fall back
        _write(st, bias=0, ceiling=0, ceiling_at=now, fallbacks=st.fallbacks + 1, probes_won=st.probes_won + 1,
               up_wait=min(MAX_BACKOFF, st.up_wait * 2))
    elif won and d < 0 and st.bias <= -ac.max_bias:
        _write(st, ceiling=st.level, ceiling_at=now, fallbacks=st.fallbacks + 1, probes_won=st.probes_won + 1,
               down_wait=1, up_wait=min(MAX_BACKOFF, st.up_wait * 2), bias_at=now)
    elif won:  # one level the probe's way (a lucky window must not carry the bias far)
        moved = 1 if st.level > st.probe_from else -1
        _write(st, bias=min(max(st.bias + moved, -ac.max_bias), ac.max_bias), probes_won=st.probes_won + 1,
               bias_at=now)
        if d > 0 and st.level > st.ceiling:
            _write(st, ceiling=st.level)
        if d > 0:  # kept once a fresh window at this level confirms it (``_confirm``)
            _write(st, confirm=True, confirm_rate=st.base_rate, win_steps=0, win_s=0.0, win_n=0, win_sq=0.0,
                   win_busy=0.0, settle=cycle)
        else:
            _write(st, down_wait=1)
    elif d > 0:
        _write(st, up_wait=min(MAX_BACKOFF, st.up_wait * 2))
    else:
        _write(st, down_wait=min(MAX_BACKOFF, st.down_wait * 2))
    _write(st, probe=0, probe_left=0, reference=False)


def _apply(st: AdmissionState, choices: list[Choice]) -> None:
    extra, protect, n, k, rate = choices[st.level]
    _write(st, extra=extra, protect=protect, n=n, k=k, predicted=rate, predicted_fixed=choices[0].rate)


def summarize(views: list[dict[str, object]]) -> str:
    """One token (no spaces) for a run's notes: the levels held across backends (mean, range),
    programs admitted and protected (mean), probes started and won, fallbacks."""
    vs = [v for v in views if v and v.get("rule") == "goodput"]
    if not vs:
        return ""

    def num(v: dict[str, object], k: str) -> float:
        x = v.get(k)
        return float(x) if isinstance(x, (int, float)) else 0.0

    levels = [num(v, "level") for v in vs]
    mean = sum(levels) / len(levels)
    rng = f"[{min(levels):g}-{max(levels):g}]" if len(vs) > 1 else ""
    n = sum(num(v, "programs") for v in vs) / len(vs)
    k = sum(num(v, "protected_programs") for v in vs) / len(vs)
    probes = sum(num(v, "probes") for v in vs)
    won = sum(num(v, "probes_won") for v in vs)
    falls = sum(num(v, "fallbacks") for v in vs)
    return f"L{mean:.3g}{rng},n{n:.1f},k{k:.1f},probes{probes:g}/{won:g}won,fallbacks{falls:g}"
