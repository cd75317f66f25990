"""The physical bound on steps/min at a 100% KV hit rate (calibration.md §10).

Per DP replica (then × replicas = nodes × dp_size), with the simulator's own roofline
(``sim.timing``: τ_dec, prefill seconds, load-back) and config, so the bound and the simulator
agree on physics, and the workload profile's statistics sampled from its generator:

- c̄: time-averaged resident context of a program over its life (a step at prompt p with
  output O holds p + O/2 during its LLM time R and p + O during its tool time z; weights use
  the uncongested R_min, so c̄ depends on neither N nor C);
- Ō: output tokens per step; Δ̄: new prompt tokens per step at a 100% hit rate (the first
  step's task, then each observation plus the template tokens, ``des.tokens``); Z: tool time
  per step; S: the prefix every program shares (system prompt), held once per replica.

The three bounds of §10, solved together as one fixed point in the decoding batch B:

    (1) closed loop    X ≤ N / (R + Z)                  N programs per replica
    (2) HBM space-time X ≤ N_res / (R + Z)              N_res = (C − S) / (c̄ − S) resident programs
    (3) GPU work       X ≤ 1 / (Ō·τ(B, B·c̄)/B + t_pf)   t_pf = Δ̄ / Π(c̄) = prefill seconds of Δ̄ at c̄
    R(B) = max(R_min, Ō·τ(B, B·c̄) + B·t_pf),  R_min = Ō·τ(1, c̄) + t_pf,  X = B / R(B)

``R(B)`` is the LLM time of a step in a continuously batched engine: Ō decode iterations of
the batch, each stretched by the prefill of the other requests' steps (the simulator, like
SGLang's mixed chunked prefill, adds prefill chunks to decode iterations). With it Little's law
B = X·R makes (3) hold with equality, so the bound is the largest B whose X = B/R(B) satisfies
(1) and (2) (both increase with B) and B ≤ max_running_requests; (3) is reported at the largest
batch that fits, B₃ = min(N, N_res, max_running). The doc's closed form (KV-bound, τ at a full
pool) is reported too; it ignores the prefill stretch of R and so reads 5–12% higher.

HiCache (§10, "with HiCache"): the anchor stays (2) with Z (acting programs retained in HBM).
The offload ceiling is computed beside it: acting programs demoted to host and reloaded,
t_load = c̄·b_kv / BW_h2d, of which the part the simulator does not overlap with compute
(1 − ``load_back_overlap``; SGLang loads back layer by layer, so 0 by default) is added to each
step's serial GPU time, (2) with t_load in place of Z, the host tier holding every program's
context (write-through), and X·c̄·b_kv ≤ BW_h2d. The ceiling is the better of retention and
offload (``host_point`` is the offload solution alone). ``ideal_steps_per_min`` returns the
bound a run is held to: the ceiling when the cluster has a host tier, else the anchor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from thunder_sgl.benchmark.des.tokens import (
    FIRST_TEMPLATE_TOKENS,
    SHARED_TEMPLATE_TOKENS,
    STEP_TEMPLATE_TOKENS,
)
from thunder_sgl.benchmark.workloads.profile import WorkloadProfile, load_profile, program_at
from thunder_sgl.sim.config import SimConfig, load_sim_config
from thunder_sgl.sim.timing import Roofline, prefill_seconds
from thunder_sgl.sim.timing import decode_step as _decode_step


def decode_step(r: Roofline, batch: float, kv_tokens: float) -> float:
    """τ_dec(B, K) for a mean (fractional) batch: the simulator's formula, continuous in B."""
    return _decode_step(r, batch, kv_tokens)  # type: ignore[arg-type]


STAT_SAMPLES = 2000
"""Programs sampled from the generator for the workload statistics (deterministic: seed 0)."""


@dataclass(frozen=True)
class WorkloadStats:
    """Per-step statistics of a profile, pooled over sampled programs (tokens, seconds)."""

    output: float
    """Ō."""
    new_prompt: float
    """Δ̄: new prompt tokens per step at a 100% hit rate."""
    tool: float
    """Z."""
    shared: float
    """S: tokens every program shares (system prompt and its template)."""
    steps: float
    """Mean steps per program."""
    _held_reasoning: float
    """Σ (p + O/2) over steps / steps: mean context while reasoning."""
    _held_acting_z: float
    """Σ (p + O)·z over steps / steps."""

    def c_bar(self, r: float) -> float:
        """Time-averaged resident context when a step's LLM time is ``r``."""
        return (self._held_reasoning * r + self._held_acting_z) / (r + self.tool)


@lru_cache(maxsize=32)
def workload_stats(profile: WorkloadProfile, samples: int = STAT_SAMPLES, text: float = 1.0,
                   reply: float = 1.0) -> WorkloadStats:
    """Statistics of ``profile`` from programs 0..samples−1 of seed 0 (pure, cached), in the
    tokens of a model whose tokenizer makes ``text`` tokens of a nominal one and whose answers
    come back as ``reply`` tokens per output token (``ModelSpec``; 1 and 1: the nominal sizes,
    the answer's KV reused; else the answer is new prompt, as the DES sends it)."""
    reasoning = acting_z = outputs = new = tools = 0.0
    steps = 0
    system = profile.system_prompt_tokens if text == 1.0 else round(profile.system_prompt_tokens * text)
    shared = system + SHARED_TEMPLATE_TOKENS
    for i in range(samples):
        spec = program_at(profile, 0, i)
        out = np.array([s.output_tokens for s in spec.steps], dtype=np.float64)
        obs = np.array([s.observation_tokens for s in spec.steps], dtype=np.float64) * text
        z = np.array([s.tool_seconds for s in spec.steps], dtype=np.float64)
        answer = out * reply
        growth = answer + obs + STEP_TEMPLATE_TOKENS
        first = system + spec.instance_tokens * text + FIRST_TEMPLATE_TOKENS
        prompt = first + np.concatenate(([0.0], np.cumsum(growth[:-1])))
        reasoning += float(np.sum(prompt + out / 2))
        acting_z += float(np.sum((prompt + out) * z))
        outputs += float(out.sum())
        tools += float(z.sum())
        # first step: everything but the shared prefix; later: observation + template + the
        # previous answer's last token (its KV was never computed), or the whole answer when it
        # comes back as other tokens
        back = answer[:-1] if reply != 1.0 else 1.0
        new += (first - shared) + float(np.sum(obs[:-1] + STEP_TEMPLATE_TOKENS + back))
        steps += len(spec.steps)
    return WorkloadStats(outputs / steps, new / steps, tools / steps, float(shared), steps / samples,
                         reasoning / steps, acting_z / steps)


@dataclass(frozen=True)
class Point:
    """One solution of the fixed point (per replica; X in steps/s)."""

    x: float
    batch: float
    step_seconds: float
    tau: float
    """τ_dec(B, B·c̄) at the solution."""
    closed_loop: float
    """(1) N / (R + Z) at the solution's R."""
    hbm: float
    """(2) N_res / (R + resid) at the solution's R."""
    gpu: float
    """(3) at B₃."""
    limit: str
    """Which constraint binds: closed_loop, hbm, max_running, bandwidth."""


def _solve(r: Roofline, *, n: float, n_res: float, c_bar: float, output: float, tool: float,
           resid: float, serial: float, r_min: float, b_cap: float, x_cap: float = math.inf) -> Point:
    """Largest batch B ≤ b_cap with B + Z·X ≤ n, B + resid·X ≤ n_res and X ≤ x_cap."""

    def step(b: float) -> float:
        return max(r_min, output * decode_step(r, b, b * c_bar) + b * serial)

    def fits(b: float) -> bool:
        x = b / step(b)
        return b + tool * x <= n and b + resid * x <= n_res and x <= x_cap

    lo, hi = 0.0, b_cap
    if fits(hi):
        lo = hi
    else:
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    b = lo
    rr = step(b) if b > 0 else r_min
    x = b / rr if b > 0 else 0.0
    b3 = max(1e-9, min(n, n_res, b_cap))
    gpu = 1.0 / (output * decode_step(r, b3, b3 * c_bar) / b3 + serial)
    checks = {"closed_loop": b + tool * x - n, "hbm": b + resid * x - n_res,
              "bandwidth": (x - x_cap) * rr, "max_running": b - b_cap}
    return Point(x, b, rr, decode_step(r, b, b * c_bar), n / (rr + tool), n_res / (rr + resid), gpu,
                 max(checks, key=lambda k: checks[k]))


@dataclass(frozen=True)
class IdealBound:
    """The bound and its terms (steps/min are for all replicas; other terms per replica)."""

    steps_per_min: float
    """The anchor: retention (acting programs stay in HBM)."""
    replicas: int
    programs_per_replica: float
    capacity: int
    """C: HBM tokens per replica."""
    resident: float
    """N_res = (C − S) / (c̄ − S)."""
    c_bar: float
    output: float
    new_prompt: float
    tool: float
    shared: float
    t_prefill: float
    """Δ̄/Π(c̄): prefill seconds of one step's new tokens at prefix c̄."""
    r_min: float
    point: Point
    closed_form_per_min: float
    """(C/c̄ with sharing) / (Ō·τ_full + Δ̄/Π + Z), the doc's KV-bound closed form."""
    hicache_steps_per_min: float | None = None
    """The HiCache ceiling: the better of retention and offload (None without a host tier)."""
    t_load: float = 0.0
    host_point: Point | None = None

    @property
    def batch(self) -> float:
        return self.point.batch

    @property
    def step_seconds(self) -> float:
        return self.point.step_seconds

    @property
    def tau(self) -> float:
        return self.point.tau

    def bounds_per_min(self) -> dict[str, float]:
        """The three bounds of §10 for all replicas, at the solution."""
        k = 60.0 * self.replicas
        return {"closed_loop": k * self.point.closed_loop, "hbm": k * self.point.hbm, "gpu": k * self.point.gpu}


def ideal_from_inputs(
    cfg: SimConfig,
    *,
    programs: float,
    c_bar: float,
    output: float,
    new_prompt: float,
    tool: float,
    shared: float = 0.0,
    t_prefill: float | None = None,
    capacity: int | None = None,
    host_capacity: int = 0,
    replicas: int = 1,
) -> IdealBound:
    """The bound for explicit per-replica inputs (``programs`` per replica). ``t_prefill``
    defaults to the simulator's prefill seconds of ``new_prompt`` tokens at prefix ``c_bar``."""
    r = Roofline.from_config(cfg)
    cap = capacity if capacity is not None else cfg.server.max_total_num_tokens
    t_pf = prefill_seconds(r, round(new_prompt), round(c_bar)) if t_prefill is None else t_prefill
    r_min = output * decode_step(r, 1, c_bar) + t_pf
    n_res = (cap - shared) / max(1.0, c_bar - shared)
    b_cap = float(cfg.server.max_running_requests)
    point = _solve(r, n=programs, n_res=n_res, c_bar=c_bar, output=output, tool=tool, resid=tool,
                   serial=t_pf, r_min=r_min, b_cap=b_cap)
    tau_full = decode_step(r, max(1.0, n_res), cap)
    closed = n_res / (output * tau_full + t_pf + tool)
    hc, t_load, host_point = None, 0.0, None
    if host_capacity > 0:
        t_load = c_bar * cfg.kv_bytes_per_token / r.h2d_bw
        serial = t_pf + (1.0 - r.load_overlap) * t_load
        n_host = (host_capacity - shared) / max(1.0, c_bar - shared)
        host_point = _solve(r, n=min(programs, n_host), n_res=n_res, c_bar=c_bar, output=output,
                            tool=tool, resid=t_load, serial=serial, r_min=r_min + t_load, b_cap=b_cap,
                            x_cap=r.h2d_bw / (c_bar * cfg.kv_bytes_per_token))
        hc = 60.0 * replicas * max(point.x, host_point.x)  # retaining stays possible with HiCache
    return IdealBound(
        steps_per_min=60.0 * replicas * point.x, replicas=replicas, programs_per_replica=programs,
        capacity=cap, resident=n_res, c_bar=c_bar, output=output, new_prompt=new_prompt, tool=tool,
        shared=shared, t_prefill=t_pf, r_min=r_min, point=point,
        closed_form_per_min=60.0 * replicas * closed, hicache_steps_per_min=hc, t_load=t_load,
        host_point=host_point,
    )


def ideal_bound(
    cluster: str | SimConfig,
    nodes: int,
    profile: str | WorkloadProfile,
    programs: int,
    *,
    hicache: bool | None = None,
) -> IdealBound:
    """The bound for ``programs`` programs of ``profile`` on ``nodes`` workers of ``cluster``.
    ``hicache``: compute the offload ceiling (None: when the cluster has a host tier; True on a
    cluster without one assumes SGLang's default ratio 2)."""
    if nodes < 1 or programs < 0:
        raise ValueError("need nodes >= 1 and programs >= 0")
    cfg = load_sim_config(cluster) if isinstance(cluster, str) else cluster
    prof = load_profile(profile) if isinstance(profile, str) else profile
    st = workload_stats(prof, text=cfg.model.text_tokens_per_nominal, reply=cfg.model.reply_tokens_per_output)
    r = Roofline.from_config(cfg)
    # c̄ is weighted by the uncongested step time, which itself depends on c̄: a few rounds
    r_min = st.output * decode_step(r, 1, 0) + 1e-3
    for _ in range(6):
        c_bar = st.c_bar(r_min)
        r_min = st.output * decode_step(r, 1, c_bar) + prefill_seconds(r, round(st.new_prompt), round(c_bar))
    replicas = nodes * cfg.server.dp_size
    use_host = cfg.hicache.enabled if hicache is None else hicache
    host = 0
    if use_host:
        host = cfg.host_tokens or int(2.0 * cfg.server.max_total_num_tokens)
    return ideal_from_inputs(
        cfg, programs=programs / replicas, c_bar=c_bar, output=st.output, new_prompt=st.new_prompt,
        tool=st.tool, shared=st.shared, host_capacity=host, replicas=replicas,
    )


def ideal_steps_per_min(
    cluster: str | SimConfig,
    nodes: int,
    profile: str | WorkloadProfile,
    programs: int,
    *,
    hicache: bool | None = None,
) -> float:
    """The bound in steps per simulated minute, all replicas, that a run is held to: the anchor
    (HBM retention), or with a host tier the HiCache ceiling (the better of retention and
    offload, never below the anchor)."""
    b = ideal_bound(cluster, nodes, profile, programs, hicache=hicache)
    return b.hicache_steps_per_min if b.hicache_steps_per_min is not None else b.steps_per_min


def with_capacity(cfg: SimConfig, tokens: int) -> SimConfig:
    """``cfg`` with another HBM capacity per replica (for what-if bounds)."""
    return replace(cfg, server=replace(cfg.server, max_total_num_tokens=tokens))
